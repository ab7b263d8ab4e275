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
from collections.abc import AsyncIterator
from typing import Any

import pytest

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
