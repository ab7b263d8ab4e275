"""The renderer's HTTP/1.1 server: an asyncio Protocol over httptools.

Why not aiohttp like the other services: a boot storm is thousands of tiny
GETs, and aiohttp's request objects, middleware and per-request task cost
about ten times what answering one needs. Here a request whose reply needs no
database read (``/boot.ipxe``, ``/metrics``, a cached per-node script, any
error) is written from the parser callback; only a per-node script that has
to be read and rendered runs in a task. The server speaks just what iPXE,
curl and monitoring need: GET and HEAD, keep-alive, pipelining (replies in
request order), HTTP/1.0 and ``Connection: close``.

Limits that keep a misbehaving client from costing memory: a request target
over 8 KiB (414), headers over 32 KiB (431) and unparsable requests (400)
close the connection; reading pauses while the client does not read its
replies or has more than 32 pipelined requests waiting; a connection idle
for ``IDLE_TIMEOUT`` seconds is closed. A :class:`ConnectionGuard` caps the
live connections (503 beyond the cap; a boot storm needs many, so the
renderer's default cap is 10,000) and drops a connection whose request head
is not complete ``header_timeout`` seconds after it began
(``services/common/connection_guard.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from email.utils import formatdate

import httptools

from services.common.connection_guard import ConnectionGuard, ListenerLimits
from services.common.metrics import ServiceMetrics
from services.ipxe.handlers import Reply, ScriptReplies

LOG = logging.getLogger(__name__)
MAX_TARGET = 8 * 1024
MAX_HEADERS = 32 * 1024
MAX_QUEUED = 32
IDLE_TIMEOUT = 75.0  # nginx's keepalive_timeout default
BACKLOG = 1024  # a boot storm opens many connections at once (asyncio defaults to 100)
_CLOSE = b"Connection: close\r\n"


class ScriptHttpServer:
    """Listens on host:port and answers through a :class:`ScriptReplies`."""

    def __init__(
        self,
        replies: ScriptReplies,
        metrics: ServiceMetrics,
        *,
        idle_timeout: float = IDLE_TIMEOUT,
        limits: ListenerLimits | None = None,
    ) -> None:
        self.replies = replies
        self.metrics = metrics
        self.idle_timeout = idle_timeout
        self.guard = ConnectionGuard("ipxe", limits or ListenerLimits(max_connections=10_000))
        self.connections: set[HttpConnection] = set()
        self.date_line = b""
        self._server: asyncio.Server | None = None
        self._ticker: asyncio.TimerHandle | None = None

    async def start(self, host: str, port: int) -> int:
        """Bind (port 0: ephemeral) and return the bound port."""
        loop = asyncio.get_running_loop()
        self._tick()
        try:
            self._server = await loop.create_server(
                lambda: HttpConnection(self), host, port, reuse_address=True, backlog=BACKLOG
            )
        except OSError as exc:
            self._stop_ticker()
            raise OSError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
        self.guard.start()
        return int(self._server.sockets[0].getsockname()[1])

    async def stop(self) -> None:
        self._stop_ticker()
        self.guard.stop()
        if self._server is not None:
            self._server.close()
            for connection in list(self.connections):
                connection.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 5.0)
            self._server = None
        self.replies.flush_metrics()

    def _tick(self) -> None:
        """Once a second: the Date header, metric tallies, idle connections."""
        self.date_line = f"Date: {formatdate(usegmt=True)}\r\n".encode()
        self.replies.flush_metrics()
        horizon = time.monotonic() - self.idle_timeout
        for connection in [c for c in self.connections if c.idle_since(horizon)]:
            connection.close()
        self._ticker = asyncio.get_running_loop().call_later(1.0, self._tick)

    def _stop_ticker(self) -> None:
        if self._ticker is not None:
            self._ticker.cancel()
            self._ticker = None


class HttpConnection(asyncio.Protocol):
    """One client connection; httptools calls the ``on_*`` methods while parsing."""

    def __init__(self, server: ScriptHttpServer) -> None:
        self._server = server
        self._replies = server.replies
        self._transport: asyncio.Transport | None = None
        self._parser = httptools.HttpRequestParser(self)
        self._target = b""
        self._host = b""
        self._header_bytes = 0
        self._refused: Reply | None = None
        self._queue: deque[tuple[bytes, bytes, bytes, bool]] = deque()
        self._task: asyncio.Task[None] | None = None
        self._write_paused = False
        self._read_paused = False
        self._closing = False
        self._close_after_queue = False
        self._admitted = False
        self.last_active = time.monotonic()

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]
        if not self._server.guard.admit(transport):
            self._closing = True
            return
        self._admitted = True
        self._server.connections.add(self)
        self._server.guard.head_started(self)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._admitted:
            self._server.guard.release()
            self._server.guard.head_finished(self)
        self._server.connections.discard(self)
        self._closing = True
        self._queue.clear()
        if self._task is not None:
            self._task.cancel()

    def data_received(self, data: bytes) -> None:
        self.last_active = time.monotonic()
        if self._closing:
            return
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            # No upgrades here: the request itself was answered; hang up once its reply is out.
            if self._queue:
                self._close_after_queue = True
            else:
                self.close()
        except httptools.HttpParserError:
            self._refuse(self._refused or self._replies.bad_request)

    def pause_writing(self) -> None:
        self._write_paused = True
        self._update_reading()

    def resume_writing(self) -> None:
        self._write_paused = False
        self._update_reading()

    # httptools callbacks
    def on_message_begin(self) -> None:
        self._target = b""
        self._host = b""
        self._header_bytes = 0
        self._server.guard.head_started(self)

    def on_headers_complete(self) -> None:
        self._server.guard.head_finished(self)

    def on_url(self, url: bytes) -> None:
        self._target += url
        if len(self._target) > MAX_TARGET:
            self._refused = Reply(414, b"request target too long\n")
            raise httptools.HttpParserError("target too long")

    def on_header(self, name: bytes, value: bytes) -> None:
        self._header_bytes += len(name) + len(value) + 4
        if self._header_bytes > MAX_HEADERS:
            self._refused = Reply(431, b"request headers too large\n")
            raise httptools.HttpParserError("headers too large")
        if len(name) == 4 and name.lower() == b"host":
            self._host = value

    def on_message_complete(self) -> None:
        method = self._parser.get_method()
        keep_alive = self._parser.should_keep_alive()
        if self._queue:  # an earlier request on this connection is still rendering
            self._queue.append((method, self._target, self._host, keep_alive))
            self._update_reading()
            return
        reply = self._replies.answer_now(method, self._target, self._host)
        if reply is not None:
            self._send(method, reply, keep_alive)
            return
        self._queue.append((method, self._target, self._host, keep_alive))
        self._task = asyncio.get_running_loop().create_task(self._drain())

    # replies
    async def _drain(self) -> None:
        """Answer queued requests in order, rendering those that need the database."""
        try:
            while self._queue and not self._closing:
                method, target, host, keep_alive = self._queue[0]
                reply = self._replies.answer_now(method, target, host)
                if reply is None:
                    started = time.perf_counter()
                    reply = await self._replies.render(target)
                    self._server.metrics.latency.labels(self._server.metrics.service, "http", "GET /ipxe").observe(
                        time.perf_counter() - started
                    )
                if self._closing:
                    return
                self._queue.popleft()
                self._send(method, reply, keep_alive)
                self._update_reading()
            if self._close_after_queue:
                self.close()
        except Exception:  # render() never raises by design; a bug must not leave the client hanging
            LOG.exception("ipxe http reply failed")
            self._refuse(Reply(500, b"internal error\n"))
        finally:
            self._task = None

    def _send(self, method: bytes, reply: Reply, keep_alive: bool) -> None:
        transport = self._transport
        if transport is None or self._closing:
            return
        body = reply.body if method != b"HEAD" else b""
        if keep_alive:
            transport.write(reply.head + self._server.date_line + b"\r\n" + body)
        else:
            transport.write(reply.head + self._server.date_line + _CLOSE + b"\r\n" + body)
            self.close()

    def _refuse(self, reply: Reply) -> None:
        """A request we will not parse further: answer it and close."""
        self._queue.clear()
        self._send(b"GET", reply, False)
        self.close()

    def _update_reading(self) -> None:
        transport = self._transport
        if transport is None or self._closing:
            return
        should_pause = self._write_paused or len(self._queue) > MAX_QUEUED
        if should_pause and not self._read_paused:
            transport.pause_reading()
            self._read_paused = True
        elif not should_pause and self._read_paused:
            transport.resume_reading()
            self._read_paused = False

    def head_timed_out(self) -> None:
        """The guard's header deadline passed (see ConnectionGuard)."""
        transport = self._transport
        if transport is None or self._closing:
            return
        if self._read_paused:  # our own flow control stopped the head from arriving
            self._server.guard.head_started(self)
            return
        self._server.guard.dropped_for_timeout()
        self._closing = True
        self._queue.clear()
        transport.abort()

    def idle_since(self, horizon: float) -> bool:
        return not self._queue and self.last_active < horizon

    def close(self) -> None:
        self._closing = True
        if self._transport is not None:
            self._transport.close()  # flushes what was written first
