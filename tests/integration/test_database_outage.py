"""While PostgreSQL is down, nothing answers 500 and nothing is changed: REST
gives 503 with ``Retry-After`` and Ironic's error body (node reads, the agents'
lookup and heartbeat, writes), gRPC gives UNAVAILABLE; once PostgreSQL is
back on the same port every one of them works again without a restart.

The stack runs on its own embedded PostgreSQL, so the shared one is untouched.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import aiohttp
import grpc

from ferrum.v1 import api_pb2, api_pb2_grpc
from services.common.db import migrate
from services.common.db.embedded import EmbeddedPostgres
from services.runtime import ALL_SERVICES_ORDER, RunningStack
from tests.conftest import test_settings

V = {"X-OpenStack-Ironic-API-Version": "1.78"}


async def answer(
    http: aiohttp.ClientSession, method: str, url: str, body: Any = None
) -> tuple[int, dict[str, str], str]:
    async with http.request(method, url, json=body, headers=V) as r:
        return r.status, dict(r.headers), await r.text()


async def test_a_database_outage_gives_503_and_unavailable_then_recovers(tmp_path: Path) -> None:
    pg = EmbeddedPostgres(tmp_path / "pg", fsync=False)
    await asyncio.to_thread(pg.start)
    stack = RunningStack()
    try:
        await asyncio.to_thread(pg.ensure_database, "ferrum")
        url = pg.database_url("ferrum")
        await migrate.upgrade(url)
        await stack.start(test_settings(url, tmp_path / "state"), list(ALL_SERVICES_ORDER))
        api = stack.endpoints["api REST (Ironic v1)"]
        async with aiohttp.ClientSession() as http, grpc.aio.insecure_channel(stack.endpoints["api gRPC"]) as channel:
            status, _, text = await answer(http, "POST", f"{api}/v1/nodes", {"driver": "fake-hardware", "name": "n1"})
            assert status == 201, text
            node = json.loads(text)
            nodes = api_pb2_grpc.NodeServiceStub(channel)

            await asyncio.to_thread(pg.stop)
            calls = [
                ("GET", f"{api}/v1/nodes/n1", None),
                ("GET", f"{api}/v1/nodes", None),
                ("PATCH", f"{api}/v1/nodes/n1", [{"op": "add", "path": "/extra/a", "value": 1}]),
                ("POST", f"{api}/v1/nodes", {"driver": "fake-hardware", "name": "n2"}),
                ("GET", f"{api}/v1/lookup?addresses=52:54:00:00:00:01", None),
                (
                    "POST",
                    f"{api}/v1/heartbeat/{node['uuid']}",
                    {"callback_url": "http://127.0.0.1:9999", "agent_version": "10.0.0", "agent_token": "x"},
                ),
            ]
            for method, where, body in calls:
                status, headers, text = await answer(http, method, where, body)
                assert status == 503, (method, where, status, text)
                assert int(headers["Retry-After"]) >= 1, (method, where)
                fault = json.loads(json.loads(text)["error_message"])
                assert "database is temporarily unavailable" in fault["faultstring"], fault
                assert fault["faultcode"] == "Server"
            try:
                await nodes.GetNode(api_pb2.GetNodeRequest(ident="n1"), timeout=10)
                raise AssertionError("GetNode answered while the database was down")
            except grpc.aio.AioRpcError as exc:
                assert exc.code() == grpc.StatusCode.UNAVAILABLE, (exc.code(), exc.details())
                assert "asyncpg" not in (exc.details() or "")  # no internals leak

            await asyncio.to_thread(pg.start)  # same data dir, same port
            deadline = time.monotonic() + 30
            while True:  # the pools' first queries may still meet connections that died with the server
                status, _, text = await answer(http, "GET", f"{api}/v1/nodes/n1")
                if status == 200:
                    break
                assert status == 503 and time.monotonic() < deadline, (status, text)
                await asyncio.sleep(0.2)
            assert json.loads(text)["extra"] == {}  # the refused PATCH changed nothing
            assert (await answer(http, "GET", f"{api}/v1/nodes/n2"))[0] == 404  # nor did the refused POST
            status, _, text = await answer(http, "POST", f"{api}/v1/nodes", {"driver": "fake-hardware", "name": "n2"})
            assert status == 201, text
            assert (await nodes.GetNode(api_pb2.GetNodeRequest(ident="n1"), timeout=10)).name == "n1"
    finally:
        await stack.close()
        await asyncio.to_thread(pg.stop)
