"""A console session that relays each client to its own connection to the BMC (docs/console.md).

A serial console is one stream that every client watches; a graphical
console (VNC, RFB protocol) is not: each viewer negotiates its own protocol
version, security type and pixel format with the server. So where
:class:`ConsoleSession` runs one source and fans its bytes out,
:class:`RelaySession` opens a new TCP connection to the BMC's console for
every client that attaches, and copies bytes both ways until either side
closes. It keeps the proxies' bounds and life cycle: one listener per
console (``console_host``, ``console_port_range``), the conductor's
WebSocket server for browsers (binary frames, what noVNC sends), at most
``console_max_clients`` clients (and no more than the BMC says it serves),
everything closed when the console stops.

The target is resolved again for each client (``target``), so a BMC whose
console moved (a VM restarted on another port) is followed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import WSMsgType, web

from services.common import errors
from services.conductor.console_proxy import READ_SIZE, ConsoleProxies, ConsoleSession

LOG = logging.getLogger(__name__)

CONNECT_TIMEOUT = 10.0  # seconds to reach the BMC's console for a new client
Target = Callable[[], Awaitable[tuple[str, int]]]


async def _no_source(session: ConsoleSession) -> None:
    raise errors.FerrumError("a relayed console has no shared source")


class RelaySession(ConsoleSession):
    """One node's relayed console: a listener whose every client gets its own BMC connection."""

    console_type = "vnc"
    url_scheme = "vnc"

    def __init__(
        self,
        proxies: ConsoleProxies,
        node_uuid: str,
        target: Target,
        description: str,
        *,
        max_sessions: int | None = None,
    ) -> None:
        super().__init__(proxies, node_uuid, _no_source, description)
        self._target = target
        limit = proxies.max_clients
        self.max_relays = min(limit, max_sessions) if max_sessions else limit
        self._relays = 0

    async def start(self, port: int | None) -> None:
        self._server = await self.proxies.bind(self._serve_tcp, port)
        self.port = self._server.sockets[0].getsockname()[1]

    @property
    def clients(self) -> int:
        return self._relays

    async def _upstream(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
        """A new connection to the BMC's console, or None (logged, kept in ``last_error``)."""
        try:
            host, port = await self._target()
            return await asyncio.wait_for(asyncio.open_connection(host, port), CONNECT_TIMEOUT)
        except errors.FerrumError as exc:
            self.last_error = exc.message
        except (OSError, TimeoutError) as exc:
            self.last_error = f"cannot reach the console of {self.description}: {exc or type(exc).__name__}"
        LOG.warning("graphical console relay failed node_uuid=%s reason=%s", self.node_uuid, self.last_error)
        return None

    def _track(self) -> asyncio.Task[Any] | None:
        handler = asyncio.current_task()
        if handler is not None:
            self._handlers.add(handler)
        return handler

    async def _serve_tcp(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        handler = self._track()
        counted = False
        upstream_writer: asyncio.StreamWriter | None = None
        try:
            if self._relays >= self.max_relays:
                LOG.info("graphical console busy node_uuid=%s clients=%d", self.node_uuid, self._relays)
                return  # an RFB client cannot be told in words: it sees the connection close
            self._relays += 1
            counted = True
            upstream = await self._upstream()
            if upstream is None:
                return
            up_reader, upstream_writer = upstream
            await _pump_both(reader, writer, up_reader, upstream_writer, self)
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            if counted:
                self._relays -= 1
            for w in (writer, upstream_writer):
                if w is not None:
                    w.close()
                    with contextlib.suppress(Exception):
                        await asyncio.wait_for(w.wait_closed(), 2)
            if handler is not None:
                self._handlers.discard(handler)

    async def serve_websocket(self, request: web.Request) -> web.StreamResponse:
        ws = web.WebSocketResponse(heartbeat=30, max_msg_size=1024 * 1024, protocols=("binary",))
        await ws.prepare(request)
        handler = self._track()
        counted = False
        upstream_writer: asyncio.StreamWriter | None = None
        try:
            if self._relays >= self.max_relays:
                await ws.close(code=1013, message=b"console busy: console_max_clients reached")
                return ws
            self._relays += 1
            counted = True
            upstream = await self._upstream()
            if upstream is None:
                await ws.close(code=1011, message=self.last_error.encode()[:120])
                return ws
            up_reader, upstream_writer = upstream

            async def down() -> None:
                while data := await up_reader.read(READ_SIZE):
                    self.bytes_relayed += len(data)
                    await ws.send_bytes(data)

            async def up() -> None:
                assert upstream_writer is not None
                async for message in ws:
                    if message.type == WSMsgType.BINARY:
                        upstream_writer.write(message.data)
                    elif message.type == WSMsgType.TEXT:
                        upstream_writer.write(message.data.encode())
                    else:
                        break
                    await upstream_writer.drain()

            await _first_of(down(), up())
            return ws
        except (ConnectionError, asyncio.CancelledError):
            return ws
        finally:
            if counted:
                self._relays -= 1
            if upstream_writer is not None:
                upstream_writer.close()
            with contextlib.suppress(Exception):
                await ws.close()
            if handler is not None:
                self._handlers.discard(handler)


async def _pump_both(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    up_reader: asyncio.StreamReader,
    up_writer: asyncio.StreamWriter,
    session: RelaySession,
) -> None:
    async def copy(src: asyncio.StreamReader, dst: asyncio.StreamWriter, count: bool) -> None:
        while data := await src.read(READ_SIZE):
            if count:
                session.bytes_relayed += len(data)
            dst.write(data)
            await dst.drain()

    await _first_of(copy(up_reader, writer, True), copy(reader, up_writer, False))


async def _first_of(*coroutines: Awaitable[None]) -> None:
    """Run the copies until one ends (a side closed), then cancel the other."""
    tasks = [asyncio.ensure_future(c) for c in coroutines]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, ConnectionError, OSError):
                await task
