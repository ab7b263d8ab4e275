"""bench/raw_http.py, the benchmark's raw-HTTP client, against a real aiohttp server.

The api benchmark's latencies and rates are only as true as this client: it
must read whole answers in either framing, reuse connections as a keep-alive
client does, and survive a server that closes an idle one.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from raw_http import HttpClient


class Server:
    def __init__(self) -> None:
        self.peers: list[int] = []  # the client port of each request
        self.bodies: list[bytes] = []
        self.base = ""
        self.runner: web.AppRunner | None = None

    async def start(self, keepalive_timeout: float = 75.0) -> None:
        app = web.Application()
        app.router.add_get("/v1/small", self.small)
        app.router.add_get("/v1/chunked", self.chunked)
        app.router.add_post("/v1/echo", self.echo)
        app.router.add_get("/v1/close", self.close)
        self.runner = web.AppRunner(app, access_log=None, keepalive_timeout=keepalive_timeout)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.base = f"http://127.0.0.1:{port}/v1"

    def _seen(self, request: web.Request) -> None:
        assert request.transport is not None
        self.peers.append(request.transport.get_extra_info("peername")[1])

    async def small(self, request: web.Request) -> web.Response:
        self._seen(request)
        return web.json_response({"path": request.path, "version": request.headers.get("X-Version")})

    async def chunked(self, request: web.Request) -> web.StreamResponse:
        self._seen(request)
        response = web.StreamResponse()
        response.enable_chunked_encoding()
        await response.prepare(request)
        for index in range(50):
            await response.write(b"%05d," % index * 200)
        await response.write_eof()
        return response

    async def echo(self, request: web.Request) -> web.Response:
        self._seen(request)
        body = await request.read()
        self.bodies.append(body)
        return web.Response(status=201, body=body[::-1])

    async def close(self, request: web.Request) -> web.Response:
        self._seen(request)
        return web.Response(text="bye", headers={"Connection": "close"})


@pytest.fixture
async def server() -> AsyncIterator[Server]:
    serving = Server()
    await serving.start()
    yield serving
    assert serving.runner is not None
    await serving.runner.cleanup()


async def test_answers_are_read_whole_and_one_connection_is_kept_alive(server: Server) -> None:
    async with HttpClient(server.base) as http:
        for _ in range(3):
            status, body = await http.request("GET", "/small", headers={"X-Version": "1.78"})
            assert status == 200
            assert body == b'{"path": "/v1/small", "version": "1.78"}'
        status, body = await http.request("GET", "/chunked")
        assert status == 200
        assert body == b"".join(b"%05d," % index * 200 for index in range(50))
        status, body = await http.request("POST", "/echo", b'{"driver": "fake-hardware"}')
        assert (status, body) == (201, b'}"erawdrah-ekaf" :"revird"{')
        status, _ = await http.request("GET", "/missing")
        assert status == 404
    assert server.bodies == [b'{"driver": "fake-hardware"}']
    assert len(set(server.peers)) == 1, server.peers


async def test_concurrent_requests_each_get_a_connection(server: Server) -> None:
    async with HttpClient(server.base) as http:
        answers = await asyncio.gather(*(http.request("POST", "/echo", b"%d" % n) for n in range(8)))
    assert sorted(body for _, body in answers) == sorted(b"%d" % n for n in range(8))
    assert len(set(server.peers)) == 8


async def test_a_connection_the_server_closes_is_not_reused() -> None:
    serving = Server()
    await serving.start(keepalive_timeout=0.2)
    try:
        async with HttpClient(serving.base) as http:
            assert (await http.request("GET", "/close"))[0] == 200
            assert (await http.request("GET", "/small"))[0] == 200
            await asyncio.sleep(0.6)  # the server drops the idle keep-alive connection
            assert (await http.request("GET", "/small"))[0] == 200
        assert len(set(serving.peers)) == 3, serving.peers
    finally:
        assert serving.runner is not None
        await serving.runner.cleanup()


def test_only_plain_http_urls_are_taken() -> None:
    with pytest.raises(ValueError, match="only http://host:port"):
        HttpClient("https://127.0.0.1:6385")
