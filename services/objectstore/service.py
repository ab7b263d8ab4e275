"""The objectstore service frame: gRPC with health and the HTTP side that
will serve temp-URL downloads (issue 6) plus /metrics."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import asyncpg
from aiohttp import web

from services.common.config import Settings
from services.common.grpcserver import start_grpc_server, stop_grpc_server
from services.common.httpserver import request_context_middleware, start_http_site
from services.common.metrics import ServiceMetrics


class ObjectStoreService:
    name = "objectstore"

    def __init__(self, settings: Settings, pool: asyncpg.Pool) -> None:
        self.settings = settings
        self.pool = pool
        self.metrics = ServiceMetrics("objectstore")
        self._http: web.AppRunner | None = None
        self._grpc: Any = None
        self._health: Any = None

    async def start(self) -> dict[str, str]:
        c = self.settings.objectstore
        root = Path(c.root or Path(self.settings.state_dir) / "objects")
        root.mkdir(parents=True, exist_ok=True)
        app = web.Application(middlewares=[request_context_middleware(self.metrics)])
        app.router.add_get("/metrics", self.metrics.handle)
        self._grpc, grpc_port, self._health = await start_grpc_server(
            host=c.host, port=c.grpc_port, metrics=self.metrics, register=lambda server: None, service_names=[],
        )
        self._http, port = await start_http_site(app, c.host, c.http_port)
        return {"objectstore gRPC": f"{c.host}:{grpc_port}", "objectstore HTTP": f"http://{c.host}:{port}",
                "objectstore metrics": f"http://{c.host}:{port}/metrics"}

    async def stop(self) -> None:
        if self._http is not None:
            await self._http.cleanup()
        if self._grpc is not None:
            await stop_grpc_server(self._grpc, self._health)
