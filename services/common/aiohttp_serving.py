"""Serving an aiohttp app, shared by the HTTP-facing services: the middleware
that gives every request an id and times it, and starting a site on a port
behind a :class:`ConnectionGuard` (connection cap and header deadline,
``services/common/connection_guard.py``)."""

from __future__ import annotations

import asyncio
import inspect
import time
import uuid
from collections.abc import Awaitable, Callable

from aiohttp import web

from services.common.connection_guard import ConnectionGuard, ListenerLimits
from services.common.guarded_protocol import GuardedHttpProtocol
from services.common.logs import request_id_var
from services.common.metrics import ServiceMetrics

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
# aiohttp's default (3,630 s) let idle keep-alive connections hold descriptors for an hour;
# 75 s is nginx's keepalive_timeout and what the renderer and the object store use.
IDLE_TIMEOUT = 75.0
SHUTDOWN_TIMEOUT = 5.0
# aiohttp 3.9 moved shutdown_timeout from the site to the runner (the site's now warns);
# the deploy ramdisk runs Debian's aiohttp 3.8, whose runner refuses it.
_RUNNER_SHUTDOWN = "shutdown_timeout" in inspect.signature(web.BaseRunner.__init__).parameters


def request_context_middleware(metrics: ServiceMetrics) -> Callable[..., Awaitable[web.StreamResponse]]:
    """Give every request an id (echoed in the response) and time it."""

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        request_id = request.headers.get("X-Request-Id") or f"req-{uuid.uuid4()}"
        request_id_var.set(request_id)
        started = time.perf_counter()
        status = 500
        try:
            response = await handler(request)
            status = response.status
        except web.HTTPException as exc:
            status = exc.status
            exc.headers["X-OpenStack-Request-Id"] = request_id
            exc.headers["openstack-request-id"] = request_id
            raise
        finally:
            route = request.match_info.route.resource
            name = route.canonical if route is not None else "unmatched"
            metrics.observe("http", f"{request.method} {name}", str(status), time.perf_counter() - started)
        response.headers["X-OpenStack-Request-Id"] = request_id
        response.headers["openstack-request-id"] = request_id
        return response

    return middleware


class GuardedSite(web.BaseSite):
    """aiohttp's TCPSite, with every connection going through a :class:`GuardedHttpProtocol`."""

    def __init__(self, runner: web.BaseRunner, host: str, port: int, guard: ConnectionGuard) -> None:
        if _RUNNER_SHUTDOWN:
            super().__init__(runner)
        else:
            super().__init__(runner, shutdown_timeout=SHUTDOWN_TIMEOUT)
        self._host = host
        self._port = port
        self.guard = guard
        self.bound_port = port

    @property
    def name(self) -> str:
        return f"http://{self._host}:{self.bound_port}"

    async def start(self) -> None:
        await super().start()
        server = self._runner.server
        assert server is not None
        guard = self.guard
        loop = asyncio.get_running_loop()
        # reuse_address: TIME_WAIT only; a live listener still conflicts
        self._server = await loop.create_server(
            lambda: GuardedHttpProtocol(guard, server), self._host, self._port, reuse_address=True
        )
        self.bound_port = self._server.sockets[0].getsockname()[1] if self._server.sockets else self._port
        guard.start()

    async def stop(self) -> None:
        self.guard.stop()
        await super().stop()


async def start_http_site(
    app: web.Application,
    host: str,
    port: int,
    *,
    listener: str = "http",
    limits: ListenerLimits | None = None,
) -> tuple[web.AppRunner, int]:
    """Serve an aiohttp app; returns the runner and the bound port (port 0 allowed).

    ``listener`` names the site in log lines; ``limits`` bound its connections
    (default: :class:`ListenerLimits`' defaults)."""
    if _RUNNER_SHUTDOWN:
        runner = web.AppRunner(
            app,
            access_log=None,
            handle_signals=False,
            keepalive_timeout=IDLE_TIMEOUT,
            shutdown_timeout=SHUTDOWN_TIMEOUT,
        )
    else:
        runner = web.AppRunner(app, access_log=None, handle_signals=False, keepalive_timeout=IDLE_TIMEOUT)
    await runner.setup()
    site = GuardedSite(runner, host, port, ConnectionGuard(listener, limits or ListenerLimits()))
    try:
        await site.start()
    except OSError as exc:
        await runner.cleanup()
        raise OSError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    return runner, site.bound_port
