"""Serving an aiohttp app, shared by the HTTP-facing services: the middleware
that gives every request an id and times it, and starting a site on a port."""

from __future__ import annotations

import inspect
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from services.common.logs import request_id_var
from services.common.metrics import ServiceMetrics

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
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


async def start_http_site(app: web.Application, host: str, port: int) -> tuple[web.AppRunner, int]:
    """Serve an aiohttp app; returns the runner and the bound port (port 0 allowed)."""
    timeout: dict[str, Any] = {"shutdown_timeout": SHUTDOWN_TIMEOUT}
    runner = web.AppRunner(app, access_log=None, handle_signals=False, **(timeout if _RUNNER_SHUTDOWN else {}))
    await runner.setup()
    # reuse_address: TIME_WAIT only; a live listener still conflicts
    site = web.TCPSite(runner, host, port, reuse_address=True, **({} if _RUNNER_SHUTDOWN else timeout))
    try:
        await site.start()
    except OSError as exc:
        await runner.cleanup()
        raise OSError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    server = site._server  # aiohttp exposes no public accessor for the bound socket
    bound = server.sockets[0].getsockname()[1] if server is not None and server.sockets else port
    return runner, bound
