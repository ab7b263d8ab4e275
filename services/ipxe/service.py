"""The ipxe renderer service frame: HTTP (scripts, /metrics) and gRPC with
health. Rendering per provision state is issue 5; until then every request
gets a script that says so on the console and exits to the next boot device."""

from __future__ import annotations

from typing import Any

import asyncpg
from aiohttp import web

from services.common.config import Settings
from services.common.grpcserver import start_grpc_server, stop_grpc_server
from services.common.httpserver import request_context_middleware, start_http_site
from services.common.metrics import ServiceMetrics

NOT_READY_SCRIPT = "#!ipxe\necho Ferrum: per-node boot scripts are not rendered by this version yet\nexit 1\n"


class IpxeService:
    name = "ipxe"

    def __init__(self, settings: Settings, pool: asyncpg.Pool) -> None:
        self.settings = settings
        self.pool = pool
        self.metrics = ServiceMetrics("ipxe")
        self._http: web.AppRunner | None = None
        self._grpc: Any = None
        self._health: Any = None

    async def _script(self, request: web.Request) -> web.Response:
        return web.Response(text=NOT_READY_SCRIPT, content_type="text/plain", headers={"Cache-Control": "no-store"})

    async def start(self) -> dict[str, str]:
        c = self.settings.ipxe
        app = web.Application(middlewares=[request_context_middleware(self.metrics)])
        app.router.add_get("/metrics", self.metrics.handle)
        app.router.add_get("/boot.ipxe", self._script)
        app.router.add_get("/ipxe", self._script)
        self._grpc, grpc_port, self._health = await start_grpc_server(
            host=c.host, port=c.grpc_port, metrics=self.metrics, register=lambda server: None, service_names=[],
        )
        self._http, port = await start_http_site(app, c.host, c.port)
        return {"ipxe HTTP": f"http://{c.host}:{port}/boot.ipxe", "ipxe gRPC": f"{c.host}:{grpc_port}",
                "ipxe metrics": f"http://{c.host}:{port}/metrics"}

    async def stop(self) -> None:
        if self._http is not None:
            await self._http.cleanup()
        if self._grpc is not None:
            await stop_grpc_server(self._grpc, self._health)
