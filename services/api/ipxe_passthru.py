"""Seed 003's own URL on the api gateway:
``GET /v1/drivers/{driver}/vendor_passthru/ipxe_config?node_uuid=..|port_address=..``.

Ironic never merged this passthru (CONTRACT 4.4); Ferrum answers it by asking
the stateless renderer over gRPC (``BootScriptRenderer.RenderBootScript``),
so the api holds no boot logic. Like lookup and heartbeat it is public:
firmware cannot authenticate. ``http_basic`` checks prefixes, and this path
has the driver name in the middle, so :func:`install_public_route` adds a
middleware (right after the request-context one, so request ids and metrics
still apply) that sends exactly this route straight to its handler. The
handler therefore answers every outcome itself, always as a plain-text iPXE
script: 200 with the script, 400 for a bad query, 503 when no renderer
answers; never 500.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Awaitable, Callable

import grpc
from aiohttp import web

from ferrum.v1 import renderer_pb2, renderer_pb2_grpc
from services.common.config import Settings
from services.common.console_text import sanitize_text
from services.common.endpoints import Endpoints
from services.common.grpcserver import REQUEST_ID_KEY, client_channel
from services.common.logs import request_id_var
from services.common.tls import tls_files

LOG = logging.getLogger(__name__)
PATH = re.compile(r"/v1/drivers/[^/]+/vendor_passthru/ipxe_config")
_DRIVER = re.compile(r"[A-Za-z0-9_.\-]{1,255}")
HEADERS = {"Cache-Control": "no-store"}
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def error_script(reason: str, status: int) -> web.Response:
    text = sanitize_text(reason, limit=400)
    body = f"#!ipxe\necho Ferrum: cannot network-boot this machine: {text}\nexit 1\n"
    return web.Response(
        text=body, status=status, content_type="text/plain", headers={**HEADERS, "X-Ferrum-Boot-Kind": "error"}
    )


class IpxePassthru:
    def __init__(self, settings: Settings, *, token: str, endpoints: Endpoints, timeout: float = 10.0) -> None:
        self._settings = settings
        self._token = token
        self._endpoints = endpoints
        self._timeout = timeout
        self._channels: dict[str, grpc.aio.Channel] = {}

    def _stub(self, address: str) -> renderer_pb2_grpc.BootScriptRendererAsyncStub:
        channel = self._channels.get(address)
        if channel is None:
            channel = self._channels[address] = client_channel(
                address, token=self._token, tls=tls_files(self._settings.security)
            )
        return renderer_pb2_grpc.BootScriptRendererStub(channel)

    def _renderer_address(self) -> str:
        """Configured, else the renderer of this process, else the configured ipxe host:grpc_port."""
        s = self._settings
        if s.api.renderer_address:
            return s.api.renderer_address
        if self._endpoints.renderer_grpc:
            return self._endpoints.renderer_grpc
        return f"{s.ipxe.host}:{s.ipxe.grpc_port}" if s.ipxe.grpc_port else ""

    async def close(self, _app: web.Application | None = None) -> None:
        for channel in self._channels.values():
            await channel.close()
        self._channels.clear()

    async def handle(self, request: web.Request) -> web.Response:
        driver = request.match_info.get("driver", "")
        node_uuid, port_address = request.query.get("node_uuid"), request.query.get("port_address")
        if not _DRIVER.fullmatch(driver):
            return error_script("the driver name in the URL is not valid", 400)
        if (node_uuid is None) == (port_address is None):
            return error_script("ipxe_config needs exactly one of node_uuid= or port_address=", 400)
        message = (
            renderer_pb2.RenderBootScriptRequest(node_uuid=node_uuid)
            if node_uuid is not None
            else renderer_pb2.RenderBootScriptRequest(mac=port_address or "")
        )
        address = self._renderer_address()
        if not address:
            LOG.warning("ipxe_config passthru reason=no renderer address configured")
            return error_script("no boot script renderer is configured, try again later", 503)
        try:
            reply = await self._stub(address).RenderBootScript(
                message, timeout=self._timeout, metadata=((REQUEST_ID_KEY, request_id_var.get()),)
            )
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.INVALID_ARGUMENT:
                return error_script(f"bad ipxe_config request: {exc.details()}", 400)
            LOG.warning("ipxe_config passthru renderer=%s reason=%s", address, exc.code().name)
            return error_script("the boot script renderer is unavailable, try again later", 503)
        return web.Response(
            text=reply.script, content_type="text/plain", headers={**HEADERS, "X-Ferrum-Boot-Kind": reply.kind}
        )


def public_route_middleware(handler_of_route: Handler) -> Callable[..., Awaitable[web.StreamResponse]]:
    """Serve the passthru path directly, skipping the auth (and version) middlewares."""

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.method in ("GET", "HEAD") and PATH.fullmatch(request.path):
            return await handler_of_route(request)
        return await handler(request)

    return middleware


def install_public_route(app: web.Application, passthru: IpxePassthru) -> None:
    """Serve ``passthru``'s route without auth and close its channels on cleanup
    (the routes table registers the route; call before the app starts)."""
    app.middlewares.insert(min(1, len(app.middlewares)), public_route_middleware(passthru.handle))
    app.on_cleanup.append(passthru.close)
