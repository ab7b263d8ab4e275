"""Where Ferrum answered differently from Ironic 39 at 1.78 and below (issue 22,
items 1 and 2), over real REST against a live in-process stack: each answer
is checked for its status code and Ironic's error body, and each refused
request for having changed nothing."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from typing import Any

import aiohttp
import pytest

LATEST = "1.78"


class Client:
    def __init__(self, session: aiohttp.ClientSession, base: str) -> None:
        self.session, self.base = session, base

    async def call(
        self, method: str, path: str, body: Any = None, *, version: str = LATEST, expect: int | None = None
    ) -> tuple[int, Any]:
        headers = {"X-OpenStack-Ironic-API-Version": version}
        async with self.session.request(method, self.base + path, json=body, headers=headers) as r:
            text = await r.text()
            if expect is not None:
                assert r.status == expect, f"{method} {path} at {version}: {r.status} {text}"
            return r.status, (json.loads(text) if text else None)

    async def refused(self, status: int, method: str, path: str, body: Any = None, *, version: str = LATEST) -> str:
        """The request gets ``status`` with Ironic's error body; returns the faultstring."""
        got, reply = await self.call(method, path, body, version=version)
        assert got == status, (method, path, got, reply)
        inner = json.loads(reply["error_message"])
        assert set(inner) == {"faultcode", "faultstring", "debuginfo"}, inner
        assert inner["faultcode"] == ("Client" if status < 500 else "Server")
        return str(inner["faultstring"])

    async def node(self, ident: str) -> dict[str, Any]:
        return (await self.call("GET", f"/v1/nodes/{ident}", expect=200))[1]

    async def wait_state(self, ident: str, state: str, timeout: float = 30) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            node = await self.node(ident)
            if node["provision_state"] == state and node["reservation"] is None:
                return node
            assert time.monotonic() < deadline, f"{ident}: {node['provision_state']} ({node['last_error']})"
            await asyncio.sleep(0.05)

    async def new_node(self, name: str, state: str = "enroll", **extra: Any) -> dict[str, Any]:
        _, node = await self.call("POST", "/v1/nodes", {"driver": "fake-hardware", "name": name, **extra}, expect=201)
        for verb, reached in (("manage", "manageable"), ("provide", "available"), ("active", "active")):
            if node["provision_state"] == state:
                break
            await self.call("PUT", f"/v1/nodes/{name}/states/provision", {"target": verb}, expect=202)
            node = await self.wait_state(name, reached)
        return node

    async def patch(self, ident: str, *ops: tuple[str, str, Any]) -> tuple[int, Any]:
        body = [{"op": op, "path": path, **({} if op == "remove" else {"value": value})} for op, path, value in ops]
        return await self.call("PATCH", f"/v1/nodes/{ident}", body)


@pytest.fixture(scope="module")
async def api(stack):
    async with aiohttp.ClientSession() as session:
        yield Client(session, stack.endpoints["api REST (Ironic v1)"])


# -- chassis ------------------------------------------------------------------------------------


async def test_chassis_create_show_list_patch_delete(api: Client) -> None:
    _, made = await api.call("POST", "/v1/chassis", {"description": "rack 1", "extra": {"row": "a"}}, expect=201)
    ident = made["uuid"]
    assert made["description"] == "rack 1" and made["extra"] == {"row": "a"}
    assert made["links"][0]["href"].endswith(f"/v1/chassis/{ident}")
    assert made["nodes"][0]["href"].endswith(f"/v1/chassis/{ident}/nodes")
    _, shown = await api.call("GET", f"/v1/chassis/{ident}", version="1.1", expect=200)
    assert shown["uuid"] == ident and shown["created_at"] == made["created_at"]
    _, picked = await api.call("GET", f"/v1/chassis/{ident}?fields=uuid,extra", expect=200)
    assert set(picked) == {"uuid", "extra", "links"}
    _, listed = await api.call("GET", "/v1/chassis", expect=200)
    assert [set(c) for c in listed["chassis"]] == [{"uuid", "description", "links"}]
    _, detailed = await api.call("GET", "/v1/chassis/detail", expect=200)
    assert detailed["chassis"][0]["extra"] == {"row": "a"}

    _, patched = await api.call(
        "PATCH",
        f"/v1/chassis/{ident}",
        [{"op": "replace", "path": "/description", "value": "rack 2"}, {"op": "remove", "path": "/extra"}],
        expect=200,
    )
    assert patched["description"] == "rack 2" and patched["extra"] == {} and patched["updated_at"]

    assert "not valid" in await api.refused(400, "GET", f"/v1/chassis/{ident}?fields=bogus")
    long = [{"op": "replace", "path": "/description", "value": "x" * 256}]
    await api.refused(400, "PATCH", f"/v1/chassis/{ident}", long)
    await api.refused(400, "PATCH", f"/v1/chassis/{ident}", [{"op": "add", "path": "/nodes", "value": []}])
    await api.refused(400, "POST", "/v1/chassis", {"description": "x", "color": "red"})
    await api.refused(409, "POST", "/v1/chassis", {"uuid": ident})
    assert (await api.call("GET", f"/v1/chassis/{ident}", expect=200))[1]["description"] == "rack 2"

    missing = str(uuid.uuid4())
    assert f"Chassis {missing} could not be found" in await api.refused(404, "GET", f"/v1/chassis/{missing}")
    await api.refused(404, "DELETE", f"/v1/chassis/{missing}")
    await api.refused(400, "GET", "/v1/chassis/not-a-uuid")
    await api.call("DELETE", f"/v1/chassis/{ident}", expect=204)
    await api.refused(404, "GET", f"/v1/chassis/{ident}")


async def test_nodes_of_a_chassis(api: Client) -> None:
    _, chassis = await api.call("POST", "/v1/chassis", {"description": "with nodes"}, expect=201)
    _, other = await api.call("POST", "/v1/chassis", {}, expect=201)
    inside = await api.new_node("in-chassis", chassis_uuid=chassis["uuid"])
    assert inside["chassis_uuid"] == chassis["uuid"]
    await api.new_node("outside-chassis")
    _, listed = await api.call("GET", f"/v1/chassis/{chassis['uuid']}/nodes", expect=200)
    assert [n["name"] for n in listed["nodes"]] == ["in-chassis"]
    _, detailed = await api.call("GET", f"/v1/chassis/{chassis['uuid']}/nodes/detail", expect=200)
    assert detailed["nodes"][0]["chassis_uuid"] == chassis["uuid"] and "driver_info" in detailed["nodes"][0]
    _, filtered = await api.call("GET", f"/v1/nodes?chassis_uuid={chassis['uuid']}", expect=200)
    assert [n["name"] for n in filtered["nodes"]] == ["in-chassis"]
    await api.refused(404, "GET", f"/v1/chassis/{uuid.uuid4()}/nodes")
    await api.refused(404, "GET", f"/v1/nodes?chassis_uuid={uuid.uuid4()}")

    # A chassis with nodes cannot go (Ironic's ChassisNotEmpty, a 400), and stays.
    assert "contains nodes" in await api.refused(400, "DELETE", f"/v1/chassis/{chassis['uuid']}")
    await api.call("GET", f"/v1/chassis/{chassis['uuid']}", expect=200)

    # A node naming a chassis that does not exist: 400, and no node.
    missing = str(uuid.uuid4())
    body = {"driver": "fake-hardware", "name": "no-chassis", "chassis_uuid": missing}
    assert f"Chassis {missing} could not be found" in await api.refused(400, "POST", "/v1/nodes", body)
    await api.refused(404, "GET", "/v1/nodes/no-chassis")
    await api.refused(400, "POST", "/v1/nodes", {**body, "chassis_uuid": "rack-1"})

    # Moving a node: to another chassis, to none (1.25), never to a missing one.
    status, _ = await api.patch("in-chassis", ("replace", "/chassis_uuid", missing))
    assert status == 400 and (await api.node("in-chassis"))["chassis_uuid"] == chassis["uuid"]
    status, moved = await api.patch("in-chassis", ("replace", "/chassis_uuid", other["uuid"]))
    assert status == 200 and moved["chassis_uuid"] == other["uuid"]
    await api.refused(406, "PATCH", "/v1/nodes/in-chassis", [{"op": "remove", "path": "/chassis_uuid"}], version="1.24")
    assert (await api.node("in-chassis"))["chassis_uuid"] == other["uuid"]
    status, freed = await api.patch("in-chassis", ("remove", "/chassis_uuid", None))
    assert status == 200 and freed["chassis_uuid"] is None
    await api.call("DELETE", f"/v1/chassis/{chassis['uuid']}", expect=204)


# -- allocations --------------------------------------------------------------------------------


async def settled(api: Client, alloc: dict[str, Any]) -> dict[str, Any]:
    deadline = time.monotonic() + 30
    while alloc["state"] == "allocating":
        assert time.monotonic() < deadline, alloc
        await asyncio.sleep(0.02)
        _, alloc = await api.call("GET", f"/v1/allocations/{alloc['uuid']}", expect=200)
    return alloc


async def test_allocation_answers_allocating_and_finishes_in_the_background(api: Client) -> None:
    node = await api.new_node("alloc-bg", "available", resource_class="bg-rc")
    _, alloc = await api.call("POST", "/v1/allocations", {"resource_class": "bg-rc"}, expect=201)
    assert alloc["state"] == "allocating" and alloc["node_uuid"] is None and alloc["last_error"] is None
    done = await settled(api, alloc)
    assert done["state"] == "active" and done["node_uuid"] == node["uuid"]
    assert (await api.node("alloc-bg"))["instance_uuid"] == alloc["uuid"]
    _, none = await api.call("POST", "/v1/allocations", {"resource_class": "bg-rc"}, expect=201)
    failed = await settled(api, none)
    assert failed["state"] == "error" and "No available nodes match" in failed["last_error"]


async def test_allocation_retries_a_briefly_locked_candidate(api: Client, database_url: str) -> None:
    """A candidate locked at the moment of the pick (a power change, say) is tried again."""
    import asyncpg

    node = await api.new_node("alloc-locked", "available", resource_class="locked-rc")
    conn = await asyncpg.connect(database_url)
    try:
        await conn.execute(
            "UPDATE nodes SET reservation = 'someone-else', reservation_expires_at = now() + interval '1 minute' "
            "WHERE uuid = $1::uuid",
            node["uuid"],
        )
        _, alloc = await api.call("POST", "/v1/allocations", {"resource_class": "locked-rc"}, expect=201)
        await asyncio.sleep(0.3)  # the lock is held across at least one pick attempt
        _, meanwhile = await api.call("GET", f"/v1/allocations/{alloc['uuid']}", expect=200)
        assert meanwhile["state"] == "allocating", meanwhile
        await conn.execute(
            "UPDATE nodes SET reservation = NULL, reservation_expires_at = NULL WHERE uuid = $1::uuid", node["uuid"]
        )
    finally:
        await conn.close()
    done = await settled(api, alloc)
    assert done["state"] == "active" and done["node_uuid"] == node["uuid"], done


async def test_allocation_deleted_while_allocating_gives_its_node_back(api: Client, database_url: str) -> None:
    import asyncpg

    node = await api.new_node("alloc-gone", "available", resource_class="gone-rc")
    conn = await asyncpg.connect(database_url)
    try:
        await conn.execute(
            "UPDATE nodes SET reservation = 'someone-else', reservation_expires_at = now() + interval '1 minute' "
            "WHERE uuid = $1::uuid",
            node["uuid"],
        )
        _, alloc = await api.call("POST", "/v1/allocations", {"resource_class": "gone-rc"}, expect=201)
        await api.call("DELETE", f"/v1/allocations/{alloc['uuid']}", expect=204)
        before = (await api.node("alloc-gone"))["updated_at"]
        await conn.execute(
            "UPDATE nodes SET reservation = NULL, reservation_expires_at = NULL WHERE uuid = $1::uuid", node["uuid"]
        )
    finally:
        await conn.close()
    await api.refused(404, "GET", f"/v1/allocations/{alloc['uuid']}")
    # The pick, retrying the lock, claims the node (instance_uuid set, updated_at moves), finds its
    # allocation gone and gives the node back (instance_uuid None again).
    deadline = time.monotonic() + 10
    while True:
        seen = await api.node("alloc-gone")
        if seen["updated_at"] != before and seen["instance_uuid"] is None:
            break
        assert time.monotonic() < deadline, seen
        await asyncio.sleep(0.05)
    assert (await api.node("alloc-gone"))["allocation_uuid"] is None


# -- drivers, VIFs, node flags ------------------------------------------------------------------


async def test_driver_list_detail(api: Client) -> None:
    _, plain = await api.call("GET", "/v1/drivers", expect=200)
    assert all("enabled_deploy_interfaces" not in d for d in plain["drivers"])
    _, detailed = await api.call("GET", "/v1/drivers?detail=True", expect=200)
    fake = next(d for d in detailed["drivers"] if d["name"] == "fake-hardware")
    assert fake["default_deploy_interface"] == "fake" and "fake" in fake["enabled_deploy_interfaces"]
    assert fake["default_network_interface"] == "noop" and fake["hosts"]
    await api.refused(406, "GET", "/v1/drivers?detail=True", version="1.29")
    await api.refused(400, "GET", "/v1/drivers?detail=maybe")


async def test_noop_network_vif_without_a_free_port(api: Client) -> None:
    await api.new_node("vif-noop")
    await api.call("POST", "/v1/nodes/vif-noop/vifs", {"id": "vif-x"}, expect=204)
    assert (await api.call("GET", "/v1/nodes/vif-noop/vifs", expect=200))[1] == {"vifs": []}
    await api.call("DELETE", "/v1/nodes/vif-noop/vifs/vif-x", expect=204)
    await api.call("DELETE", "/v1/nodes/vif-noop/vifs/never-attached", expect=204)
    await api.refused(404, "DELETE", f"/v1/nodes/{uuid.uuid4()}/vifs/vif-x")


async def test_retired_reason_goes_with_retired(api: Client) -> None:
    await api.new_node("retiring", "manageable")
    status, node = await api.patch("retiring", ("replace", "/retired", True), ("replace", "/retired_reason", "old"))
    assert status == 200 and node["retired"] and node["retired_reason"] == "old"
    status, node = await api.patch("retiring", ("replace", "/retired", False))
    assert status == 200 and not node["retired"] and node["retired_reason"] is None
    ops = [{"op": "replace", "path": "/retired_reason", "value": "why"}]
    assert "only be set when retired" in await api.refused(400, "PATCH", "/v1/nodes/retiring", ops)
    assert (await api.node("retiring"))["retired_reason"] is None


async def test_protected_only_when_deployed_and_its_reason_goes_with_it(api: Client) -> None:
    await api.new_node("guarded", "available")
    ops = [{"op": "replace", "path": "/protected", "value": True}]
    assert "can only be made protected" in await api.refused(409, "PATCH", "/v1/nodes/guarded", ops)
    assert (await api.node("guarded"))["protected"] is False
    await api.call("PUT", "/v1/nodes/guarded/states/provision", {"target": "active"}, expect=202)
    await api.wait_state("guarded", "active")
    status, node = await api.patch("guarded", ("replace", "/protected", True), ("add", "/protected_reason", "db"))
    assert status == 200 and node["protected"] and node["protected_reason"] == "db"
    status, node = await api.patch("guarded", ("replace", "/protected", False))
    assert status == 200 and node["protected"] is False and node["protected_reason"] is None


async def test_maintenance_by_patch(api: Client) -> None:
    await api.new_node("maint-patch")
    await api.call("PUT", "/v1/nodes/maint-patch/maintenance", {"reason": "disk"}, expect=202)
    status, node = await api.patch("maint-patch", ("replace", "/maintenance", False))
    assert status == 200 and node["maintenance"] is False and node["maintenance_reason"] is None
    status, node = await api.patch("maint-patch", ("replace", "/maintenance", True))
    assert status == 200 and node["maintenance"] is True
    ops = [{"op": "replace", "path": "/maintenance", "value": "sometimes"}]
    await api.refused(400, "PATCH", "/v1/nodes/maint-patch", ops)
    ops = [{"op": "replace", "path": "/maintenance_reason", "value": "x"}]
    assert "internal attribute" in await api.refused(400, "PATCH", "/v1/nodes/maint-patch", ops)
    assert (await api.node("maint-patch"))["maintenance"] is True


async def test_fault_filter_takes_only_ironic_faults(api: Client) -> None:
    assert "Unrecognized fault" in await api.refused(400, "GET", "/v1/nodes?fault=bogus")
    await api.call("GET", "/v1/nodes?fault=power%20failure", expect=200)
    await api.refused(406, "GET", "/v1/nodes?fault=power%20failure", version="1.41")


# -- config drives ------------------------------------------------------------------------------


async def test_vfat_config_drive_accepted_anything_else_refused(api: Client, tmp_path_factory) -> None:
    from services.common.images import configdrive, fat
    from tests.unit.test_configdrive import vfat_drive

    await api.new_node("cd-vfat", "available")
    await api.new_node("cd-bad", "available")
    drive = configdrive.encode_configdrive(vfat_drive(tmp_path_factory.mktemp("vfat")))
    body = {"target": "active", "configdrive": drive}
    await api.call("PUT", "/v1/nodes/cd-vfat/states/provision", body, expect=202)
    await api.wait_state("cd-vfat", "active")
    unlabelled = configdrive.encode_configdrive(fat.write_image({"a": b"x"}, label="DATA"))
    for value in (unlabelled, configdrive.encode_configdrive(b"\0" * 40_000)):
        reason = await api.refused(
            400, "PUT", "/v1/nodes/cd-bad/states/provision", {"target": "active", "configdrive": value}
        )
        assert "neither an ISO9660 image nor a VFAT image labelled config-2" in reason
    node = await api.node("cd-bad")
    assert node["provision_state"] == "available" and node["target_provision_state"] is None
    assert "configdrive" not in node["instance_info"]


# -- item 2: paths, versions, identifiers -------------------------------------------------------


async def test_paths_without_v1_are_served_as_v1(api: Client) -> None:
    node = await api.new_node("no-prefix", resource_class="no-prefix-rc")
    _, port = await api.call("POST", "/v1/ports", {"node_uuid": node["uuid"], "address": "52:54:00:22:00:01"})
    _, detail = await api.call("GET", "/nodes/detail?resource_class=no-prefix-rc", expect=200)
    assert [n["uuid"] for n in detail["nodes"]] == [node["uuid"]] and "driver_info" in detail["nodes"][0]
    assert detail["nodes"][0]["links"][0]["href"].endswith(f"/v1/nodes/{node['uuid']}")
    _, ports = await api.call("GET", f"/ports/detail?node={node['uuid']}", expect=200)
    assert [p["uuid"] for p in ports["ports"]] == [port["uuid"]]
    _, props = await api.call("GET", "/drivers/fake-hardware/properties", expect=200)
    assert isinstance(props, dict)
    assert "has no allocation" in await api.refused(404, "GET", "/nodes/no-prefix/allocation")
    await api.refused(404, "GET", "/nodes/no-prefix/allocation", version="1.51")  # versions still apply
    await api.refused(404, "GET", "/no/such/thing")
    await api.call("GET", "/v1/nodes/no-prefix", expect=200)


async def test_writes_below_their_first_version_are_405_or_406(api: Client) -> None:
    await api.new_node("old-client")
    step = {"interface": "deploy", "step": "deploy", "args": {}, "priority": 10}
    for method, path, body, version, status in (
        ("POST", "/v1/allocations", {"resource_class": "x"}, "1.51", 405),
        ("DELETE", f"/v1/allocations/{uuid.uuid4()}", None, "1.51", 405),
        ("PATCH", f"/v1/allocations/{uuid.uuid4()}", [], "1.51", 405),
        ("POST", "/v1/deploy_templates", {"name": "CUSTOM_OLD", "steps": [step]}, "1.54", 405),
        ("PATCH", "/v1/deploy_templates/CUSTOM_OLD", [], "1.54", 405),
        ("DELETE", "/v1/deploy_templates/CUSTOM_OLD", None, "1.54", 405),
        ("GET", "/v1/nodes/old-client/traits", None, "1.36", 406),
        ("PUT", "/v1/nodes/old-client/traits", {"traits": ["CUSTOM_A"]}, "1.36", 405),
        ("PUT", "/v1/nodes/old-client/traits/CUSTOM_A", None, "1.36", 405),
        ("DELETE", "/v1/nodes/old-client/traits", None, "1.36", 404),
        ("GET", "/v1/allocations", None, "1.51", 404),
        ("GET", "/v1/deploy_templates", None, "1.54", 404),
    ):
        await api.refused(status, method, path, body, version=version)
    assert (await api.call("GET", "/v1/nodes/old-client/traits", expect=200))[1] == {"traits": []}
    await api.refused(404, "GET", "/v1/deploy_templates/CUSTOM_OLD")


async def test_malformed_port_and_volume_identifiers_are_400(api: Client) -> None:
    node = await api.new_node("ident-node")
    _, port = await api.call(
        "POST", "/v1/ports", {"node_uuid": node["uuid"], "address": "52:54:00:22:00:02"}, expect=201
    )
    for ident in ("52:54:00:22:00:02", "malformed:uuid"):
        assert "Expected a logical name or UUID" in await api.refused(400, "GET", f"/v1/ports/{ident}")
        await api.refused(400, "PATCH", f"/v1/ports/{ident}", [{"op": "add", "path": "/extra/a", "value": 1}])
        await api.refused(400, "DELETE", f"/v1/ports/{ident}")
    await api.refused(404, "GET", f"/v1/ports/{uuid.uuid4()}")
    missing = str(uuid.uuid4())
    body = {"node_uuid": missing, "address": "52:54:00:22:00:03"}
    assert f"Node {missing} could not be found" in await api.refused(400, "POST", "/v1/ports", body)
    ops = [{"op": "replace", "path": "/node_uuid", "value": missing}]
    await api.refused(400, "PATCH", f"/v1/ports/{port['uuid']}", ops)
    assert (await api.call("GET", f"/v1/ports/{port['uuid']}", expect=200))[1]["node_uuid"] == node["uuid"]
    assert (await api.call("GET", "/v1/ports?address=52:54:00:22:00:03", expect=200))[1]["ports"] == []
    for kind in ("connectors", "targets"):
        assert "Expected a UUID" in await api.refused(400, "GET", f"/v1/volume/{kind}/not-a-uuid")
        await api.refused(400, "PATCH", f"/v1/volume/{kind}/not-a-uuid", [])
        await api.refused(400, "DELETE", f"/v1/volume/{kind}/not-a-uuid")
        await api.refused(404, "GET", f"/v1/volume/{kind}/{uuid.uuid4()}")


async def test_removing_extra_resets_it(api: Client) -> None:
    node = await api.new_node("extra-node")
    _, port = await api.call(
        "POST", "/v1/ports", {"node_uuid": node["uuid"], "address": "52:54:00:22:00:04", "extra": {"a": 1}}
    )
    _, connector = await api.call(
        "POST",
        "/v1/volume/connectors",
        {"node_uuid": node["uuid"], "type": "iqn", "connector_id": "iqn.2026-11.org:extra", "extra": {"a": 1}},
        expect=201,
    )
    _, target = await api.call(
        "POST",
        "/v1/volume/targets",
        {"node_uuid": node["uuid"], "volume_type": "iscsi", "volume_id": "v-extra", "boot_index": 0, "extra": {"a": 1}},
        expect=201,
    )
    remove = [{"op": "remove", "path": "/extra"}]
    for path in (f"/v1/ports/{port['uuid']}", f"/v1/volume/connectors/{connector['uuid']}"):
        assert (await api.call("PATCH", path, remove, expect=200))[1]["extra"] == {}
    assert (await api.call("PATCH", f"/v1/volume/targets/{target['uuid']}", remove, expect=200))[1]["extra"] == {}


async def test_volume_changes_right_after_a_power_action(api: Client) -> None:
    node = await api.new_node("vol-power", "manageable")
    _, connector = await api.call(
        "POST",
        "/v1/volume/connectors",
        {"node_uuid": node["uuid"], "type": "iqn", "connector_id": "iqn.2026-11.org:power"},
        expect=201,
    )
    _, target = await api.call(
        "POST",
        "/v1/volume/targets",
        {"node_uuid": node["uuid"], "volume_type": "iscsi", "volume_id": "v-power", "boot_index": 0},
        expect=201,
    )
    await api.call("PUT", "/v1/nodes/vol-power/states/provision", {"target": "provide"}, expect=202)
    await api.wait_state("vol-power", "available")
    await api.call("PUT", "/v1/nodes/vol-power/states/power", {"target": "power on"}, expect=202)
    ops = [{"op": "add", "path": "/extra/k", "value": "v"}]
    # Sent while the power change may still hold the lock: it waits for it, then the node is on.
    reason = await api.refused(400, "PATCH", f"/v1/volume/connectors/{connector['uuid']}", ops)
    assert reason == (
        f'The requested action "volume connector update" can not be performed on node "{node["uuid"]}" '
        'while it is in state "power on".'
    )
    reason = await api.refused(400, "DELETE", f"/v1/volume/targets/{target['uuid']}")
    assert '"volume target deletion"' in reason and '"power on"' in reason
    reason = await api.refused(400, "DELETE", f"/v1/volume/connectors/{connector['uuid']}")
    assert '"volume connector deletion"' in reason
    assert (await api.call("GET", f"/v1/volume/connectors/{connector['uuid']}", expect=200))[1]["extra"] == {}
    await api.call("GET", f"/v1/volume/targets/{target['uuid']}", expect=200)
    # A volume target alike: right after power off it waits for the lock and is updated (the node is off);
    # right after power on it is refused, and unchanged.
    target_path = f"/v1/volume/targets/{target['uuid']}"
    await api.call("PUT", "/v1/nodes/vol-power/states/power", {"target": "power off"}, expect=202)
    assert (await api.call("PATCH", target_path, ops, expect=200))[1]["extra"] == {"k": "v"}
    await api.call("PUT", "/v1/nodes/vol-power/states/power", {"target": "power on"}, expect=202)
    reason = await api.refused(400, "PATCH", target_path, [{"op": "add", "path": "/extra/k", "value": "w"}])
    assert '"volume target update"' in reason and '"power on"' in reason, reason
    assert (await api.call("GET", target_path, expect=200))[1]["extra"] == {"k": "v"}


async def test_port_group_members_share_one_physical_network(api: Client) -> None:
    node = await api.new_node("physnet-node")
    _, group = await api.call("POST", "/v1/portgroups", {"node_uuid": node["uuid"], "name": "bond-pn"}, expect=201)
    base = {"node_uuid": node["uuid"], "portgroup_uuid": group["uuid"]}
    await api.call("POST", "/v1/ports", {**base, "address": "52:54:00:23:00:01", "physical_network": "a"}, expect=201)
    body = {**base, "address": "52:54:00:23:00:02", "physical_network": "b"}
    assert "cannot become a member of port group" in await api.refused(409, "POST", "/v1/ports", body)
    assert (await api.call("GET", "/v1/ports?address=52:54:00:23:00:02", expect=200))[1]["ports"] == []
    _, loose = await api.call(
        "POST", "/v1/ports", {"node_uuid": node["uuid"], "address": "52:54:00:23:00:03", "physical_network": "b"}
    )
    join = [{"op": "replace", "path": "/portgroup_uuid", "value": group["uuid"]}]
    await api.refused(409, "PATCH", f"/v1/ports/{loose['uuid']}", join)
    _, still = await api.call("GET", f"/v1/ports/{loose['uuid']}", expect=200)
    assert still["portgroup_uuid"] is None
    fix = [*join, {"op": "replace", "path": "/physical_network", "value": "a"}]
    _, joined = await api.call("PATCH", f"/v1/ports/{loose['uuid']}", fix, expect=200)
    assert joined["portgroup_uuid"] == group["uuid"]
    await api.refused(
        409, "PATCH", f"/v1/ports/{loose['uuid']}", [{"op": "replace", "path": "/physical_network", "value": "c"}]
    )


async def test_states_and_node_agree_at_1_1(api: Client) -> None:
    ident = (await api.new_node("old-states", "available"))["uuid"]  # no names at 1.1
    _, states_doc = await api.call("GET", f"/v1/nodes/{ident}/states", version="1.1", expect=200)
    _, node = await api.call("GET", f"/v1/nodes/{ident}", version="1.1", expect=200)
    assert states_doc["provision_state"] is None and node["provision_state"] is None
    _, states_doc = await api.call("GET", f"/v1/nodes/{ident}/states", version="1.2", expect=200)
    assert states_doc["provision_state"] == "available"


async def test_heartbeat_without_a_node_is_400(api: Client) -> None:
    assert "node_ident" in await api.refused(400, "POST", "/v1/heartbeat", {}, version="1.22")
    await api.refused(404, "POST", "/v1/heartbeat", {}, version="1.21")


async def test_reset_interfaces_gives_the_new_drivers_defaults(api: Client) -> None:
    await api.new_node("reset-ifaces", "manageable", driver_info={"redfish_address": "http://127.0.0.1:1"})
    _, drivers = await api.call("GET", "/v1/drivers?detail=True", expect=200)
    redfish = next(d for d in drivers["drivers"] if d["name"] == "redfish")
    ops = [{"op": "replace", "path": "/driver", "value": "redfish"}]
    _, node = await api.call("PATCH", "/v1/nodes/reset-ifaces?reset_interfaces=true", ops, expect=200)
    for kind in ("boot", "deploy", "power", "management", "network", "inspect", "rescue", "console"):
        assert node[f"{kind}_interface"] == redfish[f"default_{kind}_interface"], kind
    assert node == await api.node("reset-ifaces") | {"updated_at": node["updated_at"]}
