"""Microversions 1.92 and 1.96 to 1.115 (but 1.114) over real REST, each at its
version and refused (or shaped differently) one below it, as Ironic does.

One stack for the module; nodes are driven by the fake hardware type, and a
node is put straight into a wait state with SQL where only the endpoint's
answer is under test (the flows have their own tests). The health field's
Redfish source is tested against the simulator in test_power_sync.py, and
servicing with ``disable_ramdisk`` in test_service_steps.py.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest

from ferrum.v1 import api_pb2 as pb
from ferrum.v1 import api_pb2_grpc as pb_grpc
from services.api import versions
from tests.labapi import VersionedApi, versioned_api

CEILING = (1, 115)
ERASE = {"interface": "deploy", "step": "erase_devices_metadata", "args": {}, "order": 1}


@pytest.fixture(scope="module")
async def api(stack: Any) -> AsyncIterator[VersionedApi]:
    async with versioned_api(stack, CEILING) as api:
        yield api


def fault(body: dict[str, Any]) -> str:
    return str(json.loads(body["error_message"])["faultstring"])


async def call(
    api: VersionedApi,
    version: tuple[int, int],
    method: str,
    path: str,
    body: Any = None,
    *,
    project: str | None = None,
    expect: int | None = None,
) -> tuple[int, Any, Any]:
    """One request with the version and, when given, ``X-Project-Id``; (status, JSON, headers)."""
    headers = {versions.HEADER: versions.fmt(version)}
    if project is not None:
        headers["X-Project-Id"] = project
    async with api.session.request(method, api.live + path, json=body, headers=headers) as r:
        text = await r.text()
        assert expect is None or r.status == expect, f"{method} {path}: {r.status} {text}"
        return r.status, (json.loads(text) if text else None), r.headers


async def new_node(api: VersionedApi, name: str, **fields: Any) -> dict[str, Any]:
    _, node = await api.call(
        (1, 78), "POST", "/v1/nodes", {"driver": "fake-hardware", "name": name, **fields}, expect=201
    )
    return node


async def settle(api: VersionedApi, ident: str, timeout: float = 30) -> dict[str, Any]:
    """The node once nothing is under way (no target state, no lock)."""
    deadline = time.monotonic() + timeout
    while True:
        _, node = await api.call(CEILING, "GET", f"/v1/nodes/{ident}", expect=200)
        if node["target_provision_state"] is None and node["reservation"] is None:
            return node
        assert time.monotonic() < deadline, f"{ident}: {node['provision_state']} ({node['last_error']})"
        await asyncio.sleep(0.05)


async def manageable_node(api: VersionedApi, name: str, **fields: Any) -> dict[str, Any]:
    await new_node(api, name, **fields)
    await api.call((1, 78), "PUT", f"/v1/nodes/{name}/states/provision", {"target": "manage"}, expect=202)
    node = await settle(api, name)
    assert node["provision_state"] == "manageable", node
    return node


async def set_state(stack: Any, node_uuid: str, state: str, target: str | None) -> None:
    service = next(s for s in stack.services if s.name == "api")
    await service.pool.execute(
        "UPDATE nodes SET provision_state = $2, target_provision_state = $3, provision_updated_at = now() "
        "WHERE uuid = $1::uuid",
        node_uuid,
        state,
        target,
    )


# -- 1.92 and 1.112: runbooks ------------------------------------------------------------------------


async def test_runbook_records_from_1_92_with_traits_and_description_from_1_112(api: VersionedApi) -> None:
    v91, v92, v111, v112 = (1, 91), (1, 92), (1, 111), (1, 112)
    body = {"name": "CUSTOM_RB_ONE", "steps": [ERASE]}
    assert (await api.call(v91, "GET", "/v1/runbooks"))[0] == 404
    assert (await api.call(v91, "POST", "/v1/runbooks", body))[0] == 405
    _, root = await api.call(v91, "GET", "/v1/", expect=200)
    assert "runbooks" not in root

    _, rb = await api.call(v92, "POST", "/v1/runbooks", body, expect=201)
    assert rb["name"] == "CUSTOM_RB_ONE" and rb["steps"] == [ERASE] and rb["public"] is False
    assert rb["owner"] is None and rb["disable_ramdisk"] is False and rb["extra"] == {}
    assert "traits" not in rb and "description" not in rb
    # Below 1.112 a name must be a trait and description does not exist; from 1.112 both.
    status, answer = await api.call(v111, "POST", "/v1/runbooks", {**body, "name": "erase-disks"})
    assert status == 400 and "Invalid trait" in fault(answer), answer
    status, _ = await api.call(v111, "POST", "/v1/runbooks", {**body, "name": "CUSTOM_RB_D", "description": "x"})
    assert status == 406
    _, named = await api.call(
        v112, "POST", "/v1/runbooks", {**body, "name": "erase-disks", "description": "wipe"}, expect=201
    )
    assert named["description"] == "wipe" and named["traits"] == []
    # Bad steps, a duplicate step or name: 400, 400, 409; nothing stored.
    for steps in (
        [{**ERASE, "order": -1}],
        [{k: v for k, v in ERASE.items() if k != "order"}],
        [{**ERASE, "priority": 1}],
        [],
    ):
        status, answer = await api.call(v92, "POST", "/v1/runbooks", {"name": "CUSTOM_RB_BAD", "steps": steps})
        assert status == 400, (steps, answer)
    status, answer = await api.call(v92, "POST", "/v1/runbooks", {"name": "CUSTOM_RB_BAD", "steps": [ERASE, ERASE]})
    assert status == 400 and "Duplicate deploy steps" in fault(answer)
    assert (await api.call(v92, "POST", "/v1/runbooks", body))[0] == 409
    assert (await api.call(v92, "GET", "/v1/runbooks/CUSTOM_RB_BAD"))[0] == 404

    _, listed = await api.call(v92, "GET", "/v1/runbooks", expect=200)
    assert {r["name"] for r in listed["runbooks"]} >= {"CUSTOM_RB_ONE", "erase-disks"}
    assert set(listed["runbooks"][0]) == {"uuid", "name", "links"}
    _, detail = await api.call(v112, "GET", "/v1/runbooks?detail=true", expect=200)
    assert all("traits" in r and "steps" in r for r in detail["runbooks"])
    assert (await api.call(v111, "GET", "/v1/runbooks?fields=traits"))[0] == 406

    # PATCH: extra and steps; removing /extra empties it; another field is a 400.
    patch = [{"op": "add", "path": "/extra/a", "value": 1}, {"op": "replace", "path": "/steps/0/order", "value": 5}]
    _, patched = await api.call(v92, "PATCH", "/v1/runbooks/CUSTOM_RB_ONE", patch, expect=200)
    assert patched["extra"] == {"a": 1} and patched["steps"][0]["order"] == 5
    assert (
        await api.call(v92, "PATCH", f"/v1/runbooks/{rb['uuid']}", [{"op": "replace", "path": "/uuid", "value": "x"}])
    )[0] == 400
    assert (
        await api.call(
            v111, "PATCH", "/v1/runbooks/erase-disks", [{"op": "replace", "path": "/description", "value": "y"}]
        )
    )[0] == 400
    _, patched = await api.call(
        v112, "PATCH", "/v1/runbooks/erase-disks", [{"op": "replace", "path": "/description", "value": "y"}], expect=200
    )
    assert patched["description"] == "y"

    # Traits (1.112): 404 below; put one, replace all, remove one (twice: no error), clear.
    path = f"/v1/runbooks/{rb['uuid']}/traits"
    assert (await api.call(v111, "GET", path))[0] == 404
    await api.call(v112, "PUT", f"{path}/CUSTOM_A", expect=204)
    await api.call(v112, "PUT", path, {"traits": ["CUSTOM_C", "CUSTOM_B"]}, expect=204)
    _, traits = await api.call(v112, "GET", path, expect=200)
    assert traits == {"traits": ["CUSTOM_B", "CUSTOM_C"]}
    assert (await api.call(v112, "PUT", path, {"traits": ["lower"]}))[0] == 400
    assert (await api.call(v112, "PUT", path))[0] == 400
    await api.call(v112, "DELETE", f"{path}/CUSTOM_B", expect=204)
    await api.call(v112, "DELETE", f"{path}/CUSTOM_B", expect=204)
    _, shown = await api.call(v112, "GET", f"/v1/runbooks/{rb['uuid']}", expect=200)
    assert shown["traits"] == ["CUSTOM_C"]
    await api.call(v112, "DELETE", path, expect=204)
    assert (await api.call(v112, "GET", path, expect=200))[1] == {"traits": []}

    assert (await api.call(v91, "DELETE", "/v1/runbooks/erase-disks"))[0] == 405
    await api.call(v92, "DELETE", "/v1/runbooks/erase-disks", expect=204)
    assert (await api.call(v92, "GET", "/v1/runbooks/erase-disks"))[0] == 404


async def test_project_scoped_runbooks_as_ironics_policy(api: VersionedApi) -> None:
    v92 = (1, 92)
    body = {"name": "CUSTOM_RB_P1", "steps": [ERASE]}
    status, answer, _ = await call(api, v92, "POST", "/v1/runbooks", {**body, "owner": "p2"}, project="p1")
    assert status == 400 and "owner other than your own project" in fault(answer)
    status, answer, _ = await call(api, v92, "POST", "/v1/runbooks", {**body, "public": True}, project="p1")
    assert status == 400 and "public runbook" in fault(answer)
    _, own, _ = await call(api, v92, "POST", "/v1/runbooks", body, project="p1", expect=201)
    assert own["owner"] == "p1" and own["public"] is False
    _, shared, _ = await call(
        api, v92, "POST", "/v1/runbooks", {"name": "CUSTOM_RB_PUB", "steps": [ERASE], "public": True}, expect=201
    )
    # p2 sees the public one only, and may neither read nor change p1's.
    _, listed, _ = await call(api, v92, "GET", "/v1/runbooks", project="p2", expect=200)
    names = {r["name"] for r in listed["runbooks"]}
    assert "CUSTOM_RB_PUB" in names and "CUSTOM_RB_P1" not in names
    assert (await call(api, v92, "GET", "/v1/runbooks/CUSTOM_RB_P1", project="p2"))[0] == 403
    assert (await call(api, v92, "DELETE", "/v1/runbooks/CUSTOM_RB_P1", project="p2"))[0] == 403
    assert (await call(api, v92, "GET", "/v1/runbooks/CUSTOM_RB_PUB", project="p2"))[0] == 200
    # An owner for a public runbook is refused; making it private with an owner in one patch is not.
    status, answer, _ = await call(
        api, v92, "PATCH", "/v1/runbooks/CUSTOM_RB_PUB", [{"op": "add", "path": "/owner", "value": "p3"}]
    )
    assert status == 400 and "There cannot be an owner for a public runbook" in fault(answer)
    patch = [{"op": "replace", "path": "/public", "value": False}, {"op": "add", "path": "/owner", "value": "p3"}]
    _, private, _ = await call(api, v92, "PATCH", f"/v1/runbooks/{shared['uuid']}", patch, expect=200)
    assert private["public"] is False and private["owner"] == "p3"
    _, public, _ = await call(
        api,
        v92,
        "PATCH",
        f"/v1/runbooks/{shared['uuid']}",
        [{"op": "replace", "path": "/public", "value": True}],
        expect=200,
    )
    assert public["public"] is True and public["owner"] is None


async def test_clean_with_a_runbook_needs_a_matching_trait_1_92_then_a_shared_trait_1_112(api: VersionedApi) -> None:
    v91, v92, v111, v112 = (1, 91), (1, 92), (1, 111), (1, 112)
    node = await manageable_node(api, "rb-node")
    second = {**ERASE, "step": "erase_devices", "order": 0}  # order 0 runs before order 1
    _, rb = await api.call(
        v92, "POST", "/v1/runbooks", {"name": "CUSTOM_RB_CLEAN", "steps": [ERASE, second]}, expect=201
    )
    states_path = f"/v1/nodes/{node['uuid']}/states/provision"
    clean = {"target": "clean", "runbook": "CUSTOM_RB_CLEAN"}
    assert (await api.call(v91, "PUT", states_path, clean))[0] == 406
    status, answer = await api.call(v92, "PUT", states_path, clean)
    assert status == 400 and "Please ask an administrator to add it to your node traits" in fault(answer), answer
    status, answer = await api.call(v92, "PUT", states_path, {"target": "clean", "runbook": "CUSTOM_NO_SUCH"})
    assert status == 404, answer

    await api.call(v92, "PUT", f"/v1/nodes/{node['uuid']}/traits/CUSTOM_RB_CLEAN", expect=204)
    status, answer = await api.call(v92, "PUT", states_path, {**clean, "clean_steps": [ERASE]})
    assert status == 400 and 'either "clean_steps" or a runbook' in fault(answer)
    status, answer = await api.call(v92, "PUT", states_path, {"target": "provide", "runbook": rb["uuid"]})
    assert status == 400 and '"runbooks" is only valid' in fault(answer)
    _, unchanged = await api.call(v92, "GET", f"/v1/nodes/{node['uuid']}", expect=200)
    assert unchanged["provision_state"] == "manageable"

    await api.call(v111, "PUT", states_path, clean, expect=202)  # the name rule holds up to 1.111
    done = await settle(api, node["uuid"])
    assert done["provision_state"] == "manageable" and done["last_error"] is None, done
    _, history = await api.call(v112, "GET", f"/v1/nodes/{node['uuid']}/history", expect=200)
    events = " | ".join(e["event"] for e in history["history"])
    assert "steps: deploy.erase_devices, deploy.erase_devices_metadata" in events, events

    # 1.112: the name no longer counts; the runbook's traits must meet the node's.
    status, answer = await api.call(v112, "PUT", states_path, clean)
    assert status == 400 and "has no traits configured" in fault(answer)
    await api.call(v112, "PUT", f"/v1/runbooks/{rb['uuid']}/traits", {"traits": ["CUSTOM_RACK_7"]}, expect=204)
    status, answer = await api.call(v112, "PUT", states_path, clean)
    assert status == 400 and "any of the runbook's traits ['CUSTOM_RACK_7']" in fault(answer)
    await api.call(v112, "PUT", f"/v1/nodes/{node['uuid']}/traits/CUSTOM_RACK_7", expect=204)
    # A project may only use its own or a public runbook.
    assert (await call(api, v112, "PUT", states_path, clean, project="p9"))[0] == 403
    await api.call(v112, "PUT", states_path, clean, expect=202)
    assert (await settle(api, node["uuid"]))["provision_state"] == "manageable"


async def test_service_with_a_runbook_and_disable_ramdisk_1_108(api: VersionedApi, stack: Any) -> None:
    """The runbook's steps become the service steps (the fake hardware offers none, so the
    conductor's refusal names them); disable_ramdisk joins service at 1.108."""
    node = await new_node(api, "rb-active")
    await api.call((1, 92), "PUT", f"/v1/nodes/{node['uuid']}/traits/CUSTOM_RB_SVC", expect=204)
    await set_state(stack, node["uuid"], "active", None)
    step = {"interface": "management", "step": "apply_bios_settings", "args": {}, "order": 1}
    await api.call((1, 92), "POST", "/v1/runbooks", {"name": "CUSTOM_RB_SVC", "steps": [step]}, expect=201)
    path = f"/v1/nodes/{node['uuid']}/states/provision"
    status, answer = await api.call((1, 92), "PUT", path, {"target": "service", "runbook": "CUSTOM_RB_SVC"})
    assert (
        status == 400 and "management.apply_bios_settings" in fault(answer) and "Invalid service steps" in fault(answer)
    ), answer
    body = {"target": "service", "service_steps": [step], "disable_ramdisk": True}
    status, answer = await api.call((1, 107), "PUT", path, body)
    assert status == 406, answer
    status, answer = await api.call((1, 108), "PUT", path, body)
    assert status == 400 and "Invalid service steps" in fault(answer), answer  # past the API's checks
    status, answer = await api.call((1, 108), "PUT", path, {"target": "provide", "disable_ramdisk": True})
    assert status == 400


# -- 1.96: inspection rules are served at their version ---------------------------------------------


async def test_inspection_rules_from_1_96(api: VersionedApi) -> None:
    rule = {"actions": [{"op": "set-attribute", "args": {"path": "/extra/x", "value": 1}}]}
    assert (await api.call((1, 95), "GET", "/v1/inspection_rules"))[0] == 404
    assert (await api.call((1, 95), "POST", "/v1/inspection_rules", rule))[0] == 405
    _, created = await api.call((1, 96), "POST", "/v1/inspection_rules", rule, expect=201)
    _, listed = await api.call((1, 96), "GET", "/v1/inspection_rules", expect=200)
    assert created["uuid"] in {r["uuid"] for r in listed["inspection_rules"]}
    _, root = await api.call((1, 96), "GET", "/v1/", expect=200)
    assert "inspection_rules" in root and "runbooks" in root


# -- ports and port groups: 1.97 to 1.106, 1.111 ------------------------------------------------------


async def test_port_fields_from_1_97_to_1_111(api: VersionedApi) -> None:
    node = await new_node(api, "pf-node")
    base = {"address": "52:54:00:97:00:01", "node_uuid": node["uuid"]}
    fields = {
        "description": ((1, 97), "uplink"),
        "vendor": ((1, 100), "acme"),
        "category": ((1, 101), "storage"),
        "available_for_dynamic_portgroup": ((1, 111), False),
    }
    for name, (since, value) in fields.items():
        below = (since[0], since[1] - 1)
        status, _ = await api.call(below, "POST", "/v1/ports", {**base, name: value})
        assert status == 406, name
        status, _ = await api.call(below, "GET", f"/v1/ports?fields={name}")
        assert status == 406, name
    _, port = await api.call(
        CEILING, "POST", "/v1/ports", {**base, **{k: v for k, (_, v) in fields.items()}}, expect=201
    )
    for name, (since, value) in fields.items():
        _, shown = await api.call(since, "GET", f"/v1/ports/{port['uuid']}", expect=200)
        assert shown[name] == value, name
        _, older = await api.call((since[0], since[1] - 1), "GET", f"/v1/ports/{port['uuid']}", expect=200)
        assert name not in older, name
    _, plain = await api.call(
        CEILING, "POST", "/v1/ports", {"address": "52:54:00:97:00:02", "node_uuid": node["uuid"]}, expect=201
    )
    assert plain["available_for_dynamic_portgroup"] is True and plain["vendor"] is None
    for name, value in (
        ("vendor", "x" * 33),
        ("category", "x" * 81),
        ("description", "x" * 256),
        ("available_for_dynamic_portgroup", "no"),
    ):
        status, _ = await api.call(
            CEILING, "PATCH", f"/v1/ports/{plain['uuid']}", [{"op": "add", "path": f"/{name}", "value": value}]
        )
        assert status == 400, name
    _, patched = await api.call(
        (1, 101),
        "PATCH",
        f"/v1/ports/{plain['uuid']}",
        [{"op": "add", "path": "/category", "value": "gpu"}],
        expect=200,
    )
    assert patched["category"] == "gpu"
    assert (
        await api.call(
            (1, 100), "PATCH", f"/v1/ports/{plain['uuid']}", [{"op": "add", "path": "/category", "value": "x"}]
        )
    )[0] == 406


async def test_vtep_local_link_connection_is_refused_again_at_1_105(api: VersionedApi) -> None:
    node = await new_node(api, "vtep-node")
    llc = {"port_id": "p1", "vtep-logical-switch": "ls", "vtep-physical-switch": "ps"}
    status, answer = await api.call(
        (1, 105),
        "POST",
        "/v1/ports",
        {"address": "52:54:00:a5:00:01", "node_uuid": node["uuid"], "local_link_connection": llc},
    )
    assert status == 400 and "OVN VTEP" in fault(answer), answer


async def test_portgroup_fields_1_102_1_103_1_111_and_filters_1_99_1_106(api: VersionedApi, stack: Any) -> None:
    _, na = await api.call(
        CEILING, "POST", "/v1/nodes", {"driver": "fake-hardware", "name": "pg-a", "shard": "sh-a"}, expect=201
    )
    _, nb = await api.call(
        CEILING, "POST", "/v1/nodes", {"driver": "fake-hardware", "name": "pg-b", "shard": "sh-b"}, expect=201
    )
    body = {"node_uuid": na["uuid"], "name": "pg-one", "physical_network": "physnet1", "category": "bond"}
    assert (await api.call((1, 101), "POST", "/v1/portgroups", {**body, "category": None}))[0] == 406
    assert (await api.call((1, 102), "POST", "/v1/portgroups", body))[0] == 406  # category is 1.103
    _, pg = await api.call((1, 103), "POST", "/v1/portgroups", body, expect=201)
    assert pg["physical_network"] == "physnet1" and pg["category"] == "bond" and "dynamic_portgroup" not in pg
    _, pg111 = await api.call((1, 111), "GET", "/v1/portgroups/pg-one", expect=200)
    assert pg111["dynamic_portgroup"] is False
    _, old = await api.call((1, 101), "GET", "/v1/portgroups/pg-one", expect=200)
    assert "physical_network" not in old and "category" not in old
    status, _ = await api.call(
        CEILING, "PATCH", "/v1/portgroups/pg-one", [{"op": "replace", "path": "/dynamic_portgroup", "value": True}]
    )
    assert status == 400
    assert (
        await api.call(
            CEILING, "PATCH", "/v1/portgroups/pg-one", [{"op": "add", "path": "/physical_network", "value": "x" * 65}]
        )
    )[0] == 400
    await api.call(CEILING, "POST", "/v1/portgroups", {"node_uuid": nb["uuid"], "name": "pg-two"}, expect=201)
    _, member = await api.call(
        CEILING,
        "POST",
        "/v1/ports",
        {"address": "52:54:00:99:00:01", "node_uuid": na["uuid"], "portgroup_uuid": pg["uuid"]},
        expect=201,
    )
    # 1.102: a group's network is its members'; a member's own cannot change (it could below 1.102).
    new_net = [{"op": "replace", "path": "/physical_network", "value": "physnet2"}]
    await api.call((1, 102), "PATCH", "/v1/portgroups/pg-one", new_net, expect=200)
    _, member = await api.call((1, 102), "GET", f"/v1/ports/{member['uuid']}", expect=200)
    assert member["physical_network"] == "physnet2"
    status, answer = await api.call(
        (1, 102), "PATCH", f"/v1/ports/{member['uuid']}", [{**new_net[0], "value": "physnet3"}]
    )
    assert status == 400 and "while the port belongs to a portgroup" in fault(answer), answer
    _, member = await api.call(
        (1, 101), "PATCH", f"/v1/ports/{member['uuid']}", [{**new_net[0], "value": "physnet3"}], expect=200
    )
    assert member["physical_network"] == "physnet3"  # the only member, so no other network to clash with
    await api.call(CEILING, "POST", "/v1/ports", {"address": "52:54:00:99:00:02", "node_uuid": nb["uuid"]}, expect=201)

    # 1.106: port groups by their nodes' shard.
    assert (await api.call((1, 105), "GET", "/v1/portgroups?shard=sh-a"))[0] == 406
    _, groups = await api.call((1, 106), "GET", "/v1/portgroups?shard=sh-a", expect=200)
    assert [g["name"] for g in groups["portgroups"]] == ["pg-one"]
    _, groups = await api.call((1, 106), "GET", "/v1/portgroups/detail?shard=sh-a,sh-b", expect=200)
    assert {g["name"] for g in groups["portgroups"]} == {"pg-one", "pg-two"}
    assert (await api.call((1, 106), "GET", f"/v1/portgroups?shard=sh-a&node={na['uuid']}"))[0] == 400

    # 1.99: ports and port groups by their nodes' conductor group, any case. The group is set
    # in the database: no conductor of this stack serves another group, so the API would refuse it.
    service = next(s for s in stack.services if s.name == "api")
    await service.pool.execute("UPDATE nodes SET conductor_group = 'Rack-99' WHERE uuid = $1::uuid", na["uuid"])
    assert (await api.call((1, 98), "GET", "/v1/ports?conductor_groups=rack-99"))[0] == 406
    assert (await api.call((1, 98), "GET", "/v1/portgroups?conductor_groups=rack-99"))[0] == 406
    _, ports = await api.call((1, 99), "GET", "/v1/ports?conductor_groups=rack-99,elsewhere", expect=200)
    assert [p["address"] for p in ports["ports"]] == ["52:54:00:99:00:01"]
    _, groups = await api.call((1, 99), "GET", "/v1/portgroups?conductor_groups=RACK-99", expect=200)
    assert [g["name"] for g in groups["portgroups"]] == ["pg-one"]
    assert (await api.call((1, 99), "GET", f"/v1/ports?conductor_groups=rack-99&node={na['uuid']}"))[0] == 400


# -- 1.98: keys with ~ or / in a patch path -------------------------------------------------------------


async def test_patch_paths_with_rfc6901_escapes_from_1_98(api: VersionedApi) -> None:
    node = await new_node(api, "esc-node", extra={"a/b": 0, "c~d": 0})
    patch = [{"op": "replace", "path": "/extra/a~1b", "value": 1}, {"op": "replace", "path": "/extra/c~0d", "value": 2}]
    status, answer = await api.call((1, 97), "PATCH", "/v1/nodes/esc-node", patch)
    assert status == 400 and "1.98" in fault(answer), answer
    _, patched = await api.call((1, 98), "PATCH", "/v1/nodes/esc-node", patch, expect=200)
    assert patched["extra"] == {"a/b": 1, "c~d": 2}
    status, answer = await api.call(
        (1, 98), "PATCH", "/v1/nodes/esc-node", [{"op": "add", "path": "/extra/x~2", "value": 1}]
    )
    assert status == 400 and "RFC 6901" in fault(answer)
    _, port = await api.call(
        (1, 98), "POST", "/v1/ports", {"address": "52:54:00:98:00:01", "node_uuid": node["uuid"]}, expect=201
    )
    _, port = await api.call(
        (1, 98), "PATCH", f"/v1/ports/{port['uuid']}", [{"op": "add", "path": "/extra/k~1v", "value": "x"}], expect=200
    )
    assert port["extra"] == {"k/v": "x"}


# -- 1.104: instance_name ----------------------------------------------------------------------------------


async def test_instance_name_from_1_104_follows_display_name(api: VersionedApi) -> None:
    v103, v104 = (1, 103), (1, 104)
    await new_node(api, "in-node")
    await new_node(api, "in-other")
    assert (
        await api.call(v103, "PATCH", "/v1/nodes/in-node", [{"op": "add", "path": "/instance_name", "value": "vm"}])
    )[0] == 406
    assert (await api.call(v103, "GET", "/v1/nodes?instance_name=vm"))[0] == 406
    _, node = await api.call(v103, "GET", "/v1/nodes/in-node", expect=200)
    assert "instance_name" not in node
    # Nova writes instance_info.display_name: it becomes instance_name, whatever the version.
    info = [{"op": "add", "path": "/instance_info", "value": {"display_name": "web-1"}}]
    await api.call(v103, "PATCH", "/v1/nodes/in-node", info, expect=200)
    _, node = await api.call(v104, "GET", "/v1/nodes/in-node", expect=200)
    assert node["instance_name"] == "web-1"
    _, node = await api.call(
        v104,
        "PATCH",
        "/v1/nodes/in-node",
        [{"op": "replace", "path": "/instance_name", "value": "explicit"}],
        expect=200,
    )
    info = [{"op": "replace", "path": "/instance_info", "value": {"display_name": "web-2"}}]
    _, node = await api.call(v104, "PATCH", "/v1/nodes/in-node", info, expect=200)
    assert node["instance_name"] == "explicit"  # a name that is set is never overwritten
    _, found = await api.call(v104, "GET", "/v1/nodes?instance_name=explicit&fields=name,instance_name", expect=200)
    assert [n["name"] for n in found["nodes"]] == ["in-node"]
    assert (
        await api.call(v104, "PATCH", "/v1/nodes/in-node", [{"op": "replace", "path": "/instance_name", "value": ""}])
    )[0] == 400
    _, node = await api.call(
        v104, "PATCH", "/v1/nodes/in-node", [{"op": "remove", "path": "/instance_name"}], expect=200
    )
    assert node["instance_name"] is None


async def test_undeploy_clears_instance_name_1_104(api: VersionedApi, stack: Any) -> None:
    node = await new_node(api, "in-deployed")
    info = [{"op": "add", "path": "/instance_info", "value": {"display_name": "db-1"}}]
    await api.call((1, 104), "PATCH", "/v1/nodes/in-deployed", info, expect=200)
    await set_state(stack, node["uuid"], "active", None)
    await api.call((1, 104), "PUT", f"/v1/nodes/{node['uuid']}/states/provision", {"target": "deleted"}, expect=202)
    done = await settle(api, node["uuid"])
    assert done["provision_state"] == "available" and done["instance_name"] is None and done["instance_info"] == {}


# -- 1.107: X-OpenStack-Request-Id ---------------------------------------------------------------------------


async def test_both_request_id_headers_on_every_response_1_107(api: VersionedApi) -> None:
    for version, path in (((1, 107), "/v1/nodes"), ((1, 106), "/v1/nodes"), ((1, 107), "/v1/nodes/no-such-node")):
        status, _, headers = await call(api, version, "GET", path)
        assert headers["x-openstack-request-id"].startswith("req-"), (version, path, status)
        assert headers["x-openstack-request-id"] == headers["openstack-request-id"]
    status, _, headers = await call(api, (1, 116), "GET", "/v1/nodes")
    assert status == 406 and headers["x-openstack-request-id"] == headers["openstack-request-id"]


# -- 1.109: health ----------------------------------------------------------------------------------------


async def test_health_field_from_1_109_is_null_for_fake_hardware(api: VersionedApi) -> None:
    await new_node(api, "health-node")
    _, node = await api.call((1, 108), "GET", "/v1/nodes/health-node", expect=200)
    assert "health" not in node
    assert (await api.call((1, 108), "GET", "/v1/nodes?fields=health"))[0] == 406
    _, node = await api.call((1, 109), "GET", "/v1/nodes/health-node?fields=health", expect=200)
    assert node["health"] is None
    status, answer = await api.call(
        (1, 109), "PATCH", "/v1/nodes/health-node", [{"op": "add", "path": "/health", "value": "OK"}]
    )
    assert status == 400 and "internal attribute" in fault(answer)


# -- 1.110: abort in wait call-back ---------------------------------------------------------------------


async def test_abort_in_wait_call_back_fails_the_deploy_without_cleaning_1_110(api: VersionedApi, stack: Any) -> None:
    node = await new_node(api, "abort-node")
    await set_state(stack, node["uuid"], "wait call-back", "active")
    path = f"/v1/nodes/{node['uuid']}/states/provision"
    assert (await api.call((1, 109), "PUT", path, {"target": "abort"}))[0] == 406
    await api.call((1, 110), "PUT", path, {"target": "abort"}, expect=202)
    deadline = time.monotonic() + 20
    while True:
        _, done = await api.call(CEILING, "GET", f"/v1/nodes/{node['uuid']}", expect=200)
        if done["last_error"] and done["reservation"] is None:
            break
        assert time.monotonic() < deadline, done
        await asyncio.sleep(0.05)
    assert done["provision_state"] == "deploy failed" and done["target_provision_state"] == "active", done
    assert done["last_error"].startswith("By request, the deploy operation was aborted")
    assert done["power_state"] == "power off"
    await asyncio.sleep(0.2)  # nothing follows: no cleaning starts
    _, still = await api.call(CEILING, "GET", f"/v1/nodes/{node['uuid']}", expect=200)
    assert still["provision_state"] == "deploy failed"


# -- 1.113 and 1.115: node history fields --------------------------------------------------------------


async def test_history_project_1_113_and_states_and_duration_1_115(api: VersionedApi) -> None:
    node = await new_node(api, "hist-node")
    await call(
        api,
        CEILING,
        "PUT",
        f"/v1/nodes/{node['uuid']}/states/provision",
        {"target": "manage"},
        project="proj-7",
        expect=202,
    )
    await settle(api, node["uuid"])
    path = f"/v1/nodes/{node['uuid']}/history?detail=true"
    _, old = await api.call((1, 112), "GET", path, expect=200)
    assert all("project" not in e and "state" not in e for e in old["history"])
    _, mid = await api.call((1, 114), "GET", path, expect=200)
    assert all("project" in e and "duration_seconds" not in e for e in mid["history"])
    _, new = await api.call((1, 115), "GET", path, expect=200)
    created, *changes = new["history"]
    assert created["project"] is None and created["state"] == "enroll"  # made without a project header
    managed = [e for e in changes if e["project"] == "proj-7"]
    assert managed, changes
    assert {e["state"] for e in managed} <= {"verifying", "manageable"} and "manageable" in {
        e["state"] for e in managed
    }
    assert all(isinstance(e["duration_seconds"], int) and 0 <= e["duration_seconds"] < 60 for e in managed)
    assert {"target_provision_state"} <= set(managed[0])
    _, plain = await api.call((1, 115), "GET", f"/v1/nodes/{node['uuid']}/history", expect=200)
    assert set(plain["history"][0]) == {"uuid", "created_at", "severity", "event", "links"}
    _, one = await api.call((1, 115), "GET", f"/v1/nodes/{node['uuid']}/history/{managed[-1]['uuid']}", expect=200)
    assert one["project"] == "proj-7" and "duration_seconds" in one


async def test_grpc_set_provision_state_resolves_a_runbook_as_rest(api: VersionedApi, stack: Any) -> None:
    """gRPC speaks the newest semantics: the 1.112 trait rule, the same refusals, the same steps."""
    node = await manageable_node(api, "rb-grpc")
    _, rb = await api.call(CEILING, "POST", "/v1/runbooks", {"name": "grpc-erase", "steps": [ERASE]}, expect=201)
    await api.call(CEILING, "PUT", f"/v1/runbooks/{rb['uuid']}/traits/CUSTOM_GRPC", expect=204)
    channel = grpc.aio.insecure_channel(stack.endpoints["api gRPC"])
    try:
        nodes = pb_grpc.NodeServiceStub(channel)
        request = pb.SetProvisionStateRequest(ident="rb-grpc", target="clean", runbook="grpc-erase")
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await nodes.SetProvisionState(request)
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "any of the runbook's traits ['CUSTOM_GRPC']" in (caught.value.details() or "")
        await api.call(CEILING, "PUT", f"/v1/nodes/{node['uuid']}/traits/CUSTOM_GRPC", expect=204)
        await nodes.SetProvisionState(request)
    finally:
        await channel.close()
    done = await settle(api, node["uuid"])
    assert done["provision_state"] == "manageable" and done["last_error"] is None, done
    _, history = await api.call(CEILING, "GET", f"/v1/nodes/{node['uuid']}/history", expect=200)
    assert any("steps: deploy.erase_devices_metadata" in e["event"] for e in history["history"])
