"""Node lists and GETs reuse rendered documents only while nothing they show has changed.

The list and the GET of one node (services/api/node_documents.py) keep each
node's rendered JSON by row version; a GET with ``Cache-Control: no-cache``
reads the row whole and renders it afresh. So after every kind of change,
at several API versions and with ``fields``, each listed document and each
plain GET must equal that fresh rendering, and a second list must equal
the first.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

import aiohttp
import pytest

from services.api import node_documents
from services.api.node_documents import NodeDocumentCache


@pytest.fixture(scope="module")
def api(stack: Any) -> str:
    return stack.endpoints["api REST (Ironic v1)"]


async def call(
    method: str, url: str, body: Any = None, version: str = "latest", fresh: bool = False
) -> tuple[int, Any]:
    headers = {"X-OpenStack-Ironic-API-Version": version}
    if fresh:
        headers["Cache-Control"] = "no-cache"
    async with aiohttp.ClientSession() as s, s.request(method, url, json=body, headers=headers) as r:
        text = await r.text()
        return r.status, (json.loads(text) if text else None)


async def listed(api: str, query: str, version: str, uuids: list[str]) -> dict[str, dict[str, Any]]:
    status, body = await call("GET", f"{api}/v1/nodes{query}", version=version)
    assert status == 200, body
    return {doc["uuid"]: doc for doc in body["nodes"] if doc["uuid"] in uuids}


async def agree(api: str, uuids: list[str]) -> None:
    """Every list variant and every GET equals the nodes' fresh renderings, twice in a row."""
    fields = "?fields=uuid,name,extra,power_state"
    for version, query, get_query in (
        ("1.1", "/detail", ""),
        ("1.78", "/detail", ""),
        ("latest", "/detail", ""),
        ("1.78", fields, fields),
        ("latest", fields, fields),
    ):
        first = await listed(api, query, version, uuids)
        again = await listed(api, query, version, uuids)
        assert first == again
        assert sorted(first) == sorted(uuids)
        for node in uuids:
            status, own = await call("GET", f"{api}/v1/nodes/{node}{get_query}", version=version, fresh=True)
            assert status == 200, own
            assert first[node] == own, (version, query, node)
            for _ in range(2):  # rendered (or reused from the list), then reused
                status, got = await call("GET", f"{api}/v1/nodes/{node}{get_query}", version=version)
                assert (status, got) == (200, own), (version, query, node)
    plain = await listed(api, "", "latest", uuids)  # the default fields of a plain list
    assert set(plain[uuids[0]]) == {
        "uuid",
        "name",
        "instance_uuid",
        "power_state",
        "provision_state",
        "maintenance",
        "links",
    }


async def test_listed_documents_follow_every_change(api: str) -> None:
    uuids = []
    for n in range(4):
        status, node = await call("POST", f"{api}/v1/nodes", {"driver": "fake-hardware", "name": f"cached-{n}"})
        assert status == 201, node
        uuids.append(node["uuid"])
    await agree(api, uuids)

    first, second, third, fourth = uuids
    status, _ = await call("PATCH", f"{api}/v1/nodes/{first}", [{"op": "add", "path": "/extra/k", "value": "v"}])
    assert status == 200
    status, _ = await call("PUT", f"{api}/v1/nodes/{second}/maintenance", {"reason": "looking"})
    assert status == 202
    status, _ = await call("PUT", f"{api}/v1/nodes/{third}/states/power", {"target": "power on"})
    assert status == 202
    instance = str(uuid.uuid4())
    status, _ = await call(
        "PATCH", f"{api}/v1/nodes/{fourth}", [{"op": "add", "path": "/instance_uuid", "value": instance}]
    )
    assert status == 200
    await wait_unlocked(api, third)
    await agree(api, uuids)
    detail = await listed(api, "/detail", "latest", uuids)
    assert detail[first]["extra"] == {"k": "v"}
    assert detail[second]["maintenance"] is True and detail[second]["maintenance_reason"] == "looking"
    assert detail[third]["power_state"] == "power on"
    assert detail[fourth]["instance_uuid"] == instance

    status, _ = await call("PUT", f"{api}/v1/nodes/{first}/states/provision", {"target": "manage"})
    assert status == 202
    await wait_unlocked(api, first)
    status, _ = await call("DELETE", f"{api}/v1/nodes/{second}")
    assert status == 204
    uuids.remove(second)
    await agree(api, uuids)
    assert (await listed(api, "/detail", "latest", uuids))[first]["provision_state"] == "manageable"


async def test_a_get_follows_each_change_of_its_node(api: str) -> None:
    """A client polling one node: reused bytes while it is unchanged, the new document after a change."""
    status, node = await call("POST", f"{api}/v1/nodes", {"driver": "fake-hardware", "name": "polled"})
    assert status == 201, node
    url = f"{api}/v1/nodes/{node['uuid']}"
    first = [await call("GET", url) for _ in range(3)]
    assert first == [(200, first[0][1])] * 3 and first[0][1]["extra"] == {}
    for value in ("one", "two"):
        status, _ = await call("PATCH", url, [{"op": "add", "path": "/extra/k", "value": value}])
        assert status == 200
        for _ in range(2):
            status, got = await call("GET", url)
            assert status == 200 and got["extra"] == {"k": value}
            assert got == (await call("GET", url, fresh=True))[1]
    assert await call("GET", f"{api}/v1/nodes/polled") == (200, got)  # by name, the same document
    status, body = await call("GET", f"{api}/v1/nodes/polled", version="1.1")  # names count from 1.5
    assert status == 404 and "polled could not be found" in body["error_message"]
    assert (await call("DELETE", url))[0] == 204
    for fresh in (False, True):
        status, body = await call("GET", url, fresh=fresh)
        assert status == 404 and f"{node['uuid']} could not be found" in body["error_message"]


async def wait_unlocked(api: str, node: str) -> None:
    for _ in range(200):
        status, doc = await call("GET", f"{api}/v1/nodes/{node}")
        assert status == 200, doc
        if doc["reservation"] is None and doc["target_power_state"] is None and doc["target_provision_state"] is None:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"node {node} still busy: {doc}")


def test_cache_is_bounded_and_keyed_by_every_input() -> None:
    cache = NodeDocumentCache(2)
    variant = ((1, 78), "http://x", None, True)
    cache.put("a", variant, (1, "c", None), b"A1")
    assert cache.get("a", variant, (1, "c", None)) == b"A1"
    assert cache.get("a", variant, (2, "c", None)) is None  # the row changed
    assert cache.get("a", variant, (1, "other", None)) is None  # another conductor owns it now
    assert cache.get("a", variant, (1, "c", "alloc")) is None  # an allocation appeared
    assert cache.get("a", ((1, 1), "http://x", None, True), (1, "c", None)) is None  # another rendering
    cache.put("b", variant, (1, "c", None), b"B")
    cache.get("a", variant, (1, "c", None))  # a is now the most recent
    cache.put("c", variant, (1, "c", None), b"C")
    assert len(cache) == 2 and cache.get("b", variant, (1, "c", None)) is None
    off = NodeDocumentCache(0)
    off.put("a", variant, (1, "c", None), b"A")
    assert len(off) == 0


def test_a_list_reads_versions_first_only_after_one_that_reused_half() -> None:
    cache = NodeDocumentCache(10)
    variant = ((1, 78), "http://x", None, True)
    assert not cache.expects_reuse(variant)  # the first list reads whole rows
    cache.note_reuse(variant, 2, 4)
    assert cache.expects_reuse(variant)
    cache.note_reuse(variant, 1, 4)
    assert not cache.expects_reuse(variant)
    cache.note_reuse(variant, 0, 0)  # an empty page proves nothing either way: read whole rows
    assert not cache.expects_reuse(variant)


async def test_without_a_cache_every_list_reads_and_renders_whole_rows() -> None:
    rows = [(7, {"id": 1, "uuid": "u1", "instance_uuid": None, "driver": "d", "conductor_group": ""})]
    calls: list[str] = []

    async def whole() -> Any:
        calls.append("whole")
        return rows

    async def unused(*_: Any) -> Any:
        raise AssertionError("a cache of 0 never reads versions first")

    async def no_allocations(_: list[int]) -> dict[int | None, str]:
        return {}

    source = node_documents.ListSource(versions=unused, whole=whole, by_id=unused, allocations=no_allocations)
    cache = NodeDocumentCache(0)
    variant = ((1, 78), "http://x", None, True)
    for _ in range(3):
        parts, uuids = await node_documents.documents(
            cache, variant, source, conductor=lambda _: "c", render=lambda row, owner: f"{row['uuid']}@{owner}".encode()
        )
        assert parts == [b"u1@c"] and uuids == ["u1"]
    assert calls == ["whole"] * 3 and len(cache) == 0


async def test_a_get_of_a_node_the_cache_holds_nothing_of_reads_it_whole_once() -> None:
    """The GET's ``whole=True`` (a node by UUID with no kept document): one read of the
    whole row, and the reuse history the next GETs decide by is left as it was."""
    row = {"id": 1, "uuid": "u1", "instance_uuid": None, "driver": "d", "conductor_group": ""}
    calls: list[str] = []

    async def whole() -> Any:
        calls.append("whole")
        return [(7, row)]

    async def versions() -> Any:
        calls.append("versions")
        return [{**row, "version": 7}]

    async def by_id(_: list[int]) -> Any:
        calls.append("by_id")
        return {1: (7, row)}

    async def no_allocations(_: list[int]) -> dict[int | None, str]:
        return {}

    source = node_documents.ListSource(versions=versions, whole=whole, by_id=by_id, allocations=no_allocations)
    cache = NodeDocumentCache(10)
    variant = ((1, 78), "http://x", None, True)
    cache.note_reuse("GET", 1, 1)  # the last GETs reused their documents

    async def get(whole: bool | None) -> list[bytes]:
        parts, _ = await node_documents.documents(
            cache,
            variant,
            source,
            conductor=lambda _: "c",
            render=lambda r, owner: f"{r['uuid']}@{owner}".encode(),
            kind="GET",
            whole=whole,
        )
        return parts

    assert not cache.holds("u1", variant)
    assert await get(True) == [b"u1@c"] and calls == ["whole"]  # not versions, then the row by id
    assert cache.holds("u1", variant) and cache.expects_reuse("GET")
    assert await get(None) == [b"u1@c"] and calls == ["whole", "versions"]  # then reused by its version
