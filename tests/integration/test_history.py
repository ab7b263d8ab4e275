"""Node history (microversion 1.78) read from ``node_history``.

The advertised maximum is still below 1.78, so clients get 404 (checked on the
live stack). The handlers themselves are exercised through a second real
HTTP server built from the same pool and conductor router with the request
version pinned to 1.78, the way the api will serve them once the maximum
reaches it.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from services.api.context import ApiContext
from services.api.middlewares import error_middleware
from services.api.node_history import DETAIL_FIELDS, STANDARD_FIELDS, NodeHistoryApi
from services.api.routes import ROUTES, add_routes

V = {"X-OpenStack-Ironic-API-Version": "latest"}


@web.middleware
async def pin_1_78(request: web.Request, handler: Any) -> web.StreamResponse:
    request["version"] = (1, 78)
    return await handler(request)


@pytest.fixture(scope="module")
def api(stack: Any) -> str:
    return stack.endpoints["api REST (Ironic v1)"]


@pytest.fixture(scope="module")
async def history_api(stack: Any) -> AsyncIterator[str]:
    service = next(s for s in stack.services if s.name == "api")
    app = web.Application(middlewares=[error_middleware, pin_1_78])
    history_routes = tuple(r for r in ROUTES if r.resource is NodeHistoryApi)
    add_routes(
        app,
        ApiContext(service.pool, service.router, service.settings, internal_token=service.internal_token),
        history_routes,
    )
    server = TestServer(app, host="127.0.0.1", port=0)
    await server.start_server()
    try:
        yield str(server.make_url("")).rstrip("/")
    finally:
        await server.close()


async def call(session: aiohttp.ClientSession, method: str, url: str, body: Any = None) -> tuple[int, Any]:
    async with session.request(method, url, json=body, headers=V) as r:
        text = await r.text()
        return r.status, (json.loads(text) if text else None)


@pytest.fixture(scope="module")
async def node(api: str) -> dict[str, Any]:
    """A node with at least four history entries: created, maintenance on/off, power."""
    async with aiohttp.ClientSession() as s:
        status, node = await call(s, "POST", f"{api}/v1/nodes", {"driver": "fake-hardware", "name": "hist-node"})
        assert status == 201
        assert (await call(s, "PUT", f"{api}/v1/nodes/{node['uuid']}/maintenance", {"reason": "looking"}))[0] == 202
        assert (await call(s, "DELETE", f"{api}/v1/nodes/{node['uuid']}/maintenance"))[0] == 202
        assert (await call(s, "PUT", f"{api}/v1/nodes/{node['uuid']}/states/power", {"target": "power on"}))[0] == 202
        deadline = time.monotonic() + 30
        while True:
            _, current = await call(s, "GET", f"{api}/v1/nodes/{node['uuid']}")
            if current["power_state"] == "power on" and current["reservation"] is None:
                return node
            assert time.monotonic() < deadline, current
            await asyncio.sleep(0.05)


async def test_history_is_404_below_1_78(api: str, node: dict[str, Any]) -> None:
    async with aiohttp.ClientSession() as s:
        for path in (f"/v1/nodes/{node['uuid']}/history", f"/v1/nodes/{node['uuid']}/history/{uuid.uuid4()}"):
            async with s.get(api + path, headers={"X-OpenStack-Ironic-API-Version": "1.77"}) as r:
                assert r.status == 404 and "error_message" in await r.json()


async def test_list_standard_and_detail(history_api: str, node: dict[str, Any]) -> None:
    async with aiohttp.ClientSession() as s:
        status, body = await call(s, "GET", f"{history_api}/v1/nodes/hist-node/history")
        assert status == 200 and "next" not in body
        events = body["history"]
        assert len(events) >= 4
        assert all(set(e) == {*STANDARD_FIELDS, "links"} for e in events)
        texts = [e["event"] for e in events]
        assert texts[0] == "Node created"
        assert "maintenance on: looking" in texts and "maintenance off" in texts
        assert texts.index("maintenance on: looking") < texts.index("maintenance off")
        assert {e["severity"] for e in events} <= {"INFO", "WARNING", "ERROR"}
        first = events[0]
        assert first["links"][0] == {
            "href": f"{history_api}/v1/nodes/{node['uuid']}/history/{first['uuid']}",
            "rel": "self",
        }

        status, detail = await call(s, "GET", f"{history_api}/v1/nodes/{node['uuid']}/history?detail=true")
        assert status == 200
        assert [e["uuid"] for e in detail["history"]] == [e["uuid"] for e in events]
        assert all(set(e) == {*DETAIL_FIELDS, "links"} for e in detail["history"])
        assert detail["history"][0]["conductor"] == "test-conductor"
        assert {e["event_type"] for e in detail["history"]} >= {"provisioning", "maintenance"}


async def test_pagination_with_limit_and_marker(history_api: str, node: dict[str, Any]) -> None:
    async with aiohttp.ClientSession() as s:
        _, everything = await call(s, "GET", f"{history_api}/v1/nodes/{node['uuid']}/history")
        expected = [e["uuid"] for e in everything["history"]]
        seen: list[str] = []
        url = f"{history_api}/v1/nodes/{node['uuid']}/history?limit=2"
        for _ in range(len(expected) + 1):
            status, page = await call(s, "GET", url)
            assert status == 200 and len(page["history"]) <= 2
            seen += [e["uuid"] for e in page["history"]]
            if "next" not in page:
                break
            assert page["next"].endswith(f"marker={page['history'][-1]['uuid']}")
            url = page["next"]
        assert seen == expected


async def test_get_one_event(history_api: str, node: dict[str, Any]) -> None:
    async with aiohttp.ClientSession() as s:
        _, body = await call(s, "GET", f"{history_api}/v1/nodes/{node['uuid']}/history")
        wanted = body["history"][1]
        status, event = await call(s, "GET", f"{history_api}/v1/nodes/{node['uuid']}/history/{wanted['uuid']}")
        assert status == 200
        assert set(event) == {*DETAIL_FIELDS, "links"}
        assert event["uuid"] == wanted["uuid"] and event["event"] == wanted["event"]
        assert event["created_at"] == wanted["created_at"]


async def test_errors(api: str, history_api: str, node: dict[str, Any]) -> None:
    async with aiohttp.ClientSession() as s:
        _, other = await call(s, "POST", f"{api}/v1/nodes", {"driver": "fake-hardware"})
        _, theirs = await call(s, "GET", f"{history_api}/v1/nodes/{other['uuid']}/history")
        foreign = theirs["history"][0]["uuid"]
        base = f"{history_api}/v1/nodes/{node['uuid']}/history"
        cases = [
            (f"{base}/{foreign}", 404),  # another node's event
            (f"{base}/{uuid.uuid4()}", 404),
            (f"{base}/not-a-uuid", 404),
            (f"{base}?marker={uuid.uuid4()}", 404),
            (f"{base}?marker={foreign}", 404),
            (f"{base}?marker=nope", 400),
            (f"{base}?limit=0", 400),
            (f"{base}?limit=x", 400),
            (f"{base}?detail=maybe", 400),
            (f"{history_api}/v1/nodes/{uuid.uuid4()}/history", 404),
        ]
        for url, expected in cases:
            status, body = await call(s, "GET", url)
            assert status == expected, (url, status, body)
            assert json.loads(body["error_message"])["faultcode"] == "Client"
