"""The ipxe renderer service: iPXE scripts rendered per request from node
state (seed 003) over HTTP (``/boot.ipxe``, ``/ipxe?mac=|uuid=``, /metrics)
and gRPC (``BootScriptRenderer`` plus health and reflection).

It writes no boot file anywhere and keeps no state beyond an optional cache,
so any number of replicas behind one URL give the same answers.
"""

from __future__ import annotations

import logging
from typing import Any

import asyncpg

from ferrum.v1 import renderer_pb2_grpc
from services.common.config import Settings
from services.common.connection_guard import ListenerLimits
from services.common.db.bootdata import BootDataRepository
from services.common.endpoints import Endpoints
from services.common.grpc_auth import internal_token_authenticator
from services.common.grpcserver import start_grpc_server, stop_grpc_server
from services.common.internal_token import internal_token
from services.common.metrics import ServiceMetrics
from services.common.tls import tls_files
from services.ipxe.grpc_service import SERVICE_NAME, RendererServicer
from services.ipxe.handlers import ScriptReplies
from services.ipxe.http_server import ScriptHttpServer
from services.ipxe.reader import BootDataReader, CachingReader
from services.ipxe.render import ScriptRenderer

LOG = logging.getLogger(__name__)


class IpxeService:
    name = "ipxe"

    def __init__(self, settings: Settings, pool: asyncpg.Pool, endpoints: Endpoints | None = None) -> None:
        self.settings = settings
        self.pool = pool
        self.endpoints = endpoints if endpoints is not None else Endpoints()
        self.metrics = ServiceMetrics("ipxe")
        self.cache: CachingReader | None = None
        reader: BootDataReader = BootDataRepository(pool)
        if settings.ipxe.cache_ttl > 0 and not settings.database.url:
            LOG.warning("ipxe cache off, reason=no database URL to LISTEN on (settings.database.url is empty)")
        elif settings.ipxe.cache_ttl > 0:
            self.cache = CachingReader(
                reader,
                lambda: asyncpg.connect(settings.database.url),
                ttl=settings.ipxe.cache_ttl,
                max_entries=settings.ipxe.cache_max_entries,
            )
            reader = self.cache
        # A lambda on purpose: self.replies is made from the renderer, on the next line.
        self.renderer = ScriptRenderer(
            reader,
            settings,
            on_render=lambda r: self.replies.counted_render(r),  # noqa: PLW0108
            local_api_url=self.endpoints.local_api_url,
        )
        self.replies = ScriptReplies(self.renderer, settings.ipxe, self.metrics, self.cache)
        self.grpc_address = ""
        self._http: ScriptHttpServer | None = None
        self._grpc: Any = None
        self._health: Any = None

    async def start(self) -> dict[str, str]:
        c = self.settings.ipxe
        if self.cache is not None:
            await self.cache.start()
        servicer = RendererServicer(self.renderer)
        self._grpc, grpc_port, self._health = await start_grpc_server(
            host=c.host,
            port=c.grpc_port,
            metrics=self.metrics,
            register=lambda server: renderer_pb2_grpc.add_BootScriptRendererServicer_to_server(servicer, server),
            service_names=[SERVICE_NAME],
            authenticate=internal_token_authenticator(await internal_token(self.settings, self.pool)),
            tls=tls_files(self.settings.security),  # the boot HTTP below stays plain: iPXE has no HTTPS here
        )
        self._http = ScriptHttpServer(
            self.replies,
            self.metrics,
            limits=ListenerLimits(max_connections=c.http_max_connections, header_timeout=c.http_header_timeout),
        )
        port = await self._http.start(c.host, c.port)
        self.replies.bound_port = port
        self.grpc_address = f"{c.host}:{grpc_port}"
        self.endpoints.renderer_grpc = self.grpc_address
        LOG.info("ipxe renderer ready http_port=%s grpc=%s cache_ttl=%s", port, self.grpc_address, c.cache_ttl)
        return {
            "ipxe HTTP": f"http://{c.host}:{port}/boot.ipxe",
            "ipxe gRPC": self.grpc_address,
            "ipxe metrics": f"http://{c.host}:{port}/metrics",
        }

    async def stop(self) -> None:
        if self.endpoints.renderer_grpc == self.grpc_address:
            self.endpoints.renderer_grpc = ""
        if self._http is not None:
            await self._http.stop()
        if self._grpc is not None:
            await stop_grpc_server(self._grpc, self._health, grace=1.0)
        if self.cache is not None:
            await self.cache.stop()
