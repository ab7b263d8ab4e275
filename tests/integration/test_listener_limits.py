"""Bounded connections on every kind of HTTP listener (issue 16, item 4):
aiohttp behind ``start_http_site`` (api, agent, simulator, conductor
metrics), the renderer's own server, and the object store's front door.

Each test holds hundreds of connections that trickle a request head, checks
that a normal client is still served in under a second, fills the listener
to its cap and sees the connections beyond it refused with a 503 at once,
with one log line and no traceback, and sees the slow ones dropped after the
header deadline, not before. A subprocess runs out of file descriptors to
show that the accept loop no longer logs a traceback per attempt.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from aiohttp import web

from services.agent.agent import Agent, AgentOptions, Disk
from services.common.aiohttp_serving import GuardedSite, start_http_site
from services.common.connection_guard import ConnectionGuard, ListenerLimits
from services.common.metrics import ServiceMetrics
from services.ipxe.handlers import ScriptReplies
from services.ipxe.http_server import ScriptHttpServer
from services.ipxe.reader import StaticReader
from services.ipxe.render import ScriptRenderer
from services.objectstore.testing import running_objectstore, wait_until
from services.simulator import Simulator, SimulatorOptions
from tests.conftest import test_settings
from tests.unit.test_ipxe_scenarios import node, settings

CAP = 300
SLOW = 250  # connections trickling a head: "hundreds", below the cap
OVER = 20  # connections beyond the cap
HEADER_TIMEOUT = 4.0  # long enough to fill the cap before the first slow connection is dropped
REPO = Path(__file__).resolve().parents[2]


@dataclass
class Listener:
    port: int
    guard: ConnectionGuard
    normal_path: str  # a GET that answers 200
    slow_head: bytes  # the start of a request head, never finished


async def get_status(port: int, path: str) -> tuple[int, float]:
    """One request on a new connection: its status and how long it took."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n".encode())
        raw = await asyncio.wait_for(reader.read(), 5)
    finally:
        writer.close()
    return int(raw.split(b" ", 2)[1]), loop.time() - started


async def closed_after(reader: asyncio.StreamReader, opened: float) -> float:
    """Seconds from ``opened`` until the server closed the connection (EOF or reset)."""
    with contextlib.suppress(ConnectionError):
        while await reader.read(65536):
            pass
    return asyncio.get_running_loop().time() - opened


async def trickle(writers: list[asyncio.StreamWriter]) -> None:
    """A header line on every slow connection every 0.3 s: bytes keep coming, the head never ends."""
    while True:
        await asyncio.sleep(0.3)
        for writer in writers:
            if not writer.is_closing():
                with contextlib.suppress(ConnectionError, RuntimeError):
                    writer.write(b"X-Slow: 1\r\n")


async def check_bounds(listener: Listener, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    loop = asyncio.get_running_loop()
    guard, port = listener.guard, listener.port

    slow = []
    for _ in range(SLOW):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(listener.slow_head)
        slow.append((reader, writer, loop.time()))
    await wait_until(lambda: guard.live == SLOW, timeout=5)
    writers = [w for _, w, _ in slow]
    trickler = asyncio.create_task(trickle(writers))
    closings = [asyncio.create_task(closed_after(r, opened)) for r, _, opened in slow]
    fillers: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
    try:
        for _ in range(3):  # a normal client is served at once, next to the slow ones
            status, seconds = await get_status(port, listener.normal_path)
            assert status == 200 and seconds < 1.0, (status, seconds)
        await wait_until(lambda: guard.live == SLOW, timeout=5)

        for _ in range(CAP - SLOW):
            fillers.append(await asyncio.open_connection("127.0.0.1", port))
        await wait_until(lambda: guard.live == CAP, timeout=5)
        for _ in range(OVER):  # beyond the cap: a 503 at once, then the close
            started = loop.time()
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            raw = await asyncio.wait_for(reader.read(), 1.0)
            writer.close()
            assert raw.startswith(b"HTTP/1.1 503 ") and b"Retry-After: 1" in raw, raw
            assert loop.time() - started < 1.0
        assert guard.live == CAP
        assert not any(task.done() for task in closings), "a slow connection was dropped before its deadline"

        lifetimes = await asyncio.wait_for(asyncio.gather(*closings), HEADER_TIMEOUT + 10)
        assert min(lifetimes) >= HEADER_TIMEOUT - 0.3 and max(lifetimes) <= HEADER_TIMEOUT + 2.5, lifetimes
        await wait_until(lambda: guard.live == 0, timeout=HEADER_TIMEOUT + 5)  # the silent fillers too
        status, seconds = await get_status(port, listener.normal_path)
        assert status == 200 and seconds < 1.0
    finally:
        trickler.cancel()
        for _, writer, _ in slow:
            writer.close()
        for _, writer in fillers:
            writer.close()

    messages = [record.getMessage() for record in caplog.records]
    refused = [m for m in messages if m.startswith("connections refused")]
    assert len(refused) == 1 and "count=1 " in refused[0] and f"max_connections={CAP}" in refused[0], refused
    dropped = [m for m in messages if m.startswith("connections dropped")]
    assert len(dropped) == 1 and f"header_timeout={HEADER_TIMEOUT:g}s" in dropped[0], dropped
    assert guard.refusals.total == OVER and guard.timeouts.total == CAP
    assert not [record for record in caplog.records if record.exc_info], "a traceback was logged"


LIMITS = ListenerLimits(max_connections=CAP, header_timeout=HEADER_TIMEOUT)


async def test_aiohttp_site_bounds_slow_and_surplus_connections(caplog: pytest.LogCaptureFixture) -> None:
    async def hello(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_get("/", hello)
    runner, port = await start_http_site(app, "127.0.0.1", 0, listener="test", limits=LIMITS)
    try:
        site = next(iter(runner.sites))
        assert isinstance(site, GuardedSite)
        await check_bounds(Listener(port, site.guard, "/", b"GET / HTTP/1.1\r\nHost: x\r\n"), caplog)
    finally:
        await runner.cleanup()


async def test_aiohttp_keep_alive_connection_trickling_its_next_head_is_dropped() -> None:
    """The deadline covers every head on a connection, not just the first."""

    async def hello(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_get("/", hello)
    limits = ListenerLimits(max_connections=10, header_timeout=1.0)
    runner, port = await start_http_site(app, "127.0.0.1", 0, limits=limits)
    loop = asyncio.get_running_loop()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        assert (await asyncio.wait_for(reader.readuntil(b"ok"), 5)).startswith(b"HTTP/1.1 200")
        await asyncio.sleep(1.5)  # idle between requests is not a slow head: still open
        writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        assert (await asyncio.wait_for(reader.readuntil(b"ok"), 5)).startswith(b"HTTP/1.1 200")
        writer.write(b"GET / HTTP/1.1\r\n")
        started = loop.time()
        trickler = asyncio.create_task(trickle([writer]))
        try:
            lifetime = await asyncio.wait_for(closed_after(reader, started), 5)
        finally:
            trickler.cancel()
        assert 0.8 <= lifetime <= 3.0, lifetime
        writer.close()
    finally:
        await runner.cleanup()


async def test_ipxe_server_bounds_slow_and_surplus_connections(caplog: pytest.LogCaptureFixture) -> None:
    config = settings()
    metrics = ServiceMetrics("ipxe")
    holder: dict[str, ScriptReplies] = {}
    renderer = ScriptRenderer(
        StaticReader([node("deploying")]),
        config,
        on_render=lambda r: holder["replies"].counted_render(r),  # noqa: PLW0108 - replies is made on the next line
    )
    replies = holder["replies"] = ScriptReplies(renderer, config.ipxe, metrics, None)
    http = ScriptHttpServer(replies, metrics, limits=LIMITS)
    port = await http.start("127.0.0.1", 0)
    replies.bound_port = port
    try:
        await check_bounds(Listener(port, http.guard, "/boot.ipxe", b"GET /boot.ipxe HTTP/1.1\r\n"), caplog)
    finally:
        await http.stop()


@pytest.fixture
async def objectstore(database_url: str, tmp_path: Path) -> AsyncIterator[object]:
    limits = {"http_max_connections": CAP, "http_header_timeout": HEADER_TIMEOUT}
    config = test_settings(database_url, tmp_path / "state", objectstore={"root": str(tmp_path / "o"), **limits})
    async with running_objectstore(config) as service:
        yield service


async def test_objectstore_front_door_bounds_slow_and_surplus_connections(
    objectstore: object, caplog: pytest.LogCaptureFixture
) -> None:
    guard = objectstore.http_guard  # type: ignore[attr-defined]
    port = int(objectstore.http_url.rsplit(":", 1)[1])  # type: ignore[attr-defined]
    assert guard.limits == LIMITS  # from FERRUM_OBJECTSTORE_HTTP_MAX_CONNECTIONS / _HTTP_HEADER_TIMEOUT
    await check_bounds(Listener(port, guard, "/metrics", b"PUT /u/x/c/o HTTP/1.1\r\nHost: x\r\n"), caplog)


async def test_objectstore_connection_handed_to_aiohttp_stays_bounded(objectstore: object) -> None:
    """A GET goes to aiohttp; the connection stays counted, and its next head has a deadline."""
    guard = objectstore.http_guard  # type: ignore[attr-defined]
    port = int(objectstore.http_url.rsplit(":", 1)[1])  # type: ignore[attr-defined]
    loop = asyncio.get_running_loop()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
    assert (await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)).startswith(b"HTTP/1.1 200")
    assert guard.live == 1
    writer.write(b"GET /metrics HTTP/1.1\r\n")
    started = loop.time()
    lifetime = await asyncio.wait_for(closed_after(reader, started), HEADER_TIMEOUT + 5)
    assert HEADER_TIMEOUT - 0.3 <= lifetime <= HEADER_TIMEOUT + 2.5, lifetime
    writer.close()
    await wait_until(lambda: guard.live == 0, timeout=5)


async def refused_beyond(port: int, cap: int) -> tuple[bytes, float]:
    """Hold ``cap`` silent connections, then open one more: its answer, and when the first was dropped."""
    loop = asyncio.get_running_loop()
    held = [await asyncio.open_connection("127.0.0.1", port) for _ in range(cap)]
    opened = loop.time()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        answer = await asyncio.wait_for(reader.read(), 1.0)
        lifetime = await asyncio.wait_for(closed_after(held[0][0], opened), 10)
        return answer, lifetime
    finally:
        writer.close()
        for _, held_writer in held:
            held_writer.close()


@pytest.mark.parametrize("kind", ["agent", "simulator"])
async def test_agent_and_simulator_take_their_limits_as_options(kind: str, tmp_path: Path) -> None:
    service: Agent | Simulator
    if kind == "agent":
        disk = tmp_path / "disk.img"
        disk.write_bytes(b"\0" * 1024 * 1024)
        service = Agent(
            AgentOptions(
                api_url="http://127.0.0.1:9",  # nothing answers: lookups fail quietly in the background
                macs=("52:54:00:00:00:01",),
                disks=(Disk(str(disk)),),
                lookup_interval=5.0,
                max_connections=3,
                header_timeout=1.0,
            )
        )
    else:
        service = Simulator(
            SimulatorOptions(machines=1, state_dir=str(tmp_path), max_connections=3, header_timeout=1.0)
        )
    await service.start()
    try:
        port = service.port
        answer, lifetime = await refused_beyond(port, 3)
        assert answer.startswith(b"HTTP/1.1 503 "), answer
        assert 0.7 <= lifetime <= 3.0, lifetime
    finally:
        await service.stop()


CHILD = textwrap.dedent(
    """
    import asyncio, logging, resource, sys
    from aiohttp import web
    from services.common.aiohttp_serving import start_http_site
    from services.common.connection_guard import ListenerLimits

    async def main():
        logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(levelname)s %(name)s %(message)s")
        async def hello(request):
            return web.Response(text="ok")

        app = web.Application()
        app.router.add_get("/", hello)
        runner, port = await start_http_site(app, "127.0.0.1", 0, limits=ListenerLimits(max_connections=10000))
        loop = asyncio.get_running_loop()
        quiet, failures = loop.get_exception_handler(), []

        def counting(loop, context):  # tells the parent when accept() has failed three times
            if context.get("message") == "socket.accept() out of system resource":
                failures.append(1)
                if len(failures) == 3:
                    print("failures=3", flush=True)
            quiet(loop, context)

        loop.set_exception_handler(counting)
        print(port, flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)  # until the parent closes stdin
        await runner.cleanup()

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (64, hard))
    asyncio.run(main())
    """
)


async def test_out_of_descriptors_logs_one_line_and_no_traceback() -> None:
    """A process out of file descriptors (cap above RLIMIT_NOFILE) logs one warning, not a traceback per accept."""
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        cwd=REPO,
    )
    held: list[asyncio.StreamWriter] = []
    try:
        assert child.stdout is not None
        line = await asyncio.wait_for(asyncio.to_thread(child.stdout.readline), 30)
        port = int(line)
        for _ in range(120):  # about twice what 64 descriptors allow
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            held.append(writer)
        # asyncio retries accept() every second: wait (bounded) for three failures
        assert (await asyncio.wait_for(asyncio.to_thread(child.stdout.readline), 30)).strip() == b"failures=3"
        for writer in held:
            writer.close()
        held.clear()
        status, _ = await asyncio.wait_for(get_status_retrying(port), 20)
        assert status == 200  # serving again once descriptors are free
    finally:
        for writer in held:
            writer.close()
        try:
            _, err = await asyncio.to_thread(child.communicate, b"", 20)  # closing stdin stops the child
        except subprocess.TimeoutExpired:
            child.kill()
            _, err = child.communicate()
    log = err.decode()
    assert "Traceback" not in log, log[-3000:]
    accept_lines = [ln for ln in log.splitlines() if "accept failed" in ln]
    assert len(accept_lines) == 1 and "open_files_limit=64" in accept_lines[0], log[-3000:]
    assert "max_connections=10000 is above what the open-files limit allows" in log


async def get_status_retrying(port: int) -> tuple[int, float]:
    """A request that may first meet a connection still waiting in the backlog."""
    while True:
        with contextlib.suppress(ConnectionError, IndexError, ValueError, TimeoutError):
            return await get_status(port, "/")
        await asyncio.sleep(0.2)
