"""Microversions 1.57 to 1.78 over real REST, each at its version and refused
below it.

Ferrum still advertises less than 1.78 (services/api/versions.py), so the live
api answers 406 to a header above its maximum. Requests at a version the live
api advertises go to it; requests above go to a second real HTTP server in
this module, built from the same pool, conductor router and handlers
(the routes table, services/api/routes.py) as the api service, whose only difference is that it
accepts versions up to 1.78. When the maximum is raised, every request here
goes to the live api unchanged.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from services.api import versions
from services.api.context import ApiContext
from services.api.middlewares import error_middleware
from services.api.routes import add_routes
from services.common.db.bios import BiosRepository

LAB_MAX = (1, 78)


@web.middleware
async def lab_versions(request: web.Request, handler: Any) -> web.StreamResponse:
    """Version negotiation as the api does it, with 1.78 as the ceiling."""
    raw = request.headers.get(versions.HEADER, "1.1")
    match = re.fullmatch(r"1\.(\d+)", raw.strip())
    assert match and 1 <= int(match.group(1)) <= LAB_MAX[1], raw
    request["version"] = (1, int(match.group(1)))
    response = await handler(request)
    response.headers.update(versions.headers(request["version"]))
    return response


class Api:
    """One REST call at one microversion, to whichever server advertises it."""

    def __init__(self, session: aiohttp.ClientSession, live: str, lab: str, live_max: tuple[int, int]) -> None:
        self.session, self.live, self.lab, self.live_max = session, live, lab, live_max

    async def call(
        self, version: tuple[int, int], method: str, path: str, body: Any = None, expect: int | None = None
    ) -> tuple[int, Any]:
        base = self.live if version <= self.live_max else self.lab
        headers = {versions.HEADER: versions.fmt(version)}
        async with self.session.request(method, base + path, json=body, headers=headers) as r:
            text = await r.text()
            if expect is not None:
                assert r.status == expect, f"{method} {path} at {versions.fmt(version)}: {r.status} {text}"
            return r.status, (json.loads(text) if text else None)

    async def wait_state(self, ident: str, state: str, timeout: float = 60) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            _, node = await self.call((1, 56), "GET", f"/v1/nodes/{ident}", expect=200)
            if node["provision_state"] == state and node["reservation"] is None:
                return node
            assert time.monotonic() < deadline, f"{ident}: {node['provision_state']} ({node['last_error']})"
            await asyncio.sleep(0.05)


def fault(body: dict[str, Any]) -> str:
    return json.loads(body["error_message"])["faultstring"]


@pytest.fixture(scope="module")
async def lab(stack: Any) -> AsyncIterator[str]:
    service = next(s for s in stack.services if s.name == "api")
    app = web.Application(middlewares=[error_middleware, lab_versions])
    add_routes(app, ApiContext(service.pool, service.router, service.settings, internal_token=service.internal_token))
    server = TestServer(app, host="127.0.0.1", port=0)
    await server.start_server()
    try:
        yield str(server.make_url("")).rstrip("/")
    finally:
        await server.close()


@pytest.fixture(scope="module")
async def api(stack: Any, lab: str) -> AsyncIterator[Api]:
    live = stack.endpoints["api REST (Ironic v1)"]
    async with aiohttp.ClientSession() as session:
        async with session.get(live + "/") as r:
            advertised = (await r.json())["default_version"]["version"]
        major, minor = advertised.split(".")
        yield Api(session, live, lab, (int(major), int(minor)))


async def new_node(api: Api, name: str, **fields: Any) -> dict[str, Any]:
    version = (1, 65) if "lessee" in fields else (1, 56)
    _, node = await api.call(
        version, "POST", "/v1/nodes", {"driver": "fake-hardware", "name": name, **fields}, expect=201
    )
    return node


async def deployed_node(api: Api, name: str, instance_uuid: str | None) -> dict[str, Any]:
    """A fake-hardware node taken to active; the deploy carries a 1.59 config drive with vendor_data."""
    await new_node(api, name, resource_class="backfill-rc")
    await api.call((1, 56), "PUT", f"/v1/nodes/{name}/states/provision", {"target": "manage"}, expect=202)
    await api.wait_state(name, "manageable")
    await api.call((1, 56), "PUT", f"/v1/nodes/{name}/states/provision", {"target": "provide"}, expect=202)
    await api.wait_state(name, "available")
    patch = [{"op": "add", "path": "/instance_info/image_source", "value": "http://images/x.img"}]
    if instance_uuid:
        patch.append({"op": "add", "path": "/instance_uuid", "value": instance_uuid})
    await api.call((1, 56), "PATCH", f"/v1/nodes/{name}", patch, expect=200)
    drive = {"meta_data": {"hostname": name}, "vendor_data": {"site": "lab"}}
    status, body = await api.call(
        (1, 58), "PUT", f"/v1/nodes/{name}/states/provision", {"target": "active", "configdrive": drive}
    )
    assert status == 400 and "vendor_data" in fault(body)  # 1.59 feature, refused at 1.58
    await api.call(
        (1, 59), "PUT", f"/v1/nodes/{name}/states/provision", {"target": "active", "configdrive": drive}, expect=202
    )
    return await api.wait_state(name, "active")


# -- allocations: 1.57 PATCH, 1.58 backfill, 1.60 owner ----------------------------------------------


async def test_allocation_patch_name_and_extra_from_1_57(api: Api) -> None:
    _, alloc = await api.call(
        (1, 56), "POST", "/v1/allocations", {"resource_class": "nothing-here", "name": "p-1"}, expect=201
    )
    _, other = await api.call(
        (1, 56), "POST", "/v1/allocations", {"resource_class": "nothing-here", "name": "p-2"}, expect=201
    )
    ops = [{"op": "replace", "path": "/name", "value": "p-renamed"}, {"op": "add", "path": "/extra/k", "value": "v"}]
    status, _ = await api.call((1, 56), "PATCH", f"/v1/allocations/{alloc['uuid']}", ops)
    assert status == 405  # Ironic: the method does not exist before 1.57
    _, same = await api.call((1, 56), "GET", f"/v1/allocations/{alloc['uuid']}", expect=200)
    assert same["name"] == "p-1" and same["extra"] == {}

    _, patched = await api.call((1, 57), "PATCH", f"/v1/allocations/{alloc['uuid']}", ops, expect=200)
    assert patched["name"] == "p-renamed" and patched["extra"] == {"k": "v"}
    assert patched["updated_at"] is not None and "owner" not in patched
    _, by_name = await api.call((1, 57), "GET", "/v1/allocations/p-renamed", expect=200)
    assert by_name["uuid"] == alloc["uuid"]

    for bad, code in (
        ([{"op": "replace", "path": "/resource_class", "value": "x"}], 400),
        ([{"op": "replace", "path": "/state", "value": "active"}], 400),
        ([{"op": "replace", "path": "/name", "value": "has space"}], 400),
        ([{"op": "replace", "path": "/name", "value": str(uuid.uuid4())}], 400),
        ([{"op": "replace", "path": "/extra", "value": [1]}], 400),
        ([{"op": "replace", "path": "/name", "value": "p-2"}], 409),
    ):
        status, body = await api.call((1, 57), "PATCH", f"/v1/allocations/{alloc['uuid']}", bad)
        assert status == code, (bad, status, body)
    _, unchanged = await api.call((1, 57), "GET", f"/v1/allocations/{alloc['uuid']}", expect=200)
    assert unchanged["name"] == "p-renamed" and unchanged["resource_class"] == "nothing-here"
    _, cleared = await api.call(
        (1, 57),
        "PATCH",
        f"/v1/allocations/{alloc['uuid']}",
        [{"op": "remove", "path": "/name"}, {"op": "remove", "path": "/extra"}],
        expect=200,
    )
    assert cleared["name"] is None and cleared["extra"] == {}
    assert other["name"] == "p-2"


async def test_allocation_owner_from_1_60(api: Api) -> None:
    body = {"resource_class": "nothing-here", "owner": "project-a"}
    status, _ = await api.call((1, 59), "POST", "/v1/allocations", body)
    assert status == 406
    _, mine = await api.call((1, 60), "POST", "/v1/allocations", {**body, "name": "owned-a"}, expect=201)
    assert mine["owner"] == "project-a"
    await api.call((1, 60), "POST", "/v1/allocations", {**body, "owner": "project-b", "name": "owned-b"}, expect=201)
    _, listed = await api.call((1, 60), "GET", "/v1/allocations?owner=project-a", expect=200)
    assert [a["name"] for a in listed["allocations"]] == ["owned-a"]
    _, picked = await api.call((1, 60), "GET", "/v1/allocations/owned-a?fields=uuid,owner", expect=200)
    assert set(picked) == {"uuid", "owner", "links"}
    assert (await api.call((1, 59), "GET", "/v1/allocations?owner=project-a"))[0] == 406
    assert (await api.call((1, 59), "GET", "/v1/allocations/owned-a?fields=owner"))[0] == 406
    _, old = await api.call((1, 59), "GET", "/v1/allocations/owned-a", expect=200)
    assert "owner" not in old
    status, _ = await api.call(
        (1, 60), "PATCH", "/v1/allocations/owned-a", [{"op": "replace", "path": "/owner", "value": "project-b"}]
    )
    assert status == 400  # only name and extra change, as in Ironic
    assert (await api.call((1, 60), "POST", "/v1/allocations", {**body, "owner": "x" * 256}))[0] == 400


async def test_allocation_owner_only_takes_owned_or_leased_nodes(api: Api) -> None:
    """1.60/1.65: an owned allocation matches nodes with that owner or lessee only."""
    for name, extra in (
        ("own-none", {}),
        ("own-other", {"owner": "project-z"}),
        ("own-owner", {"owner": "project-o"}),
        ("own-lessee", {"lessee": "project-l"}),
    ):
        await new_node(api, name, resource_class="owned-rc", **extra)
        await api.call((1, 56), "PUT", f"/v1/nodes/{name}/states/provision", {"target": "manage"}, expect=202)
        await api.wait_state(name, "manageable")
        await api.call((1, 56), "PUT", f"/v1/nodes/{name}/states/provision", {"target": "provide"}, expect=202)
        await api.wait_state(name, "available")
    _, none = await api.call(
        (1, 60), "POST", "/v1/allocations", {"resource_class": "owned-rc", "owner": "project-q"}, expect=201
    )
    assert none["state"] == "error" and "project-q" in none["last_error"]
    _, by_owner = await api.call(
        (1, 60), "POST", "/v1/allocations", {"resource_class": "owned-rc", "owner": "project-o"}, expect=201
    )
    _, owner_node = await api.call((1, 60), "GET", "/v1/nodes/own-owner", expect=200)
    assert by_owner["state"] == "active" and by_owner["node_uuid"] == owner_node["uuid"]
    _, by_lessee = await api.call(
        (1, 65), "POST", "/v1/allocations", {"resource_class": "owned-rc", "owner": "project-l"}, expect=201
    )
    _, lessee_node = await api.call((1, 65), "GET", "/v1/nodes/own-lessee", expect=200)
    assert by_lessee["state"] == "active" and by_lessee["node_uuid"] == lessee_node["uuid"]
    _, again = await api.call(
        (1, 60), "POST", "/v1/allocations", {"resource_class": "owned-rc", "owner": "project-o"}, expect=201
    )
    assert again["state"] == "error"  # its only node is taken; project-z's and the unowned one stay free
    for name in ("own-none", "own-other"):
        _, free = await api.call((1, 60), "GET", f"/v1/nodes/{name}", expect=200)
        assert free["instance_uuid"] is None


async def test_allocation_backfill_from_1_58(api: Api) -> None:
    instance = str(uuid.uuid4())
    node = await deployed_node(api, "backfill-1", instance)
    spare = await new_node(api, "backfill-spare", resource_class="backfill-rc")

    status, body = await api.call((1, 57), "POST", "/v1/allocations", {"node": "backfill-1"})
    assert status == 400 and "API version" in fault(body)
    for bad in (
        {"node": "backfill-spare"},  # not deployed
        {"node": "backfill-1", "resource_class": "other-rc"},
        {"node": "backfill-1", "traits": ["CUSTOM_MISSING"]},
        {"node": "backfill-1", "candidate_nodes": ["backfill-spare"]},
        {"node": "no-such-node"},
    ):
        status, body = await api.call((1, 58), "POST", "/v1/allocations", bad)
        assert status == 400, (bad, status, body)
    status, _ = await api.call((1, 58), "POST", "/v1/allocations", {"node": "backfill-1", "uuid": str(uuid.uuid4())})
    assert status == 409  # the node's instance is another one
    _, none_yet = await api.call((1, 58), "GET", "/v1/allocations?node=backfill-1", expect=200)
    assert none_yet["allocations"] == []  # refusals leave nothing behind

    _, alloc = await api.call((1, 58), "POST", "/v1/allocations", {"node": "backfill-1", "name": "filled"}, expect=201)
    assert alloc["uuid"] == instance and alloc["state"] == "active" and alloc["node_uuid"] == node["uuid"]
    assert alloc["resource_class"] == "backfill-rc"
    _, shown = await api.call((1, 58), "GET", "/v1/nodes/backfill-1", expect=200)
    assert shown["allocation_uuid"] == instance and shown["provision_state"] == "active"
    _, again = await api.call((1, 58), "GET", "/v1/nodes/backfill-1/allocation", expect=200)
    assert again["name"] == "filled"
    assert (await api.call((1, 58), "POST", "/v1/allocations", {"node": "backfill-1", "name": "twice"}))[0] == 409
    _, spare_now = await api.call((1, 58), "GET", f"/v1/nodes/{spare['uuid']}", expect=200)
    assert spare_now["instance_uuid"] is None and spare_now["allocation_uuid"] is None


# -- ports: 1.64 network_type ---------------------------------------------------------------------


async def test_port_network_type_from_1_64(api: Api) -> None:
    node = await new_node(api, "llc-node")

    def port(mac: str, llc: dict[str, Any]) -> dict[str, Any]:
        return {"node_uuid": node["uuid"], "address": mac, "local_link_connection": llc}

    managed = {"port_id": "Eth1/1", "switch_id": "aa:bb:cc:dd:ee:ff", "network_type": "managed"}
    assert (await api.call((1, 63), "POST", "/v1/ports", port("52:54:00:64:00:01", managed)))[0] == 406
    _, p1 = await api.call((1, 64), "POST", "/v1/ports", port("52:54:00:64:00:01", managed), expect=201)
    assert p1["local_link_connection"] == managed
    _, p2 = await api.call(
        (1, 64), "POST", "/v1/ports", port("52:54:00:64:00:02", {"network_type": "unmanaged"}), expect=201
    )
    assert p2["local_link_connection"] == {"network_type": "unmanaged"}
    for bad in (
        {"network_type": "managed"},  # managed still needs port_id and switch_id
        {"network_type": "bogus", "port_id": "1", "switch_id": "s"},
        {"port_id": "Eth1/1"},
        {"port_id": "Eth1/1", "switch_id": "s", "vlan": "1"},
        {"port_id": 7, "switch_id": "s"},
    ):
        status, body = await api.call((1, 64), "POST", "/v1/ports", port("52:54:00:64:00:03", bad))
        assert status == 400, (bad, status, body)
    _, smartnic = await api.call(
        (1, 64), "POST", "/v1/ports", port("52:54:00:64:00:03", {"port_id": "rep0", "hostname": "host-a"}), expect=201
    )
    assert smartnic["local_link_connection"]["hostname"] == "host-a"
    ops = [{"op": "add", "path": "/local_link_connection/network_type", "value": "unmanaged"}]
    status, _ = await api.call((1, 63), "PATCH", f"/v1/ports/{smartnic['uuid']}", ops)
    assert status == 406
    _, patched = await api.call((1, 64), "PATCH", f"/v1/ports/{smartnic['uuid']}", ops, expect=200)
    assert patched["local_link_connection"]["network_type"] == "unmanaged"
    _, listed = await api.call((1, 56), "GET", f"/v1/ports/{p2['uuid']}", expect=200)
    assert listed["local_link_connection"] == {"network_type": "unmanaged"}


# -- VIFs: 1.67 port_uuid / portgroup_uuid --------------------------------------------------------


async def test_vif_attach_to_named_port_or_group_from_1_67(api: Api) -> None:
    node = await new_node(api, "vif-node")
    other = await new_node(api, "vif-other")
    _, pxe = await api.call(
        (1, 56), "POST", "/v1/ports", {"node_uuid": node["uuid"], "address": "52:54:00:67:00:01"}, expect=201
    )
    _, second = await api.call(
        (1, 56),
        "POST",
        "/v1/ports",
        {"node_uuid": node["uuid"], "address": "52:54:00:67:00:02", "pxe_enabled": False},
        expect=201,
    )
    _, foreign = await api.call(
        (1, 56), "POST", "/v1/ports", {"node_uuid": other["uuid"], "address": "52:54:00:67:00:03"}, expect=201
    )
    _, group = await api.call(
        (1, 56),
        "POST",
        "/v1/portgroups",
        {"node_uuid": node["uuid"], "name": "vif-bond", "address": "52:54:00:67:00:10"},
        expect=201,
    )
    vifs = f"/v1/nodes/{node['uuid']}/vifs"

    status, _ = await api.call((1, 66), "POST", vifs, {"id": "vif-a", "port_uuid": second["uuid"]})
    assert status == 406
    await api.call((1, 67), "POST", vifs, {"id": "vif-a", "port_uuid": second["uuid"]}, expect=204)
    _, chosen = await api.call((1, 56), "GET", f"/v1/ports/{second['uuid']}", expect=200)
    assert chosen["internal_info"]["tenant_vif_port_id"] == "vif-a"  # not the PXE port a free pick would take
    _, untouched = await api.call((1, 56), "GET", f"/v1/ports/{pxe['uuid']}", expect=200)
    assert "tenant_vif_port_id" not in untouched["internal_info"]

    for body, code in (
        ({"id": "vif-b", "port_uuid": foreign["uuid"]}, 400),
        ({"id": "vif-b", "port_uuid": str(uuid.uuid4())}, 400),
        ({"id": "vif-b", "port_uuid": "not-a-uuid"}, 400),
        ({"id": "vif-b", "port_uuid": second["uuid"]}, 409),
        ({"id": "vif-b", "port_uuid": pxe["uuid"], "portgroup_uuid": group["uuid"]}, 400),
    ):
        status, reply = await api.call((1, 67), "POST", vifs, body)
        assert status == code, (body, status, reply)
    _, listed = await api.call((1, 67), "GET", vifs, expect=200)
    assert listed["vifs"] == [{"id": "vif-a"}]

    await api.call((1, 67), "POST", vifs, {"id": "vif-g", "portgroup_uuid": group["uuid"]}, expect=204)
    status, _ = await api.call((1, 67), "POST", vifs, {"id": "vif-h", "portgroup_uuid": group["uuid"]})
    assert status == 409
    status, _ = await api.call(
        (1, 67), "POST", f"/v1/nodes/{other['uuid']}/vifs", {"id": "vif-h", "portgroup_uuid": group["uuid"]}
    )
    assert status == 400
    assert (await api.call((1, 67), "POST", f"/v1/nodes/{other['uuid']}/vifs", {"id": "vif-g"}))[0] == 409
    _, listed = await api.call((1, 67), "GET", vifs, expect=200)
    assert sorted(v["id"] for v in listed["vifs"]) == ["vif-a", "vif-g"]
    await api.call((1, 67), "DELETE", f"{vifs}/vif-g", expect=204)
    await api.call((1, 67), "DELETE", f"{vifs}/vif-a", expect=204)
    _, listed = await api.call((1, 67), "GET", vifs, expect=200)
    assert listed["vifs"] == []


# -- BIOS: 1.74 registry details ------------------------------------------------------------------


async def test_bios_registry_details_from_1_74(api: Api, stack: Any) -> None:
    node = await new_node(api, "bios-node")
    service = next(s for s in stack.services if s.name == "api")
    node_id = await service.pool.fetchval("SELECT id FROM nodes WHERE uuid = $1::uuid", node["uuid"])
    await BiosRepository(service.pool).replace(
        node_id,
        {"BootMode": "Uefi", "ProcTurbo": "Enabled"},
        registry={
            "BootMode": {
                "attribute_type": "Enumeration",
                "allowable_values": ["Bios", "Uefi"],
                "read_only": False,
                "reset_required": True,
                "unique": False,
            }
        },
    )
    path = f"/v1/nodes/{node['uuid']}/bios"

    _, plain = await api.call((1, 73), "GET", path, expect=200)
    assert [s["name"] for s in plain["bios"]] == ["BootMode", "ProcTurbo"]
    assert "attribute_type" not in plain["bios"][0]
    for query in ("?detail=true", "?fields=name"):
        assert (await api.call((1, 73), "GET", path + query))[0] == 400
    _, one_old = await api.call((1, 73), "GET", f"{path}/BootMode", expect=200)
    assert "allowable_values" not in one_old["BootMode"]

    _, default = await api.call((1, 74), "GET", path, expect=200)
    assert "attribute_type" not in default["bios"][0]  # details only when asked for
    _, detail = await api.call((1, 74), "GET", path + "?detail=true", expect=200)
    boot = detail["bios"][0]
    assert boot["attribute_type"] == "Enumeration" and boot["allowable_values"] == ["Bios", "Uefi"]
    assert boot["reset_required"] is True and boot["read_only"] is False and boot["upper_bound"] is None
    assert detail["bios"][1]["attribute_type"] is None
    _, picked = await api.call((1, 74), "GET", path + "?fields=name,reset_required", expect=200)
    assert [set(s) for s in picked["bios"]] == [{"name", "reset_required", "links"}] * 2
    assert (await api.call((1, 74), "GET", path + "?fields=bogus"))[0] == 400
    assert (await api.call((1, 74), "GET", path + "?detail=true&fields=name"))[0] == 400
    _, one = await api.call((1, 74), "GET", f"{path}/BootMode", expect=200)
    assert one["BootMode"]["allowable_values"] == ["Bios", "Uefi"] and one["BootMode"]["value"] == "Uefi"


# -- drivers: 1.77 fields -------------------------------------------------------------------------


async def test_driver_fields_from_1_77(api: Api) -> None:
    assert (await api.call((1, 76), "GET", "/v1/drivers?fields=name"))[0] == 406
    assert (await api.call((1, 76), "GET", "/v1/drivers/fake-hardware?fields=name"))[0] == 406
    _, listed = await api.call((1, 77), "GET", "/v1/drivers?fields=name,hosts", expect=200)
    fake = next(d for d in listed["drivers"] if d["name"] == "fake-hardware")
    assert set(fake) == {"name", "hosts"} and fake["hosts"]
    _, iface = await api.call((1, 77), "GET", "/v1/drivers?fields=name,default_deploy_interface", expect=200)
    assert next(d for d in iface["drivers"] if d["name"] == "fake-hardware")["default_deploy_interface"]
    _, one = await api.call(
        (1, 77), "GET", "/v1/drivers/fake-hardware?fields=name,enabled_power_interfaces", expect=200
    )
    assert set(one) == {"name", "enabled_power_interfaces"} and one["enabled_power_interfaces"]
    assert (await api.call((1, 77), "GET", "/v1/drivers?fields=bogus"))[0] == 400
    _, full = await api.call((1, 77), "GET", "/v1/drivers/fake-hardware", expect=200)
    assert {"links", "properties", "type"} <= set(full)


# -- versions Ferrum already had: checked at their versions ----------------------------------------


async def test_retired_from_1_61(api: Api) -> None:
    assert (await api.call((1, 60), "POST", "/v1/nodes", {"driver": "fake-hardware", "retired": True}))[0] == 406
    node = await new_node(api, "retire-me")
    ops = [
        {"op": "replace", "path": "/retired", "value": True},
        {"op": "replace", "path": "/retired_reason", "value": "old"},
    ]
    assert (await api.call((1, 60), "PATCH", "/v1/nodes/retire-me", ops))[0] == 406
    _, patched = await api.call((1, 61), "PATCH", "/v1/nodes/retire-me", ops, expect=200)
    assert patched["retired"] is True and patched["retired_reason"] == "old"
    _, old = await api.call((1, 60), "GET", f"/v1/nodes/{node['uuid']}", expect=200)
    assert "retired" not in old
    _, retired = await api.call((1, 61), "GET", "/v1/nodes?retired=true", expect=200)
    assert [n["uuid"] for n in retired["nodes"]] == [node["uuid"]]
    _, active = await api.call((1, 61), "GET", "/v1/nodes?retired=false&limit=1000", expect=200)
    assert node["uuid"] not in [n["uuid"] for n in active["nodes"]]
    assert (await api.call((1, 60), "GET", "/v1/nodes?retired=true"))[0] == 406

    await new_node(api, "retire-available")
    await api.call((1, 61), "PUT", "/v1/nodes/retire-available/states/provision", {"target": "manage"}, expect=202)
    await api.wait_state("retire-available", "manageable")
    await api.call((1, 61), "PUT", "/v1/nodes/retire-available/states/provision", {"target": "provide"}, expect=202)
    await api.wait_state("retire-available", "available")
    status, body = await api.call((1, 61), "PATCH", "/v1/nodes/retire-available", ops)
    assert status == 409 and "manageable" in fault(body)  # as Ironic: manage it first
    await api.call((1, 61), "PUT", "/v1/nodes/retire-available/states/provision", {"target": "manage"}, expect=202)
    await api.wait_state("retire-available", "manageable")
    await api.call((1, 61), "PATCH", "/v1/nodes/retire-available", ops, expect=200)
    status, body = await api.call((1, 61), "PUT", "/v1/nodes/retire-available/states/provision", {"target": "provide"})
    assert status == 400 and "retired" in fault(body)


async def test_agent_token_verify_ca_and_status_in_heartbeat(api: Api) -> None:
    """1.62 (token), 1.68 (agent_verify_ca), 1.72 (agent_status): the fields pass
    validation from their version (the unknown node is then a 404) and are
    refused below it; a heartbeat without a token is refused."""
    missing = f"/v1/heartbeat/{uuid.uuid4()}"
    base = {"callback_url": "http://10.0.0.2:9999", "agent_token": "t0k3n"}
    status, body = await api.call((1, 62), "POST", missing, {"callback_url": "http://10.0.0.2:9999"})
    assert status == 400 and "token" in fault(body).lower()
    assert (await api.call((1, 62), "POST", missing, base))[0] == 404
    for field, value, since in (
        ("agent_verify_ca", "-----BEGIN CERTIFICATE-----", (1, 68)),
        ("agent_status", "start", (1, 72)),
    ):
        status, body = await api.call((1, since[1] - 1), "POST", missing, {**base, field: value})
        assert status == 400 and field in fault(body), (field, status, body)
        assert (await api.call(since, "POST", missing, {**base, field: value}))[0] == 404


async def test_lessee_from_1_65(api: Api) -> None:
    assert (await api.call((1, 64), "POST", "/v1/nodes", {"driver": "fake-hardware", "lessee": "p"}))[0] == 406
    node = await new_node(api, "leased", lessee="project-lessee")
    _, listed = await api.call((1, 65), "GET", "/v1/nodes?lessee=project-lessee&fields=uuid,lessee", expect=200)
    assert listed["nodes"] == [{"uuid": node["uuid"], "lessee": "project-lessee", "links": listed["nodes"][0]["links"]}]
    assert (await api.call((1, 64), "GET", "/v1/nodes?lessee=project-lessee"))[0] == 406
    _, old = await api.call((1, 64), "GET", "/v1/nodes/leased", expect=200)
    assert "lessee" not in old
    owned = await new_node(api, "owned-by-lessee-project", owner="project-lessee")
    _, project = await api.call((1, 65), "GET", "/v1/nodes?project=project-lessee", expect=200)
    assert sorted(n["uuid"] for n in project["nodes"]) == sorted([node["uuid"], owned["uuid"]])
    assert (await api.call((1, 64), "GET", "/v1/nodes?project=project-lessee"))[0] == 406


async def test_network_data_from_1_66(api: Api) -> None:
    await new_node(api, "netdata")
    data = {
        "links": [{"id": "eth0", "type": "phy", "ethernet_mac_address": "52:54:00:66:00:01"}],
        "networks": [],
        "services": [],
    }
    ops = [{"op": "add", "path": "/network_data", "value": data}]
    assert (await api.call((1, 65), "PATCH", "/v1/nodes/netdata", ops))[0] == 406
    _, patched = await api.call((1, 66), "PATCH", "/v1/nodes/netdata", ops, expect=200)
    assert patched["network_data"] == data
    full = {
        "links": [
            {"id": "eth0", "type": "phy", "ethernet_mac_address": "52:54:00:66:00:01", "mtu": 9000},
            {
                "id": "bond0",
                "type": "bond",
                "ethernet_mac_address": "52:54:00:66:00:02",
                "bond_mode": "802.1ad",
                "bond_links": ["eth0"],
            },
            {
                "id": "vlan9",
                "type": "vlan",
                "vlan_mac_address": "52:54:00:66:00:02",
                "vlan_link": "bond0",
                "vlan_id": 9,
            },
        ],
        "networks": [
            {
                "id": "net0",
                "link": "vlan9",
                "network_id": "n0",
                "type": "ipv4",
                "ip_address": "192.0.2.10",
                "netmask": "255.255.255.0",
                "routes": [{"network": "0.0.0.0", "netmask": "0.0.0.0", "gateway": "192.0.2.1"}],
            },
            {"id": "net1", "link": "eth0", "network_id": "n1", "type": "ipv6_slaac"},
        ],
        "services": [{"type": "dns", "address": "192.0.2.53"}, {"type": "dns", "address": "2001:db8::53"}],
    }
    _, patched = await api.call(
        (1, 66), "PATCH", "/v1/nodes/netdata", [{"op": "replace", "path": "/network_data", "value": full}], expect=200
    )
    assert patched["network_data"] == full
    broken = [
        "not an object",
        {"links": [], "networks": []},  # services missing
        {**data, "links": [{"id": "eth0", "type": "phy", "ethernet_mac_address": "nope"}]},
        {**data, "links": [{"id": "eth0", "type": "teleport", "ethernet_mac_address": "52:54:00:66:00:01"}]},
        {
            **data,
            "links": [{"id": "b", "type": "bond", "ethernet_mac_address": "52:54:00:66:00:01", "bond_mode": "802.1ad"}],
        },
        {
            **data,
            "networks": [{"id": "n", "link": "eth0", "network_id": "n", "type": "ipv4", "ip_address": "2001:db8::1"}],
        },
        {
            **data,
            "networks": [{"id": "n", "link": "eth0", "network_id": "n", "type": "ipv4", "netmask": "255.0.255.0"}],
        },
        {**data, "services": [{"type": "ntp", "address": "192.0.2.1"}]},
    ]
    for value in broken:
        status, body = await api.call(
            (1, 66), "PATCH", "/v1/nodes/netdata", [{"op": "replace", "path": "/network_data", "value": value}]
        )
        assert status == 400 and "network_data" in fault(body), (value, status, body)
    _, kept = await api.call((1, 66), "GET", "/v1/nodes/netdata", expect=200)
    assert kept["network_data"] == full
    status, _ = await api.call((1, 66), "POST", "/v1/nodes", {"driver": "fake-hardware", "network_data": broken[1]})
    assert status == 400
    _, emptied = await api.call(
        (1, 66), "PATCH", "/v1/nodes/netdata", [{"op": "replace", "path": "/network_data", "value": {}}], expect=200
    )
    assert emptied["network_data"] == {}


async def test_deploy_and_undeploy_verbs_from_1_73(api: Api) -> None:
    await new_node(api, "verbs")
    await api.call((1, 56), "PUT", "/v1/nodes/verbs/states/provision", {"target": "manage"}, expect=202)
    await api.wait_state("verbs", "manageable")
    await api.call((1, 56), "PUT", "/v1/nodes/verbs/states/provision", {"target": "provide"}, expect=202)
    await api.wait_state("verbs", "available")
    await api.call(
        (1, 56),
        "PATCH",
        "/v1/nodes/verbs",
        [{"op": "add", "path": "/instance_info/image_source", "value": "http://images/x.img"}],
        expect=200,
    )
    assert (await api.call((1, 72), "PUT", "/v1/nodes/verbs/states/provision", {"target": "deploy"}))[0] == 406
    await api.call((1, 73), "PUT", "/v1/nodes/verbs/states/provision", {"target": "deploy"}, expect=202)
    await api.wait_state("verbs", "active")
    assert (await api.call((1, 72), "PUT", "/v1/nodes/verbs/states/provision", {"target": "undeploy"}))[0] == 406
    await api.call((1, 73), "PUT", "/v1/nodes/verbs/states/provision", {"target": "undeploy"}, expect=202)
    await api.wait_state("verbs", "available")


async def test_boot_mode_and_secure_boot_fields_from_1_75(api: Api) -> None:
    node = await new_node(api, "bootmode")
    _, old = await api.call((1, 74), "GET", f"/v1/nodes/{node['uuid']}", expect=200)
    assert "boot_mode" not in old and "secure_boot" not in old
    _, new = await api.call((1, 75), "GET", f"/v1/nodes/{node['uuid']}", expect=200)
    assert "boot_mode" in new and "secure_boot" in new
    _, states_doc = await api.call((1, 75), "GET", f"/v1/nodes/{node['uuid']}/states", expect=200)
    assert "boot_mode" in states_doc and "secure_boot" in states_doc
    assert (await api.call((1, 74), "GET", f"/v1/nodes/{node['uuid']}?fields=boot_mode"))[0] == 406
    ops = [{"op": "replace", "path": "/boot_mode", "value": "uefi"}]
    assert (await api.call((1, 75), "PATCH", f"/v1/nodes/{node['uuid']}", ops))[0] == 400  # read only


async def test_history_follows_the_advertised_maximum(api: Api) -> None:
    """1.78: with ``latest`` the live api serves history once its maximum
    reaches 1.78 and answers 404 before; both branches are real requests."""
    node = await new_node(api, "hist-latest")
    await api.call((1, 56), "PUT", "/v1/nodes/hist-latest/maintenance", {"reason": "x"}, expect=202)
    async with api.session.get(f"{api.live}/v1/nodes/{node['uuid']}/history", headers={versions.HEADER: "latest"}) as r:
        status, text = r.status, await r.text()
    if api.live_max < (1, 78):
        assert status == 404, text
    else:
        assert status == 200, text
        assert json.loads(text)["history"]
    _, history = await api.call((1, 78), "GET", f"/v1/nodes/{node['uuid']}/history", expect=200)
    assert history["history"] and {"uuid", "created_at", "severity", "event"} <= set(history["history"][0])
    assert (await api.call((1, 77), "GET", f"/v1/nodes/{node['uuid']}/history"))[0] == 404


async def test_vif_attach_without_a_port_picks_like_ironic(api: Api) -> None:
    """Nova names no port: a port group first, then a PXE-enabled port; a group with a VIF is used up."""
    node = await new_node(api, "vif-pick")
    _, group = await api.call(
        (1, 56),
        "POST",
        "/v1/portgroups",
        {"node_uuid": node["uuid"], "name": "pick-bond", "address": "52:54:00:68:00:10"},
        expect=201,
    )
    for mac in ("52:54:00:68:00:01", "52:54:00:68:00:02"):
        await api.call(
            (1, 56),
            "POST",
            "/v1/ports",
            {"node_uuid": node["uuid"], "address": mac, "portgroup_uuid": group["uuid"]},
            expect=201,
        )
    _, lone = await api.call(
        (1, 56), "POST", "/v1/ports", {"node_uuid": node["uuid"], "address": "52:54:00:68:00:03"}, expect=201
    )
    vifs = f"/v1/nodes/{node['uuid']}/vifs"
    await api.call((1, 56), "POST", vifs, {"id": "vif-1"}, expect=204)
    _, bond = await api.call((1, 56), "GET", f"/v1/portgroups/{group['uuid']}", expect=200)
    assert bond["internal_info"]["tenant_vif_port_id"] == "vif-1"
    await api.call((1, 56), "POST", vifs, {"id": "vif-2"}, expect=204)
    _, single = await api.call((1, 56), "GET", f"/v1/ports/{lone['uuid']}", expect=200)
    assert single["internal_info"]["tenant_vif_port_id"] == "vif-2"
    status, reply = await api.call((1, 56), "POST", vifs, {"id": "vif-3"})
    assert status == 400 and "not enough free physical ports" in json.dumps(reply), reply
    _, listed = await api.call((1, 56), "GET", vifs, expect=200)
    assert sorted(v["id"] for v in listed["vifs"]) == ["vif-1", "vif-2"]
