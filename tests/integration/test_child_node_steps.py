"""Clean and service steps run on child nodes (``execute_on_child_nodes`` and
``limit_child_node_execution``, with 1.83's ``parent_node``), over real REST.

One stack for the module, fake hardware with the ``fake`` bios interface, whose
settings steps record on the node they run on, so each child shows what ran on
it; the reserved power steps change each child's power_state. The parent has no
bios interface at all: a step for the children need not be the parent's.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from services.runtime import ALL_SERVICES_ORDER, RunningStack
from tests.conftest import test_settings
from tests.labapi import VersionedApi, versioned_api

V = (1, 115)
STEP = {"interface": "bios", "step": "apply_configuration", "execute_on_child_nodes": True}


@pytest.fixture(scope="module")
async def stack(database_url: str, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[RunningStack]:
    settings = test_settings(
        database_url,
        Path(tmp_path_factory.mktemp("state")),
        conductor={
            "hostname": "child-conductor",
            "enabled_bios_interfaces": ("no-bios", "fake"),
            "child_node_locked_retry_attempts": 2,
            "child_node_locked_retry_interval": 0.05,
        },
    )
    running = RunningStack()
    await running.start(settings, list(ALL_SERVICES_ORDER))
    try:
        yield running
    finally:
        await running.close()


@pytest.fixture(scope="module")
async def api(stack: RunningStack) -> AsyncIterator[VersionedApi]:
    async with versioned_api(stack, V) as api:
        yield api


@pytest.fixture(scope="module")
async def family(api: VersionedApi) -> dict[str, str]:
    """An active parent (no bios interface) with two children (fake bios, powered on)
    and a node that is nobody's child."""
    uuids = {}
    for name in ("parent", "kid-a", "kid-b", "stranger"):
        fields: dict[str, Any] = {"driver": "fake-hardware", "name": name}
        if name.startswith("kid"):
            fields |= {"bios_interface": "fake", "parent_node": "parent"}
        _, node = await api.call(V, "POST", "/v1/nodes", fields, expect=201)
        uuids[name] = node["uuid"]
        if name != "parent":
            await api.call(V, "PUT", f"/v1/nodes/{name}/states/power", {"target": "power on"}, expect=202)
    await provision(api, "parent", {"target": "manage"}, "manageable")
    return uuids


async def node(api: VersionedApi, ident: str) -> dict[str, Any]:
    return (await api.call(V, "GET", f"/v1/nodes/{ident}", expect=200))[1]


async def settled(api: VersionedApi, ident: str, state: str) -> dict[str, Any]:
    deadline = time.monotonic() + 20
    while True:
        found = await node(api, ident)
        if found["provision_state"] == state and found["reservation"] is None and not found["target_power_state"]:
            return found
        assert time.monotonic() < deadline, f"{ident}: {found['provision_state']} ({found['last_error']})"
        await asyncio.sleep(0.03)


async def provision(api: VersionedApi, ident: str, body: dict[str, Any], state: str) -> dict[str, Any]:
    await api.call(V, "PUT", f"/v1/nodes/{ident}/states/provision", body, expect=202)
    return await settled(api, ident, state)


async def bios(api: VersionedApi, ident: str) -> dict[str, str]:
    _, body = await api.call(V, "GET", f"/v1/nodes/{ident}/bios", expect=200)
    return {s["name"]: s["value"] for s in body["bios"]}


def fault(body: dict[str, Any]) -> str:
    return str(json.loads(body["error_message"])["faultstring"])


async def test_clean_steps_run_on_every_child_or_the_listed_ones(api: VersionedApi, family: dict[str, str]) -> None:
    before = {kid: (await node(api, kid))["provision_state"] for kid in ("kid-a", "kid-b")}
    steps = [{**STEP, "args": {"settings": [{"name": "Mode", "value": "A"}]}}]
    done = await provision(api, "parent", {"target": "clean", "clean_steps": steps}, "manageable")
    assert done["last_error"] is None and done["clean_step"] == {}
    assert await bios(api, "kid-a") == {"Mode": "A"} and await bios(api, "kid-b") == {"Mode": "A"}
    # The reserved power_off on the listed children only; a listed node that is not a child is skipped.
    off = [{"interface": "power", "step": "power_off", "execute_on_child_nodes": True,
            "limit_child_node_execution": [family["kid-b"], family["stranger"]]}]  # fmt: skip
    await provision(api, "parent", {"target": "clean", "clean_steps": off}, "manageable")
    powers = {name: (await node(api, name))["power_state"] for name in ("kid-a", "kid-b", "stranger")}
    assert powers == {"kid-a": "power on", "kid-b": "power off", "stranger": "power on"}
    # The children's provision states are not the parent's business.
    assert {kid: (await node(api, kid))["provision_state"] for kid in ("kid-a", "kid-b")} == before


async def test_service_steps_run_on_children_and_a_child_failure_fails_the_parent(
    api: VersionedApi, family: dict[str, str]
) -> None:
    await provision(api, "parent", {"target": "provide"}, "available")
    await provision(api, "parent", {"target": "active"}, "active")
    steps = [{**STEP, "args": {"settings": [{"name": "Mode", "value": "S"}]},
              "limit_child_node_execution": [family["kid-a"]]}]  # fmt: skip
    done = await provision(api, "parent", {"target": "service", "service_steps": steps}, "active")
    assert done["last_error"] is None and done["service_step"] == {}
    assert await bios(api, "kid-a") == {"Mode": "S"} and await bios(api, "kid-b") == {"Mode": "A"}
    # A step kid-b refuses (its settings must be a list) fails the parent, naming the child and the step.
    bad = [{**STEP, "args": {"settings": "Mode=S"}, "limit_child_node_execution": [family["kid-b"]]}]
    failed = await provision(api, "parent", {"target": "service", "service_steps": bad}, "service failed")
    assert "bios.apply_configuration" in failed["last_error"], failed["last_error"]
    assert f"child node {family['kid-b']}" in failed["last_error"], failed["last_error"]
    assert await bios(api, "kid-b") == {"Mode": "A"}
    await provision(api, "parent", {"target": "abort"}, "active")


async def test_a_locked_child_fails_the_step_after_retries(
    api: VersionedApi, family: dict[str, str], stack: RunningStack
) -> None:
    await settled(api, "parent", "active")
    await stack.pool.execute(
        "UPDATE nodes SET reservation = 'other-conductor', reservation_expires_at = now() + interval '1 hour' "
        "WHERE uuid = $1::uuid",
        family["kid-a"],
    )
    try:
        steps = [{"interface": "power", "step": "power_off", "execute_on_child_nodes": True}]
        failed = await provision(api, "parent", {"target": "service", "service_steps": steps}, "service failed")
    finally:
        await stack.pool.execute("UPDATE nodes SET reservation = NULL WHERE uuid = $1::uuid", family["kid-a"])
    assert f"child node {family['kid-a']}" in failed["last_error"], failed["last_error"]
    assert "locked by host other-conductor" in failed["last_error"], failed["last_error"]
    assert (await node(api, "kid-a"))["power_state"] == "power on"
    await provision(api, "parent", {"target": "abort"}, "active")


BAD = [
    ({**STEP, "limit_child_node_execution": ["kid-a"]}, 400, "must list node UUIDs"),
    ({**STEP, "limit_child_node_execution": ["9a1c7c9e-8d1e-4a4e-9d53-0c0c2b7f7f01"]}, 404, "could not be found"),
    ({**STEP, "execute_on_child_nodes": "yes"}, 400, "execute_on_child_nodes"),
    ({"interface": "deploy", "step": "hold", "execute_on_child_nodes": True}, 400, "hold cannot run on child"),
]


async def test_bad_child_step_requests_change_nothing(api: VersionedApi, family: dict[str, str]) -> None:
    """Clean and service steps are checked alike: UUIDs only, of nodes that exist."""
    active = await settled(api, "parent", "active")
    await api.call(V, "POST", "/v1/nodes", {"driver": "fake-hardware", "name": "lonely"}, expect=201)
    await provision(api, "lonely", {"target": "manage"}, "manageable")
    for step, status, words in BAD:
        for ident, body in (
            ("parent", {"target": "service", "service_steps": [step]}),
            ("lonely", {"target": "clean", "clean_steps": [step]}),
        ):
            got, answer = await api.call(V, "PUT", f"/v1/nodes/{ident}/states/provision", body)
            assert got == status and words in fault(answer), (body, answer)
    assert (await settled(api, "parent", "active"))["updated_at"] == active["updated_at"]
    assert (await settled(api, "lonely", "manageable"))["last_error"] is None


async def test_deploy_steps_do_not_take_the_child_keys(api: VersionedApi, family: dict[str, str]) -> None:
    """As Ironic's deploy step schema: interface, step, args, priority and nothing else."""
    await settled(api, "parent", "active")
    step = {"interface": "deploy", "step": "fake_step", "args": {}, "priority": 0, "execute_on_child_nodes": True}
    got, answer = await api.call(
        V, "PUT", "/v1/nodes/parent/states/provision", {"target": "rebuild", "deploy_steps": [step]}
    )
    assert got == 400 and "Invalid deploy step" in fault(answer), answer


async def power(api: VersionedApi, ident: str, target: str) -> dict[str, Any]:
    await api.call(V, "PUT", f"/v1/nodes/{ident}/states/power", {"target": target}, expect=202)
    deadline = time.monotonic() + 20
    while (found := await node(api, ident))["target_power_state"]:
        assert time.monotonic() < deadline, found
        await asyncio.sleep(0.03)
    assert found["last_error"] is None, found["last_error"]
    return found


async def test_power_couples_parent_and_children_unless_a_child_has_its_own_supply(api: VersionedApi) -> None:
    """As Ironic's node_power_action: a child on needs its parent on, a parent off
    takes its children off first; ``has_dedicated_power_supply`` opts a child out."""
    for name, fields in (
        ("chassis-p", {}),
        ("blade", {"parent_node": "chassis-p"}),
        ("own-psu", {"parent_node": "chassis-p", "driver_info": {"has_dedicated_power_supply": True}}),
    ):
        await api.call(V, "POST", "/v1/nodes", {"driver": "fake-hardware", "name": name, **fields}, expect=201)
    powers = {n: (await node(api, n))["power_state"] for n in ("chassis-p", "blade", "own-psu")}
    assert set(powers.values()) == {None}

    await power(api, "own-psu", "power on")  # its own supply: the parent stays as it is
    assert (await node(api, "chassis-p"))["power_state"] is None
    await power(api, "blade", "power on")  # draws from the parent: the parent comes on first
    assert (await node(api, "chassis-p"))["power_state"] == "power on"

    await power(api, "chassis-p", "rebooting")  # a reboot touches neither
    assert [(await node(api, n))["power_state"] for n in ("blade", "own-psu")] == ["power on", "power on"]
    await power(api, "chassis-p", "power off")  # children off first, but not one with its own supply
    powers = {n: (await node(api, n))["power_state"] for n in ("chassis-p", "blade", "own-psu")}
    assert powers == {"chassis-p": "power off", "blade": "power off", "own-psu": "power on"}
