"""Microversions 1.85 to 1.95, and 1.114, over real REST: each at its
version and, where behaviour differs, one below it (as Ironic refuses it).

Requests at a version the live api advertises go to it; requests above go to
a lab server made of the same handlers (tests/labapi.py), so these tests
hold whatever the advertised maximum is. One stack for the module; fake
hardware except where the Redfish simulator is the point (firmware, vmedia).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from tests.labapi import VersionedApi, versioned_api

CEILING = (1, 114)
OLD = (1, 78)


@pytest.fixture(scope="module")
async def api(stack: Any) -> AsyncIterator[VersionedApi]:
    async with versioned_api(stack, CEILING) as api:
        yield api


def fault(body: dict[str, Any]) -> str:
    return str(json.loads(body["error_message"])["faultstring"])


async def new_node(api: VersionedApi, name: str, **fields: Any) -> dict[str, Any]:
    _, node = await api.call(OLD, "POST", "/v1/nodes", {"driver": "fake-hardware", "name": name, **fields}, expect=201)
    return node


async def wait_state(api: VersionedApi, ident: str, state: str, timeout: float = 30) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        _, node = await api.call((1, 87), "GET", f"/v1/nodes/{ident}", expect=200)
        if node["provision_state"] == state and node["reservation"] is None:
            return node
        assert time.monotonic() < deadline, f"{ident}: {node['provision_state']} ({node['last_error']})"
        await asyncio.sleep(0.03)


async def provision(api: VersionedApi, ident: str, body: dict[str, Any], state: str, version=OLD) -> dict[str, Any]:
    await api.call(version, "PUT", f"/v1/nodes/{ident}/states/provision", body, expect=202)
    return await wait_state(api, ident, state)


async def manageable_node(api: VersionedApi, name: str, **fields: Any) -> dict[str, Any]:
    await new_node(api, name, **fields)
    return await provision(api, name, {"target": "manage"}, "manageable")


async def active_node(api: VersionedApi, name: str, **fields: Any) -> dict[str, Any]:
    await manageable_node(api, name, **fields)
    await provision(api, name, {"target": "provide"}, "available")
    return await provision(api, name, {"target": "active"}, "active")


# -- 1.85: hold steps and unhold ---------------------------------------------------------------------


async def test_clean_hold_and_unhold_from_1_85(api: VersionedApi) -> None:
    v84, v85 = (1, 84), (1, 85)
    await manageable_node(api, "h-clean")
    await api.call(OLD, "PUT", "/v1/nodes/h-clean/states/power", {"target": "power on"}, expect=202)
    steps = [
        {"interface": "deploy", "step": "erase_devices_metadata"},
        {"interface": "deploy", "step": "hold"},
        {"interface": "power", "step": "power_off"},
    ]
    held = await provision(api, "h-clean", {"target": "clean", "clean_steps": steps}, "clean hold")
    assert held["target_provision_state"] == "manageable"
    assert held["clean_step"]["step"] == "hold" and held["power_state"] == "power on"
    # unhold is checked against the state first: 406 where it applies, 400 where it does not.
    status, body = await api.call(v84, "PUT", "/v1/nodes/h-clean/states/provision", {"target": "unhold"})
    assert status == 406, body
    other = await manageable_node(api, "h-other")
    status, body = await api.call(v85, "PUT", f"/v1/nodes/{other['uuid']}/states/provision", {"target": "unhold"})
    assert status == 400 and "can not be performed" in fault(body), body
    # The steps after the hold run once released: the node powers off and cleaning ends.
    done = await provision(api, "h-clean", {"target": "unhold"}, "manageable", version=v85)
    assert done["power_state"] == "power off" and done["clean_step"] == {} and done["last_error"] is None
    # A reserved step takes no arguments; wait is not run by Ferrum.
    for bad in ({"interface": "deploy", "step": "hold", "args": {"x": 1}}, {"interface": "deploy", "step": "wait"}):
        status, body = await api.call(
            v85, "PUT", "/v1/nodes/h-other/states/provision", {"target": "clean", "clean_steps": [bad]}
        )
        assert status == 400, body
    _, still = await api.call(v85, "GET", "/v1/nodes/h-other", expect=200)
    assert still["provision_state"] == "manageable"


async def test_deploy_and_service_hold_from_1_85(api: VersionedApi) -> None:
    v85, v87 = (1, 85), (1, 87)
    await manageable_node(api, "h-deploy")
    await provision(api, "h-deploy", {"target": "provide"}, "available")
    hold = {"interface": "deploy", "step": "hold", "priority": 150, "args": {}}
    late = {**hold, "priority": 50}
    status, body = await api.call(
        v85, "PUT", "/v1/nodes/h-deploy/states/provision", {"target": "active", "deploy_steps": [late]}
    )
    assert status == 400 and "before deploy.deploy" in fault(body), body
    held = await provision(api, "h-deploy", {"target": "active", "deploy_steps": [hold]}, "deploy hold")
    assert held["target_provision_state"] == "active" and held["deploy_step"]["step"] == "hold"
    active = await provision(api, "h-deploy", {"target": "unhold"}, "active", version=v85)
    assert active["deploy_step"] == {}

    # Servicing (1.87) holds in service hold; abort there returns the node to active.
    steps = [{"interface": "deploy", "step": "hold"}, {"interface": "power", "step": "power_off"}]
    body = {"target": "service", "service_steps": steps}
    held = await provision(api, "h-deploy", body, "service hold", version=v87)
    assert held["service_step"]["step"] == "hold"
    released = await provision(api, "h-deploy", {"target": "unhold"}, "active", version=v87)
    assert released["power_state"] == "power off" and released["service_step"] == {}
    await provision(api, "h-deploy", body, "service hold", version=v87)
    aborted = await provision(api, "h-deploy", {"target": "abort"}, "active", version=v87)
    assert "aborted" in aborted["last_error"]
