"""Microversions after 1.78 over real REST, each at its version and refused
below it, as Ironic refuses it.

Requests at a version the live api advertises go to it; requests above go to
a lab server made of the same handlers (tests/labapi.py), so these tests
hold whatever the advertised maximum is.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest

from ferrum.v1 import api_pb2 as pb
from ferrum.v1 import api_pb2_grpc as pb_grpc
from services.common.db.inventory import InventoryRepository
from tests.labapi import VersionedApi, versioned_api

CEILING = (1, 84)


@pytest.fixture(scope="module")
async def api(stack: Any) -> AsyncIterator[VersionedApi]:
    async with versioned_api(stack, CEILING) as api:
        yield api


def fault(body: dict[str, Any]) -> str:
    return str(json.loads(body["error_message"])["faultstring"])


async def new_node(api: VersionedApi, name: str, **fields: Any) -> dict[str, Any]:
    _, node = await api.call(
        (1, 78), "POST", "/v1/nodes", {"driver": "fake-hardware", "name": name, **fields}, expect=201
    )
    return node


async def wait_state(api: VersionedApi, ident: str, state: str, timeout: float = 60) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        _, node = await api.call((1, 78), "GET", f"/v1/nodes/{ident}", expect=200)
        if node["provision_state"] == state and node["reservation"] is None:
            return node
        assert time.monotonic() < deadline, f"{ident}: {node['provision_state']} ({node['last_error']})"
        await asyncio.sleep(0.05)


async def available_node(api: VersionedApi, name: str, **fields: Any) -> dict[str, Any]:
    await new_node(api, name, **fields)
    for verb, state in (("manage", "manageable"), ("provide", "available")):
        await api.call((1, 78), "PUT", f"/v1/nodes/{name}/states/provision", {"target": verb}, expect=202)
        await wait_state(api, name, state)
    _, node = await api.call((1, 78), "GET", f"/v1/nodes/{name}", expect=200)
    return node


async def settled(api: VersionedApi, alloc: dict[str, Any], timeout: float = 30) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while alloc["state"] == "allocating":
        assert time.monotonic() < deadline, alloc
        await asyncio.sleep(0.02)
        _, alloc = await api.call((1, 78), "GET", f"/v1/allocations/{alloc['uuid']}", expect=200)
    return alloc


# -- 1.79: an allocation takes the node of its own name first ------------------------------------------


async def test_allocation_takes_the_node_named_as_itself_first_1_79(api: VersionedApi) -> None:
    names = [f"rack-{i}" for i in range(5)]
    nodes = {n: await available_node(api, n, resource_class="rc-179") for n in names}
    # Five candidates in random order: by chance the named one would come first in 1 of 5
    # tries per allocation, so four allocations all landing on their own name is no accident.
    for name in ("rack-3", "rack-0", "rack-4", "rack-1"):
        _, alloc = await api.call(
            (1, 79), "POST", "/v1/allocations", {"resource_class": "rc-179", "name": name}, expect=201
        )
        alloc = await settled(api, alloc)
        assert alloc["state"] == "active" and alloc["node_uuid"] == nodes[name]["uuid"], alloc
    # A name no node has picks any candidate, as before.
    _, alloc = await api.call(
        (1, 79), "POST", "/v1/allocations", {"resource_class": "rc-179", "name": "elsewhere"}, expect=201
    )
    alloc = await settled(api, alloc)
    assert alloc["node_uuid"] == nodes["rack-2"]["uuid"], alloc


async def test_1_80_is_a_signifier_only(api: VersionedApi) -> None:
    # Ironic 1.80 (project-scoped admins may create and delete nodes) changes no request or response.
    _, at_80 = await api.call((1, 80), "GET", "/v1/nodes", expect=200)
    _, at_79 = await api.call((1, 79), "GET", "/v1/nodes", expect=200)
    assert at_80 == at_79
    status, _ = await api.call((1, 80), "POST", "/v1/nodes", {"driver": "fake-hardware", "name": "n-180"})
    assert status == 201
    await api.call((1, 80), "DELETE", "/v1/nodes/n-180", expect=204)


# -- 1.81: node inventory ---------------------------------------------------------------------------


async def test_node_inventory_from_1_81(api: VersionedApi, stack: Any) -> None:
    node = await new_node(api, "inv-181")
    bare = await new_node(api, "inv-181-none")
    service = next(s for s in stack.services if s.name == "api")
    row = await service.pool.fetchrow("SELECT id FROM nodes WHERE uuid = $1::uuid", node["uuid"])
    inventory = {"cpu": {"count": 4}, "interfaces": [{"mac_address": "52:54:00:81:81:01"}]}
    await InventoryRepository(service.pool).save(row["id"], inventory, {"root_disk": {"name": "/dev/vda"}})

    status, body = await api.call((1, 80), "GET", "/v1/nodes/inv-181/inventory")
    assert status == 404 and fault(body) == "The resource could not be found."
    _, got = await api.call((1, 81), "GET", "/v1/nodes/inv-181/inventory", expect=200)
    assert got == {"inventory": inventory, "plugin_data": {"root_disk": {"name": "/dev/vda"}}}
    status, body = await api.call((1, 81), "GET", f"/v1/nodes/{bare['uuid']}/inventory")
    assert status == 404 and fault(body) == f"Node inventory record for node {bare['uuid']} could not be found."


# -- 1.82: shards -----------------------------------------------------------------------------------


async def test_node_shard_field_filters_and_shards_from_1_82(api: VersionedApi) -> None:
    v81, v82 = (1, 81), (1, 82)
    # Below 1.82 the field, the filters and the endpoint do not exist.
    status, body = await api.call(v81, "POST", "/v1/nodes", {"driver": "fake-hardware", "name": "s-old", "shard": "a"})
    assert status == 406, body
    old = await new_node(api, "s-old")
    assert "shard" not in old
    patch = [{"op": "add", "path": "/shard", "value": "a"}]
    status, _ = await api.call(v81, "PATCH", "/v1/nodes/s-old", patch)
    assert status == 406
    for query in ("shard=a", "sharded=true"):
        status, body = await api.call(v81, "GET", f"/v1/nodes?{query}")
        assert status == 406 and fault(body) == (
            "Request not acceptable. The minimal required API version should be 1.82"
        ), body
    status, body = await api.call(v81, "GET", "/v1/ports?shard=a")
    assert status == 406
    status, body = await api.call(v81, "GET", "/v1/nodes?fields=shard")
    assert status == 406
    status, body = await api.call(v81, "GET", "/v1/shards")
    assert status == 404 and fault(body) == "The API version does not allow shards"
    _, root = await api.call(v81, "GET", "/v1/", expect=200)
    assert "shards" not in root

    # At 1.82: set on create and by PATCH, shown, filtered, unset, counted.
    _, a1 = await api.call(
        v82, "POST", "/v1/nodes", {"driver": "fake-hardware", "name": "s-a1", "shard": "sa"}, expect=201
    )
    assert a1["shard"] == "sa"
    _, a2 = await api.call(
        v82, "PATCH", "/v1/nodes/s-old", [{"op": "add", "path": "/shard", "value": "sa"}], expect=200
    )
    assert a2["shard"] == "sa"
    _, b1 = await api.call(
        v82, "POST", "/v1/nodes", {"driver": "fake-hardware", "name": "s-b1", "shard": "sb"}, expect=201
    )
    _, plain = await api.call(v82, "POST", "/v1/nodes", {"driver": "fake-hardware", "name": "s-none"}, expect=201)
    assert plain["shard"] is None
    status, body = await api.call(v82, "PATCH", "/v1/nodes/s-none", [{"op": "add", "path": "/shard", "value": 5}])
    assert status == 400, body
    status, body = await api.call(
        v82, "PATCH", "/v1/nodes/s-none", [{"op": "add", "path": "/shard", "value": "x" * 256}]
    )
    assert status == 400, body

    async def names(query: str) -> set[str]:
        _, listed = await api.call(v82, "GET", f"/v1/nodes?{query}&fields=name,shard", expect=200)
        return {n["name"] for n in listed["nodes"] if n["name"].startswith("s-")}

    assert await names("shard=sa") == {"s-a1", "s-old"}
    assert await names("shard=sa,sb") == {"s-a1", "s-old", "s-b1"}
    assert await names("shard=nowhere") == set()
    assert await names("sharded=true") == {"s-a1", "s-old", "s-b1"}
    assert await names("sharded=false") == {"s-none"}
    assert await names("sharded=true&shard=sb") == {"s-b1"}
    _, one = await api.call(v82, "GET", "/v1/nodes/s-b1?fields=shard", expect=200)
    assert one["shard"] == "sb"

    _, shards = await api.call(v82, "GET", "/v1/shards", expect=200)
    counts = {s["name"]: s["count"] for s in shards["shards"]}
    assert counts["sa"] == 2 and counts["sb"] == 1 and counts["None"] >= 1  # Ironic names the unsharded "None"
    assert [s["count"] for s in shards["shards"]] == sorted(counts.values(), reverse=True)
    _, root = await api.call(v82, "GET", "/v1/", expect=200)
    assert root["shards"][0]["href"].endswith("/v1/shards/")

    # Ports of the nodes in a shard; not together with node or portgroup (Ironic: 403).
    mac = "52:54:00:82:82:01"
    await api.call(v82, "POST", "/v1/ports", {"address": mac, "node_uuid": b1["uuid"]}, expect=201)
    await api.call(v82, "POST", "/v1/ports", {"address": "52:54:00:82:82:02", "node_uuid": a1["uuid"]}, expect=201)
    _, ports = await api.call(v82, "GET", "/v1/ports?shard=sb", expect=200)
    assert [p["address"] for p in ports["ports"]] == [mac]
    _, ports = await api.call(v82, "GET", "/v1/ports/detail?shard=sa,sb", expect=200)
    assert len(ports["ports"]) == 2
    status, _ = await api.call(v82, "GET", f"/v1/ports?shard=sb&node={b1['uuid']}")
    assert status == 403

    _, unset = await api.call(v82, "PATCH", "/v1/nodes/s-b1", [{"op": "remove", "path": "/shard"}], expect=200)
    assert unset["shard"] is None
    assert await names("shard=sb") == set()
    _, shards = await api.call(v82, "GET", "/v1/shards", expect=200)
    assert "sb" not in {s["name"] for s in shards["shards"]}


# -- 1.83: child nodes ------------------------------------------------------------------------------


async def test_child_nodes_from_1_83(api: VersionedApi) -> None:
    v82, v83 = (1, 82), (1, 83)
    parent = await new_node(api, "c-parent")
    # Below 1.83: no field, no filters, no children endpoint.
    body = {"driver": "fake-hardware", "name": "c-early", "parent_node": parent["uuid"]}
    status, _ = await api.call(v82, "POST", "/v1/nodes", body)
    assert status == 406
    early = await new_node(api, "c-early")
    assert "parent_node" not in early
    status, _ = await api.call(
        v82, "PATCH", "/v1/nodes/c-early", [{"op": "add", "path": "/parent_node", "value": "c-parent"}]
    )
    assert status == 406
    for query in ("include_children=true", f"parent_node={parent['uuid']}"):
        status, body = await api.call(v82, "GET", f"/v1/nodes?{query}")
        assert status == 406 and fault(body) == (
            "Request not acceptable. The minimal required API version should be 1.83"
        ), body
    status, body = await api.call(v82, "GET", "/v1/nodes/c-parent/children")
    assert status == 404 and fault(body) == "The resource could not be found."

    # At 1.83: a child by parent UUID on create, by parent name on PATCH; both stored as the UUID.
    _, child = await api.call(
        v83,
        "POST",
        "/v1/nodes",
        {"driver": "fake-hardware", "name": "c-one", "parent_node": parent["uuid"]},
        expect=201,
    )
    assert child["parent_node"] == parent["uuid"]
    _, second = await api.call(
        v83, "PATCH", "/v1/nodes/c-early", [{"op": "add", "path": "/parent_node", "value": "c-parent"}], expect=200
    )
    assert second["parent_node"] == parent["uuid"]
    assert parent.get("parent_node") is None

    # A parent that does not exist, has another owner, or is the node itself: the same 400.
    ghost = str(uuid.uuid4())
    for value in (ghost, "no-such-node"):
        status, body = await api.call(
            v83, "POST", "/v1/nodes", {"driver": "fake-hardware", "name": "c-bad", "parent_node": value}
        )
        assert (
            status == 400
            and fault(body) == f"Unable to apply the requested parent_node '{value}'. Requested value was invalid."
        )
    status, body = await api.call(
        v83, "POST", "/v1/nodes", {"driver": "fake-hardware", "name": "c-bad", "owner": "p1", "parent_node": "c-parent"}
    )
    assert status == 400, body
    status, body = await api.call(
        v83, "PATCH", "/v1/nodes/c-parent", [{"op": "add", "path": "/parent_node", "value": "c-parent"}]
    )
    assert status == 400, body
    status, _ = await api.call(v83, "GET", "/v1/nodes/c-bad")
    assert status == 404

    # The list hides children (at every version); include_children shows them; parent_node lists one node's.
    async def names(version: tuple[int, int], path: str) -> set[str]:
        _, listed = await api.call(version, "GET", path, expect=200)
        return {n["name"] for n in listed["nodes"] if n["name"].startswith("c-")}

    assert await names(v83, "/v1/nodes") == {"c-parent"}
    assert await names(v82, "/v1/nodes/detail") == {"c-parent"}
    assert await names(v83, "/v1/nodes?include_children=True") == {"c-parent", "c-one", "c-early"}
    assert await names(v83, f"/v1/nodes/detail?parent_node={parent['uuid']}") == {"c-one", "c-early"}
    assert await names(v83, f"/v1/nodes?include_children=true&parent_node={child['uuid']}") == {
        "c-parent",
        "c-one",
        "c-early",
    }
    assert await names(v83, "/v1/nodes?parent_node=c-parent") == set()  # the stored UUID, as given
    assert await names(v83, f"/v1/nodes?parent_node={child['uuid']}") == set()
    assert await names(v83, "/v1/nodes?include_children=false") == {"c-parent"}

    _, kids = await api.call(v83, "GET", "/v1/nodes/c-parent/children", expect=200)
    assert sorted(kids["children"]) == sorted([child["uuid"], second["uuid"]])
    assert kids["links"]["rel"] == "children"
    assert kids["links"]["href"].endswith(f"/v1/nodes?parent_node={parent['uuid']}")
    _, none = await api.call(v83, "GET", f"/v1/nodes/{child['uuid']}/children", expect=200)
    assert none["children"] == []
    status, _ = await api.call(v83, "GET", f"/v1/nodes/{ghost}/children")
    assert status == 404

    # A child is still a node of its own; removing the link puts it back in the list.
    _, alone = await api.call(v83, "PATCH", "/v1/nodes/c-one", [{"op": "remove", "path": "/parent_node"}], expect=200)
    assert alone["parent_node"] is None
    assert await names(v83, "/v1/nodes") == {"c-parent", "c-one"}


# -- 1.84: continue_inspection -----------------------------------------------------------------------


async def waiting_for_inspection(api: VersionedApi, stack: Any, name: str, mac: str) -> dict[str, Any]:
    """A node in ``inspect wait`` with one port, put there directly: the endpoint's answers are
    what is tested here; a real in-band inspection runs in tests/integration/test_inspection.py."""
    node = await new_node(api, name)
    await api.call((1, 78), "POST", "/v1/ports", {"address": mac, "node_uuid": node["uuid"]}, expect=201)
    service = next(s for s in stack.services if s.name == "api")
    await service.pool.execute(
        "UPDATE nodes SET provision_state = 'inspect wait', target_provision_state = 'manageable' WHERE uuid = $1::uuid",
        node["uuid"],
    )
    return node


def inventory(*macs: str) -> dict[str, Any]:
    return {"inventory": {"interfaces": [{"mac_address": m} for m in macs], "cpu": {"count": 2}}}


async def test_continue_inspection_from_1_84(api: VersionedApi, stack: Any) -> None:
    v83, v84 = (1, 83), (1, 84)
    mac_a, mac_b, mac_c = "52:54:00:84:00:0a", "52:54:00:84:00:0b", "52:54:00:84:00:0c"
    node_a = await waiting_for_inspection(api, stack, "ci-a", mac_a)
    node_b = await waiting_for_inspection(api, stack, "ci-b", mac_b)
    node_c = await waiting_for_inspection(api, stack, "ci-c", mac_c)

    # Refused between 1.2 and 1.83 (Ironic allows 1.1 for ironic-inspector's ramdisks), and node_uuid below 1.84.
    for version, query in ((v83, ""), ((1, 50), ""), ((1, 1), f"?node_uuid={node_a['uuid']}")):
        status, body = await api.call(version, "POST", f"/v1/continue_inspection{query}", inventory(mac_a))
        assert status == 404 and fault(body) == "API version 1.84 or newer is required", (version, body)
    _, root = await api.call(v83, "GET", "/v1/", expect=200)
    assert "continue_inspection" not in root
    _, root = await api.call(v84, "GET", "/v1/", expect=200)
    assert root["continue_inspection"][0]["href"].endswith("/v1/continue_inspection/")

    # 1.84: found by MAC; the agent token is issued and the reply is lookup's.
    _, reply = await api.call(v84, "POST", "/v1/continue_inspection", inventory(mac_a), expect=202)
    assert reply["node"]["uuid"] == node_a["uuid"] and set(reply["node"]) >= {"properties", "instance_info", "links"}
    token = reply["config"]["agent_token"]
    assert token and token != "******" and reply["config"]["agent_token_required"] is True

    # By node_uuid alone (no known MAC), and node_uuid with MACs of another node: one generic 404.
    _, reply = await api.call(
        v84, "POST", f"/v1/continue_inspection?node_uuid={node_b['uuid']}", inventory("52:54:00:84:00:ff"), expect=202
    )
    assert reply["node"]["uuid"] == node_b["uuid"]
    status, _ = await api.call(v84, "POST", f"/v1/continue_inspection?node_uuid={node_c['uuid']}", inventory(mac_a))
    assert status == 404
    status, body = await api.call(v84, "POST", "/v1/continue_inspection?node_uuid=not-a-uuid", inventory(mac_c))
    assert status == 400, body
    status, _ = await api.call(v84, "POST", f"/v1/continue_inspection?node_uuid={uuid.uuid4()}", inventory(mac_c))
    assert status == 404
    # A node no longer waiting (ci-a went on processing) is not told anything either.
    status, _ = await api.call(v84, "POST", "/v1/continue_inspection", inventory(mac_a))
    assert status == 404

    # A token already issued (the agent looked the node up first) shows masked, as lookup shows it.
    _, looked = await api.call(v84, "GET", f"/v1/lookup?addresses={mac_c}", expect=200)
    assert looked["config"]["agent_token"] not in ("", "******")
    _, reply = await api.call(v84, "POST", "/v1/continue_inspection", inventory(mac_c), expect=202)
    assert reply["node"]["uuid"] == node_c["uuid"] and reply["config"]["agent_token"] == "******"

    # 1.1 keeps ironic-inspector's reply.
    node_d = await waiting_for_inspection(api, stack, "ci-d", "52:54:00:84:00:0d")
    _, reply = await api.call((1, 1), "POST", "/v1/continue_inspection", inventory("52:54:00:84:00:0d"), expect=202)
    assert reply == {"uuid": node_d["uuid"]}


async def test_grpc_patch_resolves_and_checks_parent_node_as_rest(api: VersionedApi, stack: Any) -> None:
    """gRPC PatchNode speaks the newest REST semantics: the same parent_node resolution and refusal."""
    parent = await new_node(api, "g-parent")
    await new_node(api, "g-child")
    channel = grpc.aio.insecure_channel(stack.endpoints["api gRPC"])
    try:
        nodes = pb_grpc.NodeServiceStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            patch = [{"op": "add", "path": "/parent_node", "value": "no-such-node"}]
            await nodes.PatchNode(pb.PatchNodeRequest(ident="g-child", patch_json=json.dumps(patch)))
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "Unable to apply the requested parent_node 'no-such-node'" in (caught.value.details() or "")
        patch = [{"op": "add", "path": "/parent_node", "value": "g-parent"}]
        await nodes.PatchNode(pb.PatchNodeRequest(ident="g-child", patch_json=json.dumps(patch)))
    finally:
        await channel.close()
    _, child = await api.call((1, 83), "GET", "/v1/nodes/g-child", expect=200)
    assert child["parent_node"] == parent["uuid"]
