"""Per-node serial console proxies of one conductor (docs/console.md).

A console interface's ``start_console`` hands :class:`ConsoleProxies` a
*source*: the coroutine that reaches the machine's console (an ``ipmitool
sol activate`` child, a BMC's console log polled over Redfish) and feeds
what it shows to its :class:`ConsoleSession`. The session relays those bytes
to every connected client and what clients type back to the source:

- raw TCP on ``console_host`` (127.0.0.1 by default), one port per console
  from ``console_port_range`` (or ephemeral): what Ironic's socat consoles
  offer, ``console_info = {"type": "socat", "url": "tcp://HOST:PORT"}``;
- a WebSocket for browsers, one aiohttp server per conductor, at
  ``ws://HOST:PORT/consoles/<node uuid>/<token>``: the token is random per
  console start, so only a caller that read the console info through the
  (authenticated) api can attach; binary frames carry the bytes.

Bounded: at most ``max_consoles`` sessions per conductor (the next start is
refused with TooManyConsoles), ``console_max_clients`` clients per console
(a further one is told so and closed), a ``console_scrollback`` buffer a new
client gets first, and per-client output queues (a client that does not
read is dropped, never buffered without end). A source that ends or fails is
started again with a growing delay (up to 30 s) until the console stops.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import secrets
import ssl
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import WSMsgType, web

from services.common import errors
from services.common.aiohttp_serving import start_http_site
from services.common.config import ConductorConfig, console_port_range
from services.common.connection_guard import ListenerLimits

LOG = logging.getLogger(__name__)

CLIENT_QUEUE = 256  # chunks a client may have unsent before it is dropped as too slow
KEYS_QUEUE = 256  # chunks of typed input waiting for the source
READ_SIZE = 4096
RESTART_DELAYS = (0.5, 1.0, 2.0, 5.0, 10.0, 30.0)
STEADY = 30.0  # a source that ran this long before ending starts again at the first delay

Source = Callable[["ConsoleSession"], Awaitable[None]]


class ConsoleSession:
    """One node's running console: its listener, its clients and its source."""

    console_type = "socat"  # console_info's type, as Ironic's socat consoles
    url_scheme = "tcp"

    def __init__(self, proxies: ConsoleProxies, node_uuid: str, source: Source, description: str) -> None:
        self.proxies = proxies
        self.node_uuid = node_uuid
        self.description = description
        self.port = 0
        self.token = secrets.token_urlsafe(24)
        self.keys: asyncio.Queue[bytes] = asyncio.Queue(KEYS_QUEUE)
        self._source = source
        self._scrollback = bytearray()
        self._clients: set[asyncio.Queue[bytes | None]] = set()
        self._server: asyncio.Server | None = None
        self._runner: asyncio.Task[None] | None = None
        self._handlers: set[asyncio.Task[Any]] = set()
        self.last_error = ""
        self.bytes_relayed = 0

    # ---- what a source calls ------------------------------------------------------------

    def publish(self, data: bytes) -> None:
        """Console output: to the scrollback and every client (a client that fell behind is dropped)."""
        if not data:
            return
        self.bytes_relayed += len(data)
        limit = self.proxies.scrollback
        if limit:
            self._scrollback += data
            if len(self._scrollback) > limit:
                del self._scrollback[: len(self._scrollback) - limit]
        for queue in list(self._clients):
            try:
                queue.put_nowait(data)
            except asyncio.QueueFull:
                LOG.warning("console client too slow, dropped node_uuid=%s", self.node_uuid)
                self._drop(queue)

    def notice(self, text: str) -> None:
        """A line from Ferrum itself (the source failed, restarts), marked as such."""
        self.publish(f"\r\n[ferrum console: {text}]\r\n".encode())

    # ---- life cycle ---------------------------------------------------------------------

    async def start(self, port: int | None) -> None:
        self._server = await self.proxies.bind(self._serve_tcp, port)
        self.port = self._server.sockets[0].getsockname()[1]
        self._runner = asyncio.create_task(self._run_source(), name=f"console:{self.node_uuid}")

    async def _run_source(self) -> None:
        failures = 0
        loop = asyncio.get_running_loop()
        while True:
            started = loop.time()
            try:
                await self._source(self)
                reason = "the console source ended"
            except asyncio.CancelledError:
                raise
            except errors.FerrumError as exc:
                reason = exc.message
            except Exception as exc:  # noqa: BLE001 - any failure of the source is shown and retried
                reason = f"{type(exc).__name__}: {exc}"
            if loop.time() - started > STEADY:
                failures = 0
            delay = RESTART_DELAYS[min(failures, len(RESTART_DELAYS) - 1)]
            failures += 1
            self.last_error = reason
            LOG.info("console source ended node_uuid=%s reason=%s retry_in=%.1fs", self.node_uuid, reason, delay)
            self.notice(f"{reason}; reconnecting in {delay:g} s")
            await asyncio.sleep(delay)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        if self._runner is not None:
            self._runner.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._runner
        for queue in list(self._clients):
            self._drop(queue)
        for handler in list(self._handlers):
            handler.cancel()
        if self._handlers:
            await asyncio.wait(list(self._handlers), timeout=5)
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 5)

    # ---- clients ------------------------------------------------------------------------

    @property
    def clients(self) -> int:
        return len(self._clients)

    def _attach(self) -> asyncio.Queue[bytes | None] | None:
        if len(self._clients) >= self.proxies.max_clients:
            return None
        queue: asyncio.Queue[bytes | None] = asyncio.Queue(CLIENT_QUEUE)
        if self._scrollback:
            queue.put_nowait(bytes(self._scrollback))
        self._clients.add(queue)
        return queue

    def _drop(self, queue: asyncio.Queue[bytes | None]) -> None:
        """Detach a client; its writer ends when it reaches the None."""
        if queue in self._clients:
            self._clients.discard(queue)
            while True:  # make room for the end marker
                try:
                    queue.put_nowait(None)
                    return
                except asyncio.QueueFull:
                    queue.get_nowait()

    def type_keys(self, data: bytes) -> None:
        if not data:
            return
        try:
            self.keys.put_nowait(data)
        except asyncio.QueueFull:
            LOG.debug("console input dropped (the source does not read) node_uuid=%s", self.node_uuid)

    def _busy(self) -> bytes:
        return (
            f"[ferrum console: node {self.node_uuid} already has {self.proxies.max_clients} clients "
            "(console_max_clients)]\r\n"
        ).encode()

    async def _serve_tcp(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        handler = asyncio.current_task()
        if handler is not None:
            self._handlers.add(handler)
        queue = self._attach()
        try:
            if queue is None:
                writer.write(self._busy())
                with contextlib.suppress(ConnectionError):
                    await writer.drain()
                return

            async def pump_out() -> None:
                while (data := await queue.get()) is not None:
                    writer.write(data)
                    await writer.drain()

            out = asyncio.create_task(pump_out())
            try:
                while not out.done():
                    read = asyncio.ensure_future(reader.read(READ_SIZE))
                    done, _ = await asyncio.wait({read, out}, return_when=asyncio.FIRST_COMPLETED)
                    if read not in done:
                        read.cancel()
                        break
                    data = read.result()
                    if not data:
                        break
                    self.type_keys(data)
            finally:
                out.cancel()
                with contextlib.suppress(asyncio.CancelledError, ConnectionError):
                    await out
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            if queue is not None:
                self._drop(queue)
            writer.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(writer.wait_closed(), 2)
            if handler is not None:
                self._handlers.discard(handler)

    async def serve_websocket(self, request: web.Request) -> web.StreamResponse:
        ws = web.WebSocketResponse(heartbeat=30, max_msg_size=64 * 1024)
        await ws.prepare(request)
        handler = asyncio.current_task()
        if handler is not None:
            self._handlers.add(handler)
        queue = self._attach()
        try:
            if queue is None:
                await ws.send_bytes(self._busy())
                return ws

            async def pump_out() -> None:
                while (data := await queue.get()) is not None:
                    await ws.send_bytes(data)
                await ws.close()

            out = asyncio.create_task(pump_out())
            try:
                async for message in ws:
                    if message.type == WSMsgType.BINARY:
                        self.type_keys(message.data)
                    elif message.type == WSMsgType.TEXT:
                        self.type_keys(message.data.encode())
                    else:
                        break
            finally:
                out.cancel()
                with contextlib.suppress(asyncio.CancelledError, ConnectionError):
                    await out
            return ws
        except (ConnectionError, asyncio.CancelledError):
            return ws
        finally:
            if queue is not None:
                self._drop(queue)
            with contextlib.suppress(Exception):
                await ws.close()
            if handler is not None:
                self._handlers.discard(handler)


class ConsoleProxies:
    """The console sessions of one conductor, within their bounds."""

    def __init__(self, config: ConductorConfig, *, ssl_context: ssl.SSLContext | None = None) -> None:
        self.host = config.console_host
        self.port_range = console_port_range(config.console_port_range)
        self.websocket_port = config.console_websocket_port
        self.max_consoles = config.max_consoles
        self.max_clients = config.console_max_clients
        self.scrollback = config.console_scrollback
        self._ssl = ssl_context
        self._sessions: dict[str, ConsoleSession] = {}
        self._starting: set[str] = set()
        self._ws_runner: web.AppRunner | None = None
        self._ws_port = 0
        self._ws_lock = asyncio.Lock()
        self.closed = False

    # ---- bounds -------------------------------------------------------------------------

    def check_capacity(self, node_uuid: str) -> None:
        """TooManyConsoles unless one more console (or a restart of this node's) fits."""
        if node_uuid in self._sessions or node_uuid in self._starting:
            return
        if len(self._sessions) + len(self._starting) >= self.max_consoles:
            raise errors.TooManyConsoles(
                f"Cannot enable the console of node {node_uuid}: this conductor already runs its maximum of "
                f"{self.max_consoles} consoles (conductor option max_consoles); disable another console or "
                "raise the bound"
            )

    def running(self) -> set[str]:
        return set(self._sessions)

    def get(self, node_uuid: str) -> ConsoleSession | None:
        return self._sessions.get(node_uuid)

    # ---- starting and stopping --------------------------------------------------------------

    async def start(self, node_uuid: str, source: Source, *, description: str, port: int | None = None) -> None:
        """Run a console for the node (a running one is replaced: a restart)."""
        await self.start_session(
            node_uuid, lambda: ConsoleSession(self, node_uuid, source, description), description=description, port=port
        )

    async def start_session(
        self, node_uuid: str, make: Callable[[], ConsoleSession], *, description: str, port: int | None = None
    ) -> None:
        """Run the session ``make`` builds for the node, within the bounds (a running one is replaced)."""
        if self.closed:
            raise errors.ServiceUnavailable("this conductor is stopping: no new consoles")
        if node_uuid in self._starting:
            raise errors.NodeLocked(f"The console of node {node_uuid} is being started right now")
        self.check_capacity(node_uuid)
        self._starting.add(node_uuid)
        try:
            await self.stop(node_uuid)
            await self._ensure_websocket_server()
            session = make()
            await session.start(port)
            if self.closed:
                await session.stop()
                raise errors.ServiceUnavailable("this conductor is stopping: no new consoles")
            self._sessions[node_uuid] = session
        finally:
            self._starting.discard(node_uuid)
        LOG.info("console started node_uuid=%s port=%s source=%s", node_uuid, session.port, description)

    async def stop(self, node_uuid: str) -> bool:
        session = self._sessions.pop(node_uuid, None)
        if session is None:
            return False
        await session.stop()
        LOG.info("console stopped node_uuid=%s port=%s", node_uuid, session.port)
        return True

    async def close(self) -> None:
        """Conductor stop: every console and the WebSocket server (console_enabled stays
        recorded, so the next owner of each node starts it again)."""
        self.closed = True
        for node_uuid in list(self._sessions):
            await self.stop(node_uuid)
        if self._ws_runner is not None:
            await self._ws_runner.cleanup()
            self._ws_runner = None

    async def bind(
        self, handler: Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]], port: int | None
    ) -> asyncio.Server:
        """A TCP listener on the console host: ``port`` when given (ipmi_terminal_port), else the
        first free port of console_port_range, else an ephemeral one."""
        if port:
            try:
                return await asyncio.start_server(handler, self.host, port)
            except OSError as exc:
                raise errors.InvalidParameterValue(
                    f"Cannot listen for the console on {self.host}:{port}: {exc.strerror or exc}"
                ) from None
        if self.port_range is None:
            return await asyncio.start_server(handler, self.host, 0)
        taken = {s.port for s in self._sessions.values()}
        low, high = self.port_range
        for candidate in range(low, high + 1):
            if candidate in taken:
                continue
            try:
                return await asyncio.start_server(handler, self.host, candidate)
            except OSError as exc:
                if exc.errno != errno.EADDRINUSE:
                    raise
        raise errors.TooManyConsoles(f"No free console port in console_port_range {low}:{high} on {self.host}")

    # ---- what clients are told ------------------------------------------------------------

    def info(self, node_uuid: str) -> dict[str, str]:
        """Ironic's console_info (``socat`` and ``tcp://``, or ``vnc`` and ``vnc://`` for a
        graphical console), plus the WebSocket URL."""
        session = self._sessions.get(node_uuid)
        if session is None:
            raise errors.ServiceUnavailable(
                f"The console of node {node_uuid} is enabled but not running on this conductor yet "
                "(it is started again after a conductor change); retry shortly"
            )
        host = f"[{self.host}]" if ":" in self.host else self.host
        scheme = "wss" if self._ssl is not None else "ws"
        return {
            "type": session.console_type,
            "url": f"{session.url_scheme}://{host}:{session.port}",
            "websocket_url": f"{scheme}://{host}:{self._ws_port}/consoles/{node_uuid}/{session.token}",
        }

    # ---- the WebSocket server -------------------------------------------------------------

    async def _ensure_websocket_server(self) -> None:
        async with self._ws_lock:
            if self._ws_runner is not None:
                return
            app = web.Application()
            app.router.add_get("/consoles/{node}/{token}", self._websocket)
            # Every console's clients, plus a few connections that are refused (wrong token, busy).
            limits = ListenerLimits(max_connections=max(1, self.max_consoles) * self.max_clients + 16)
            self._ws_runner, self._ws_port = await start_http_site(
                app, self.host, self.websocket_port, listener="console-websocket", limits=limits, ssl_context=self._ssl
            )
            LOG.info("console websocket server listening on %s:%s", self.host, self._ws_port)

    @property
    def websocket_address(self) -> str:
        return f"{self.host}:{self._ws_port}" if self._ws_runner is not None else ""

    async def _websocket(self, request: web.Request) -> web.StreamResponse:
        session = self._sessions.get(request.match_info["node"])
        token = request.match_info["token"]
        if session is None or not secrets.compare_digest(session.token.encode(), token.encode()):
            raise web.HTTPNotFound(text="no such console")
        return await session.serve_websocket(request)
