"""The renderer's own HTTP/1.1 server (services/ipxe/http_server.py) on a real
socket: pipelining order, HEAD, HTTP/1.0, limits, idle close, and the reply
cache that answers boot storms without a database read.

Boot data comes from a counting in-memory reader so each test can tell
whether a request reached the reader; the database path is covered by
test_ipxe_endpoints.py and bench/ipxe.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from services.common.db.bootdata import BootData
from services.common.metrics import ServiceMetrics
from services.ipxe.handlers import ScriptReplies
from services.ipxe.http_server import MAX_TARGET, ScriptHttpServer
from services.ipxe.reader import CachingReader, StaticReader
from services.ipxe.render import ScriptRenderer
from tests.unit.test_ipxe_scenarios import MAC, MAC2, UUID, node, settings

UNKNOWN = "52:54:00:99:99:99"


class CountingReader:
    """StaticReader plus a read count and an optional delay per MAC."""

    def __init__(self, nodes: list[BootData], slow: dict[str, float] | None = None) -> None:
        self._inner = StaticReader(nodes)
        self._slow = slow or {}
        self.reads = 0

    async def read(self, *, mac: str | None = None, uuid: str | None = None) -> BootData | None:
        self.reads += 1
        await asyncio.sleep(self._slow.get(mac or "", 0))
        return await self._inner.read(mac=mac, uuid=uuid)


@dataclass
class Clock:
    now: float = 1000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Server:
    reader: CountingReader
    replies: ScriptReplies
    http: ScriptHttpServer
    port: int
    cache: CachingReader | None
    clock: Clock = field(default_factory=Clock)


async def start(*, cache_ttl: float = 0.0, slow: dict[str, float] | None = None, idle_timeout: float = 75.0) -> Server:
    reader = CountingReader([node("deploying")], slow)
    clock = Clock()
    cache = CachingReader(reader, None, ttl=cache_ttl, clock=clock) if cache_ttl else None
    metrics = ServiceMetrics("ipxe")
    config = settings()
    holder: dict[str, ScriptReplies] = {}
    renderer = ScriptRenderer(cache or reader, config, on_render=lambda r: holder["replies"].counted_render(r))  # noqa: PLW0108 - bound later
    replies = ScriptReplies(renderer, config.ipxe, metrics, cache, clock=clock)
    holder["replies"] = replies
    http = ScriptHttpServer(replies, metrics, idle_timeout=idle_timeout)
    port = await http.start("127.0.0.1", 0)
    replies.bound_port = port
    return Server(reader, replies, http, port, cache, clock)


@pytest.fixture
async def server() -> AsyncIterator[Server]:
    running = await start(slow={MAC: 0.2})
    yield running
    await running.http.stop()


async def read_response(reader: asyncio.StreamReader, *, head: bool = False) -> tuple[int, dict[str, str], bytes]:
    status_line = await asyncio.wait_for(reader.readline(), 5)
    assert status_line.startswith(b"HTTP/1.1 "), status_line
    headers: dict[str, str] = {}
    while (line := await asyncio.wait_for(reader.readline(), 5)) != b"\r\n":
        name, _, value = line.decode().partition(":")
        headers[name.strip().lower()] = value.strip()
    length = 0 if head else int(headers["content-length"])
    body = await asyncio.wait_for(reader.readexactly(length), 5)
    return int(status_line.split()[1]), headers, body


async def exchange(
    port: int, raw: bytes, count: int = 1, *, head: bool = False
) -> tuple[list[tuple[int, dict[str, str], bytes]], bytes]:
    """Send raw bytes, read ``count`` responses, then whatever else comes before EOF (or 0.3 s)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(raw)
        await writer.drain()
        responses = [await read_response(reader, head=head) for _ in range(count)]
        try:
            rest = await asyncio.wait_for(reader.read(), 0.3)
        except TimeoutError:
            rest = b"<open>"
        return responses, rest
    finally:
        writer.close()


def get(target: str, *extra: str, method: str = "GET", version: str = "1.1") -> bytes:
    lines = [f"{method} {target} HTTP/{version}", "Host: boot.example:8080", *extra, "", ""]
    return "\r\n".join(lines).encode()


async def test_pipelined_requests_are_answered_in_order(server: Server) -> None:
    """The first request waits 0.2 s for its data; the two after it must not overtake it."""
    raw = get(f"/ipxe?mac={MAC}") + get("/boot.ipxe") + get(f"/ipxe?mac={UNKNOWN}") + get("/nowhere")
    responses, rest = await exchange(server.port, raw, 4)
    kinds = [(status, headers.get("x-ferrum-boot-kind")) for status, headers, _ in responses]
    assert kinds == [(200, "deploy"), (200, "boot"), (200, "error"), (404, None)]
    assert f"BOOTIF=01-{MAC.replace(':', '-')}".encode() in responses[0][2]
    assert b"http://boot.example:8080/ipxe?mac=" in responses[1][2]
    assert rest == b"<open>"  # keep-alive: the connection stays open
    for _, headers, body in responses:
        assert headers["cache-control"] == "no-store" and headers["content-type"].startswith("text/plain")
        assert headers["date"].endswith("GMT") and int(headers["content-length"]) == len(body)


async def test_head_http10_close_and_methods(server: Server) -> None:
    (full,), _ = await exchange(server.port, get(f"/ipxe?mac={MAC2}"))
    (head,), rest = await exchange(server.port, get(f"/ipxe?mac={MAC2}", method="HEAD"), head=True)
    assert head[0] == 200 and head[1]["content-length"] == str(len(full[2])) and rest == b"<open>"
    (old,), rest = await exchange(server.port, get("/boot.ipxe", version="1.0"))
    assert old[0] == 200 and old[1]["connection"] == "close" and rest == b""
    (closing,), rest = await exchange(server.port, get("/boot.ipxe", "Connection: close"))
    assert closing[0] == 200 and rest == b""
    (post,), _ = await exchange(server.port, get("/ipxe?mac=x", "Content-Length: 0", method="POST"))
    assert post[0] == 405 and post[1]["allow"] == "GET, HEAD"
    # An Upgrade is not spoken: the request gets its one reply, then the connection closes.
    (upgraded,), rest = await exchange(server.port, get("/boot.ipxe", "Connection: Upgrade", "Upgrade: websocket"))
    assert upgraded[0] == 200 and rest == b""
    (slow,), rest = await exchange(server.port, get(f"/ipxe?mac={MAC}", "Connection: Upgrade", "Upgrade: h2c"))
    assert slow[0] == 200 and slow[1]["x-ferrum-boot-kind"] == "deploy" and rest == b""


@pytest.mark.parametrize(
    ("raw", "status"),
    [
        (b"NOT HTTP AT ALL\r\n\r\n", 400),
        (get("/ipxe?mac=" + "a" * MAX_TARGET), 414),
        (get("/boot.ipxe", *[f"X-Filler-{i}: {'v' * 1000}" for i in range(40)]), 431),
    ],
)
async def test_bad_requests_are_refused_and_closed(server: Server, raw: bytes, status: int) -> None:
    (response,), rest = await exchange(server.port, raw)
    assert response[0] == status and response[1]["connection"] == "close" and rest == b""
    # The server is still fine for everybody else.
    (ok,), _ = await exchange(server.port, get("/boot.ipxe"))
    assert ok[0] == 200


async def test_bad_query_is_a_400_script(server: Server) -> None:
    for target in ("/ipxe", "/ipxe?mac=", f"/ipxe?mac={MAC}&uuid={UUID}", "/ipxe?uuid=x%0Agoto%20y"):
        (response,), _ = await exchange(server.port, get(target))
        assert response[0] == 400 and response[1]["x-ferrum-boot-kind"] == "error", target
        assert response[2].startswith(b"#!ipxe\n") and b"\ngoto" not in response[2]
    (encoded,), _ = await exchange(server.port, get(f"/ipxe?uuid={UUID.upper()}&x=1"))
    assert encoded[0] == 200 and encoded[1]["x-ferrum-boot-kind"] == "deploy"


async def test_idle_connections_are_closed() -> None:
    running = await start(idle_timeout=0.5)
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", running.port)
        assert await asyncio.wait_for(reader.read(), 5) == b""  # closed by the server within ~1.5 s
        writer.close()
        assert not running.http.connections
    finally:
        await running.http.stop()


async def test_reply_cache_skips_the_reader_until_invalidated_or_expired() -> None:
    running = await start(cache_ttl=30.0)
    assert running.cache is not None
    try:
        target = get(f"/ipxe?mac={MAC}")
        (first,), _ = await exchange(running.port, target)
        reads = running.reader.reads
        responses, _ = await exchange(running.port, target * 5, 5)
        assert running.reader.reads == reads and {r[2] for r in responses} == {first[2]}
        running.cache.evict("00000000-0000-0000-0000-000000000000")  # another node changed: still cached
        await exchange(running.port, target)
        assert running.reader.reads == reads
        running.cache.evict(UUID)  # what a ferrum_boot_data notification for this node does
        await exchange(running.port, target)
        assert running.reader.reads == reads + 1
        running.clock.now += 31  # past the TTL
        await exchange(running.port, target)
        assert running.reader.reads == reads + 2
        # Error scripts are never kept: each unknown MAC is read (and logged) every time.
        await exchange(running.port, get(f"/ipxe?mac={UNKNOWN}") * 2, 2)
        running.cache.invalidate()
        await exchange(running.port, get(f"/ipxe?mac={UNKNOWN}"))
        assert running.reader.reads == reads + 4  # the first two: one read, then the reader's own cache
    finally:
        await running.http.stop()


async def test_metrics_count_cached_and_rendered_replies() -> None:
    running = await start(cache_ttl=30.0)
    try:
        await exchange(running.port, get(f"/ipxe?mac={MAC}") * 3, 3)
        (metrics,), _ = await exchange(running.port, get("/metrics"))
        text = metrics[2].decode()
        assert 'ferrum_ipxe_scripts_total{kind="deploy"} 3.0' in text
        assert 'ferrum_requests_total{code="200",method="GET /ipxe",protocol="http",service="ipxe"} 3.0' in text
    finally:
        await running.http.stop()


async def test_stop_closes_open_connections(server: Server) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    writer.write(get(f"/ipxe?mac={MAC}"))  # a slow render in flight
    await writer.drain()
    await asyncio.sleep(0.05)
    await server.http.stop()
    data: Any = await asyncio.wait_for(reader.read(), 5)
    assert data == b"" and not server.http.connections
    writer.close()


async def test_a_full_reply_cache_starts_over() -> None:
    running = await start(cache_ttl=30.0)
    assert running.cache is not None
    running.cache._max = 1  # FERRUM_IPXE_CACHE_MAX_ENTRIES=1
    try:
        await exchange(running.port, get(f"/ipxe?mac={MAC}"))
        await exchange(running.port, get(f"/ipxe?mac={MAC2}"))
        assert list(running.replies._kept) == [f"/ipxe?mac={MAC2}".encode()]
    finally:
        await running.http.stop()
