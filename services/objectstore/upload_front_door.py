"""The object store's HTTP front door: fast PUT uploads, everything else to aiohttp.

Why a protocol of its own: aiohttp hands a request body over in 64 KiB
``bytes`` pieces through a stream reader, which costs more CPU than the disk
write (an upload through it reached 0.65-0.78 of a plain copy here). This
protocol receives a ``PUT /u/...`` body straight into 4 MiB buffers with
``recv_into`` (``asyncio.BufferedProtocol``) and hands each full buffer to the
store, so the event loop does one copy per byte, out of the kernel. The
buffers start on a 4 KiB boundary, so the filesystem backend can write them
with ``O_DIRECT`` as they are (``services/common/direct_write.py``).

Any other request (a temp-URL GET, HEAD, /metrics, a chunked PUT) is handed,
with the bytes already read, to an aiohttp ``RequestHandler`` that takes the
connection over for good; the port serves one API either way.

Bounds: request heads up to 64 KiB (431 beyond); at most two full buffers wait
for the store before reading pauses (memory stays flat whatever the object
size); a body that stalls for 60 s, or an idle connection after 75 s, is
closed. A :class:`ConnectionGuard` caps the port's live connections (503
beyond the cap) and drops a connection whose request head is not complete
``header_timeout`` seconds after it began; a connection handed to aiohttp
stays counted and watched (``services/common/guarded_protocol.py``). A refused upload whose body is still coming gets its answer, then the
connection closes after a short linger, so the client reads the answer
instead of a reset.
"""

from __future__ import annotations

import asyncio
import email.utils
import enum
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any
from urllib.parse import unquote

import httptools

from services.common import direct_write
from services.common.connection_guard import ConnectionGuard
from services.common.guarded_protocol import GuardedHttpProtocol
from services.common.metrics import ServiceMetrics
from services.objectstore.upload_requests import HttpUploads, Reply

LOG = logging.getLogger(__name__)
HEAD_LIMIT = 64 * 1024
HEAD_START = 4 * 1024  # grown up to HEAD_LIMIT: an idle connection holds 4 KiB
BODY_BUFFER = 4 * 1024 * 1024
QUEUE_HIGH = 2
IDLE_TIMEOUT = 75.0
BODY_STALL_TIMEOUT = 60.0
LINGER_SECONDS = 2.0
TICK_SECONDS = 1.0
_REASONS = {
    100: "Continue",
    201: "Created",
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not Found",
    411: "Length Required",
    413: "Payload Too Large",
    431: "Request Header Fields Too Large",
    500: "Internal Server Error",
    503: "Service Unavailable",
}


class _State(enum.Enum):
    HEAD = "head"  # reading a request head
    BODY = "body"  # receiving a PUT body into buffers
    STORE = "store"  # body complete, the store is committing; reading paused
    LINGER = "linger"  # answered a refused upload; discarding its body until the client closes
    DELEGATED = "delegated"  # aiohttp owns the connection
    CLOSED = "closed"


class _HeadCollector:
    """httptools callbacks for one request head."""

    def __init__(self) -> None:
        self.url = b""
        self.headers: dict[str, str] = {}

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        key = name.decode("latin-1").lower()
        text = value.decode("latin-1")
        self.headers[key] = f"{self.headers[key]}, {text}" if key in self.headers else text


def _reply_bytes(reply: Reply, *, close: bool) -> bytes:
    lines = [
        f"HTTP/1.1 {reply.status} {_REASONS.get(reply.status, 'Error')}",
        f"Date: {email.utils.formatdate(usegmt=True)}",
        f"Content-Length: {len(reply.body)}",
        f"Connection: {'close' if close else 'keep-alive'}",
    ]
    lines += [f"{name}: {value}" for name, value in reply.headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + reply.body


class UploadFrontDoor(asyncio.BufferedProtocol):
    """One client connection; see the module docstring."""

    def __init__(
        self,
        uploads: HttpUploads,
        fallback: Callable[[], asyncio.Protocol],
        metrics: ServiceMetrics,
        bytes_in: Any,
        connections: set[UploadFrontDoor],
        guard: ConnectionGuard,
    ) -> None:
        self._uploads = uploads
        self._guard = guard
        self._admitted = False
        self._fallback = fallback
        self._metrics = metrics
        self._bytes_in = bytes_in
        self._connections = connections
        self._loop = asyncio.get_running_loop()
        self._transport: asyncio.Transport | None = None
        self._state = _State.HEAD
        self._head = bytearray(HEAD_START)
        self._head_fill = 0
        self._scratch: bytearray | None = None
        self._chunk: memoryview | None = None
        self._fill = 0
        self._remaining = 0
        self._queue: asyncio.Queue[memoryview | BaseException | None] = asyncio.Queue()
        self._paused_for_queue = False
        self._last_activity = self._loop.time()
        self._tick: asyncio.TimerHandle | None = None
        self.task: asyncio.Task[None] | None = None

    # -- asyncio protocol -----------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        if not self._guard.admit(transport):
            self._state = _State.CLOSED
            return
        self._admitted = True
        self._guard.head_started(self)
        self._connections.add(self)
        self._tick = self._loop.call_later(TICK_SECONDS, self._on_tick)

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._state is _State.BODY:
            if self._chunk is None:
                self._chunk = direct_write.aligned_buffer(min(BODY_BUFFER, self._remaining))
                self._fill = 0
            return self._chunk[self._fill :]
        if self._state is _State.HEAD and self._head_fill < HEAD_LIMIT:
            if self._head_fill == len(self._head):
                self._head += bytes(min(4 * len(self._head), HEAD_LIMIT) - len(self._head))
            return memoryview(self._head)[self._head_fill :]
        if self._scratch is None:
            self._scratch = bytearray(64 * 1024)
        return memoryview(self._scratch)  # LINGER (discarded), or bytes after a close was decided

    def buffer_updated(self, nbytes: int) -> None:
        self._last_activity = self._loop.time()
        if self._state is _State.BODY:
            self._fill += nbytes
            self._remaining -= nbytes
            assert self._chunk is not None
            if self._fill == len(self._chunk):
                self._queue.put_nowait(self._chunk)
                self._chunk = None
                if self._remaining == 0:
                    self._body_complete()
                elif self._queue.qsize() >= QUEUE_HIGH:
                    self._paused_for_queue = True
                    self._pause()
        elif self._state is _State.HEAD:
            self._guard.head_started(self)  # a new head's first bytes start its clock
            before = self._head_fill
            self._head_fill += nbytes
            self._scan_head(max(0, before - 3))

    def eof_received(self) -> bool:
        return False  # close; connection_lost tells a receive in progress

    def connection_lost(self, exc: Exception | None) -> None:
        if self._state is _State.BODY:
            self._queue.put_nowait(ConnectionResetError("the client went away mid-upload; nothing was stored"))
        if self._state is not _State.DELEGATED:
            self._state = _State.CLOSED
        self._transport = None
        if self._tick is not None:
            self._tick.cancel()
        self._connections.discard(self)
        if self._admitted:
            self._guard.head_finished(self)
            self._guard.release()

    # -- request heads --------------------------------------------------------------------------

    def _scan_head(self, start: int) -> None:
        end = self._head.find(b"\r\n\r\n", start, self._head_fill)
        if end < 0:
            if self._head_fill >= HEAD_LIMIT:
                self._answer_and_close(Reply(431, (), b"request head too large\n"))
            return
        head_length = end + 4
        self._guard.head_finished(self)
        if not self._head.startswith(b"PUT /u/"):
            self._delegate()
            return
        collector = _HeadCollector()
        parser = httptools.HttpRequestParser(collector)
        try:
            parser.feed_data(bytes(self._head[:head_length]))
            path = unquote(collector.url.split(b"?", 1)[0].decode("ascii"), errors="strict")
        except (httptools.HttpParserError, UnicodeError):
            self._answer_and_close(Reply(400, (), b"malformed request\n"))
            return
        headers = collector.headers
        if "transfer-encoding" in headers or "upgrade" in headers:
            self._delegate()  # aiohttp decodes chunked bodies
            return
        length_text = headers.get("content-length")
        if length_text is None or not length_text.strip().isdigit():
            status = 411 if length_text is None else 400
            self._answer_and_close(Reply(status, (), b"a PUT needs Content-Length or chunked encoding\n"))
            return
        rest = bytes(self._head[head_length : self._head_fill])
        self._head_fill = 0
        self._pause()
        self.task = self._loop.create_task(
            self._serve_put(path, headers, int(length_text), rest, keep_alive=parser.should_keep_alive())
        )

    def _delegate(self) -> None:
        """aiohttp takes the connection over, starting with the bytes read so far; it stays
        counted by the guard, which now watches its heads through a GuardedHttpProtocol."""
        assert self._transport is not None
        data = bytes(self._head[: self._head_fill])
        handler = GuardedHttpProtocol(self._guard, self._fallback, admitted=True)
        transport = self._transport
        self._state = _State.DELEGATED
        if self._tick is not None:
            self._tick.cancel()
        self._connections.discard(self)
        self._guard.head_finished(self)
        transport.set_protocol(handler)
        handler.connection_made(transport)
        handler.hand_over(data)

    # -- one upload -----------------------------------------------------------------------------

    async def _serve_put(
        self, path: str, headers: dict[str, str], length: int, rest: bytes, *, keep_alive: bool
    ) -> None:
        started = time.perf_counter()
        try:
            plan = self._uploads.plan(path, headers, length)
        except Exception as exc:  # noqa: BLE001 - every refusal becomes an answer
            self._finish(HttpUploads.failed(exc), started, body_unread=length > len(rest), keep_alive=False)
            return
        if self._transport is None:
            return
        if headers.get("expect", "").lower() == "100-continue" and length > len(rest):
            self._transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        self._remaining = length
        self._state = _State.BODY
        self._take(rest[:length])
        pending = rest[length:]  # a pipelined next request
        if self._state is _State.BODY:
            self._resume()
        try:
            row = await self._uploads.receive(plan, self._chunks())
        except Exception as exc:  # noqa: BLE001
            if not isinstance(exc, ConnectionError):
                LOG.info("upload refused path=%s reason=%s", path, exc)
            self._finish(HttpUploads.failed(exc), started, body_unread=self._state is _State.BODY, keep_alive=False)
            return
        self._bytes_in.labels("in").inc(int(row["size"]))
        self._finish(HttpUploads.created(row), started, body_unread=False, keep_alive=keep_alive, pending=pending)

    def _take(self, data: bytes) -> None:
        """Body bytes that arrived with the head."""
        if not data:
            if self._remaining == 0:
                self._body_complete()
            return
        self._chunk = direct_write.aligned_buffer(min(BODY_BUFFER, self._remaining))
        self._chunk[: len(data)] = data
        self._fill = 0
        self.buffer_updated(len(data))

    def _body_complete(self) -> None:
        self._queue.put_nowait(None)
        self._state = _State.STORE
        self._pause()

    async def _chunks(self) -> AsyncIterator[memoryview]:
        while True:
            item = await self._queue.get()
            if self._paused_for_queue and self._queue.qsize() < QUEUE_HIGH:
                self._paused_for_queue = False
                if self._state is _State.BODY:
                    self._resume()
            if item is None:
                return
            if isinstance(item, BaseException):
                raise item
            yield item

    def _finish(
        self, reply: Reply, started: float, *, body_unread: bool, keep_alive: bool, pending: bytes = b""
    ) -> None:
        self._metrics.observe("http", HttpUploads.ROUTE, str(reply.status), time.perf_counter() - started)
        if self._transport is None:
            return
        if body_unread:
            self._linger(reply)
            return
        self._transport.write(_reply_bytes(reply, close=not keep_alive))
        if not keep_alive:
            self._close()
            return
        self._state = _State.HEAD
        self._queue = asyncio.Queue()
        self._head[: len(pending)] = pending
        self._head_fill = len(pending)
        self._resume()
        if pending:
            self._guard.head_started(self)
            self._scan_head(0)

    # -- closing --------------------------------------------------------------------------------

    def _answer_and_close(self, reply: Reply) -> None:
        if self._transport is not None:
            self._guard.head_finished(self)  # the linger has its own, shorter bound
            self._linger(reply)

    def _linger(self, reply: Reply) -> None:
        """Answer, stop sending, and drop what the client still sends until it closes
        (closing at once with unread bytes would reset the connection before the
        client reads the answer)."""
        assert self._transport is not None
        if self._state is _State.BODY:
            self._queue.put_nowait(ConnectionAbortedError("upload refused"))
        self._state = _State.LINGER
        self._last_activity = self._loop.time()
        self._transport.write(_reply_bytes(reply, close=True))
        if self._transport.can_write_eof():
            self._transport.write_eof()
        self._resume()

    def _close(self) -> None:
        if self._state is not _State.DELEGATED:
            self._state = _State.CLOSED
        if self._transport is not None:
            self._transport.close()

    def abort(self) -> None:
        """Drop the connection now (service stop); an upload in progress stores nothing."""
        if self._transport is not None:
            self._transport.abort()

    def head_timed_out(self) -> None:
        """The guard's header deadline passed while this connection was still sending a head."""
        if self._transport is None or self._state is not _State.HEAD:
            return
        if not self._transport.is_reading():
            self._guard.head_started(self)
            return
        self._guard.dropped_for_timeout()
        self._state = _State.CLOSED
        self._transport.abort()

    def _pause(self) -> None:
        if self._transport is not None and self._transport.is_reading():
            self._transport.pause_reading()

    def _resume(self) -> None:
        if self._transport is not None and not self._transport.is_reading():
            self._transport.resume_reading()

    def _on_tick(self) -> None:
        idle = self._loop.time() - self._last_activity
        if self._state is _State.HEAD and idle > IDLE_TIMEOUT:
            self._close()
        elif self._state is _State.BODY and not self._paused_for_queue and idle > BODY_STALL_TIMEOUT:
            LOG.info("upload body stalled for %.0f s; closing the connection", idle)
            self._queue.put_nowait(TimeoutError("the upload body stalled"))
            self.abort()
        elif self._state is _State.LINGER and idle > LINGER_SECONDS:
            self.abort()
        if self._transport is not None and self._state is not _State.DELEGATED:
            self._tick = self._loop.call_later(TICK_SECONDS, self._on_tick)
