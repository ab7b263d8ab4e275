"""``next`` links keep the list's filters, URL-encoded, on a live stack.

Volume records and a port group's ports used to build ``next`` from
``limit`` and ``marker`` alone, so the second page of a filtered or
descending list was a page of a different list; the other lists carried
their filters unencoded, so a value with ``&`` or a space changed the query.
Each test here walks a filtered list page by page through ``next`` alone and
checks that the pages add up to the same list read in one request.
"""

from __future__ import annotations

import json
import uuid
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import aiohttp
import pytest

LATEST = {"X-OpenStack-Ironic-API-Version": "latest"}
MAX_PAGES = 20


@pytest.fixture(scope="module")
def api(stack: Any) -> str:
    return stack.endpoints["api REST (Ironic v1)"]


async def call(method: str, url: str, body: Any = None) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as s, s.request(method, url, json=body, headers=LATEST) as r:
        text = await r.text()
        return r.status, (json.loads(text) if text else None)


async def create(api: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
    status, doc = await call("POST", api + path, body)
    assert status == 201, (path, doc)
    return doc


async def walk(url: str, key: str) -> tuple[list[dict[str, Any]], list[str]]:
    """Every item of a list, following ``next`` until it stops; and the ``next`` URLs seen."""
    items: list[dict[str, Any]] = []
    links: list[str] = []
    for _ in range(MAX_PAGES):
        status, page = await call("GET", url)
        assert status == 200, (url, page)
        items += page[key]
        if "next" not in page:
            return items, links
        url = page["next"]
        links.append(url)
    raise AssertionError(f"more than {MAX_PAGES} pages from {url}")


def query_of(url: str) -> list[tuple[str, str]]:
    return parse_qsl(urlsplit(url).query, keep_blank_values=True)


async def test_volume_connector_pages_keep_node_order_and_fields(api: str) -> None:
    mine = await create(api, "/v1/nodes", {"driver": "fake-hardware", "name": "next-vol-a"})
    other = await create(api, "/v1/nodes", {"driver": "fake-hardware", "name": "next-vol-b"})
    expected = []
    for i in range(5):
        row = await create(
            api,
            "/v1/volume/connectors",
            {"node_uuid": mine["uuid"], "type": "iqn", "connector_id": f"iqn.2026-01.org.example:next-{i}"},
        )
        expected.append(row["uuid"])
        await create(
            api,
            "/v1/volume/connectors",
            {"node_uuid": other["uuid"], "type": "iqn", "connector_id": f"iqn.2026-01.org.example:other-{i}"},
        )
    expected.reverse()  # sort_dir=desc
    filters = [("node", "next-vol-a"), ("sort_dir", "desc"), ("fields", "uuid,connector_id")]
    first = f"{api}/v1/volume/connectors?node=next-vol-a&sort_dir=desc&fields=uuid,connector_id&limit=2"

    items, links = await walk(first, "connectors")

    assert [c["uuid"] for c in items] == expected
    assert all(set(c) == {"uuid", "connector_id", "links"} for c in items)
    assert len(links) == 2
    for link, last in zip(links, (expected[1], expected[3]), strict=True):
        assert urlsplit(link).path == "/v1/volume/connectors"
        assert "fields=uuid%2Cconnector_id" in link  # encoded, not a bare comma
        assert query_of(link) == [*filters, ("limit", "2"), ("marker", last)]


async def test_volume_targets_of_a_node_page_in_the_requested_order(api: str) -> None:
    node = await create(api, "/v1/nodes", {"driver": "fake-hardware", "name": "next-vol-t"})
    expected = [
        (
            await create(
                api,
                "/v1/volume/targets",
                {"node_uuid": node["uuid"], "volume_type": "iscsi", "boot_index": i, "volume_id": f"vol-{i}"},
            )
        )["uuid"]
        for i in range(3)
    ]
    items, links = await walk(f"{api}/v1/nodes/next-vol-t/volume/targets?sort_dir=desc&limit=1", "targets")
    assert [t["uuid"] for t in items] == expected[::-1]
    # Three full pages of one, so three links; the third leads to the empty page that ends the list.
    assert [urlsplit(link).path for link in links] == ["/v1/nodes/next-vol-t/volume/targets"] * 3
    assert all(dict(query_of(link))["sort_dir"] == "desc" for link in links)


async def test_portgroup_port_pages_keep_sort_and_fields(api: str) -> None:
    node = await create(api, "/v1/nodes", {"driver": "fake-hardware", "name": "next-pg"})
    group = await create(
        api, "/v1/portgroups", {"node_uuid": node["uuid"], "name": "next-bond", "address": "52:54:00:ee:00:00"}
    )
    ports = [
        await create(
            api,
            "/v1/ports",
            {"node_uuid": node["uuid"], "address": f"52:54:00:ee:00:{i:02x}", "portgroup_uuid": group["uuid"]},
        )
        for i in range(1, 6)
    ]
    expected = sorted((p["address"], p["uuid"]) for p in ports)[::-1]
    first = f"{api}/v1/portgroups/next-bond/ports?sort_key=address&sort_dir=desc&fields=uuid,address&limit=2"

    items, links = await walk(first, "ports")

    assert [(p["address"], p["uuid"]) for p in items] == expected
    assert all(set(p) == {"uuid", "address", "links"} for p in items)
    assert [urlsplit(link).path for link in links] == ["/v1/portgroups/next-bond/ports"] * 2
    assert query_of(links[0]) == [
        ("sort_key", "address"),
        ("sort_dir", "desc"),
        ("fields", "uuid,address"),
        ("limit", "2"),
        ("marker", expected[1][1]),
    ]


async def test_portgroup_pages_of_a_node_keep_their_filters(api: str) -> None:
    node = await create(api, "/v1/nodes", {"driver": "fake-hardware", "name": "next-pg-list"})
    other = await create(api, "/v1/nodes", {"driver": "fake-hardware", "name": "next-pg-other"})
    names = [f"next-g{i}" for i in range(4)]
    for i, name in enumerate(names):
        await create(
            api, "/v1/portgroups", {"node_uuid": node["uuid"], "name": name, "address": f"52:54:00:ef:00:{i:02x}"}
        )
        await create(
            api,
            "/v1/portgroups",
            {"node_uuid": other["uuid"], "name": f"x{name}", "address": f"52:54:00:ef:01:{i:02x}"},
        )
    first = f"{api}/v1/portgroups?node=next-pg-list&sort_key=name&sort_dir=desc&fields=name&limit=3"
    items, links = await walk(first, "portgroups")
    assert [g["name"] for g in items] == names[::-1]
    assert len(links) == 1 and dict(query_of(links[0]))["node"] == "next-pg-list"


async def test_a_filter_value_with_reserved_characters_survives_the_next_link(api: str) -> None:
    owner = "team a&b=c/d?e"  # a space, &, =, / and ? must all be encoded
    made = [
        await create(api, "/v1/nodes", {"driver": "fake-hardware", "name": f"next-owned-{i}", "owner": owner})
        for i in range(3)
    ]
    await create(api, "/v1/nodes", {"driver": "fake-hardware", "name": "next-owned-other", "owner": "team a"})
    async with (
        aiohttp.ClientSession() as s,
        s.get(f"{api}/v1/nodes", params={"owner": owner, "limit": "2"}, headers=LATEST) as r,
    ):
        assert r.status == 200
        page = await r.json()
    assert [n["uuid"] for n in page["nodes"]] == [n["uuid"] for n in made[:2]]
    link = page["next"]
    assert "owner=team%20a%26b%3Dc%2Fd%3Fe" in link
    assert query_of(link) == [("owner", owner), ("limit", "2"), ("marker", made[1]["uuid"])]
    status, rest = await call("GET", link)
    assert status == 200 and [n["uuid"] for n in rest["nodes"]] == [made[2]["uuid"]] and "next" not in rest


async def test_the_last_full_page_links_to_an_empty_page_and_no_further(api: str) -> None:
    """A full last page still gets ``next`` (Ironic cannot know there is no more without
    reading one more row); following it gives an empty page without ``next``."""
    node = await create(api, "/v1/nodes", {"driver": "fake-hardware", "name": f"next-end-{uuid.uuid4().hex[:6]}"})
    for i in range(2):
        await create(
            api,
            "/v1/volume/connectors",
            {
                "node_uuid": node["uuid"],
                "type": "iqn",
                "connector_id": f"iqn.2026-01.org.example:end-{node['name']}-{i}",
            },
        )
    status, page = await call("GET", f"{api}/v1/volume/connectors?node={node['uuid']}&limit=2")
    assert status == 200 and len(page["connectors"]) == 2 and "next" in page
    status, rest = await call("GET", page["next"])
    assert status == 200 and rest == {"connectors": []}
