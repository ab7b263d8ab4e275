"""The api service: Ironic-compatible REST on :6385 plus a gRPC server
(the native ferrum.v1 NodeService with WatchNodes)."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import asyncpg
import bcrypt
from aiohttp import web

from ferrum.v1 import api_pb2, api_pb2_grpc
from services.api.conductor_router import ConductorRouter
from services.api.context import ApiContext
from services.api.event_hub import EventHub
from services.api.grpc_api import NodeServicer
from services.api.ipxe_passthru import IpxePassthru, install_public_route
from services.api.middlewares import basic_auth_middleware, error_middleware, load_htpasswd, version_middleware
from services.api.routes import add_routes
from services.common.aiohttp_serving import request_context_middleware, start_http_site
from services.common.config import Settings
from services.common.connection_guard import ListenerLimits
from services.common.db.node_secrets import NodeSecrets
from services.common.endpoints import Endpoints
from services.common.grpc_auth import Authenticator, basic_authenticator
from services.common.grpcserver import start_grpc_server, stop_grpc_server
from services.common.internal_token import internal_token
from services.common.keyring import Keyring
from services.common.metrics import ServiceMetrics
from services.common.tls import server_ssl_context, tls_files

LOG = logging.getLogger(__name__)


def build_app(
    settings: Settings,
    pool: asyncpg.Pool,
    router: ConductorRouter,
    metrics: ServiceMetrics,
    *,
    internal_token: str,
    endpoints: Endpoints | None = None,
) -> web.Application:
    config = settings.api
    middlewares: list[Any] = [request_context_middleware(metrics), error_middleware, version_middleware]
    if config.auth_strategy == "http_basic":
        middlewares.append(basic_auth_middleware(load_htpasswd(config.htpasswd_file)))
    app = web.Application(middlewares=middlewares, client_max_size=config.max_json_body_size_provision + 1024)
    app.router.add_get("/metrics", metrics.handle)
    resources = add_routes(app, ApiContext(pool, router, settings, internal_token=internal_token, endpoints=endpoints))
    install_public_route(app, resources[IpxePassthru])
    return app


def node_service_authenticator(settings: Settings) -> Authenticator | None:
    """The public NodeService takes the same credentials as REST: none under
    ``noauth``, HTTP basic against the htpasswd file under ``http_basic``."""
    if settings.api.auth_strategy != "http_basic":
        return None
    users = load_htpasswd(settings.api.htpasswd_file)

    async def verify(user: str, password: str) -> bool:
        hashed = users.get(user)
        if hashed is None:
            return False
        return await asyncio.to_thread(bcrypt.checkpw, password.encode(), hashed)

    return basic_authenticator(verify)


class ApiService:
    name = "api"

    def __init__(self, settings: Settings, pool: asyncpg.Pool, endpoints: Endpoints | None = None) -> None:
        self.settings = settings
        self.pool = pool
        self.endpoints = endpoints if endpoints is not None else Endpoints()
        self.metrics = ServiceMetrics("api")
        self.router = ConductorRouter(
            pool,
            refresh_interval=settings.api.ring_refresh_interval,
            heartbeat_timeout=settings.conductor.heartbeat_timeout,
            timeout=settings.api.conductor_timeout,
            restart_grace=settings.conductor.liveness_restart_grace,
        )
        self._http: web.AppRunner | None = None
        self._grpc: Any = None
        self._health: Any = None

    async def start(self) -> dict[str, str]:
        c = self.settings.api
        if c.auth_strategy == "http_basic":
            load_htpasswd(c.htpasswd_file)  # fail at start, not on the first request
        self.internal_token = await internal_token(self.settings, self.pool)
        tls = tls_files(self.settings.security)
        await self.router.start(token=self.internal_token, tls=tls)
        self.hub = EventHub(self.pool)
        await self.hub.start()
        secrets = NodeSecrets(Keyring.from_config(self.settings.security))
        servicer = NodeServicer(self.pool, self.router, self.hub, secrets=secrets)
        self._grpc, grpc_port, self._health = await start_grpc_server(
            host=c.host,
            port=c.grpc_port,
            metrics=self.metrics,
            register=lambda server: api_pb2_grpc.add_NodeServiceServicer_to_server(servicer, server),
            service_names=[api_pb2.DESCRIPTOR.services_by_name["NodeService"].full_name],
            authenticate=node_service_authenticator(self.settings),
            tls=tls,
        )
        self._http, port = await start_http_site(
            build_app(
                self.settings,
                self.pool,
                self.router,
                self.metrics,
                internal_token=self.internal_token,
                endpoints=self.endpoints,
            ),
            c.host,
            c.port,
            listener="api",
            limits=ListenerLimits(max_connections=c.http_max_connections, header_timeout=c.http_header_timeout),
            ssl_context=server_ssl_context(tls) if tls is not None else None,
        )
        scheme = "https" if tls is not None else "http"
        self.endpoints.api_url = f"{scheme}://{c.host}:{port}"  # the renderer of this process puts it in ramdisks
        return {
            "api REST (Ironic v1)": f"{scheme}://{c.host}:{port}",
            "api gRPC": f"{c.host}:{grpc_port}",
            "api metrics": f"{scheme}://{c.host}:{port}/metrics",
        }

    async def wait_routable(self, *, conductor: str | None) -> None:
        """Ready means a node can be routed: the ring holds the conductor started in
        this process (a stack), or any conductor (an api on its own). A stack whose
        own conductor never shows up fails; a lone api waits at most
        ``ready_timeout`` and then serves anyway, with a warning (its conductors
        may start later)."""
        timeout = self.settings.api.ready_timeout
        if await self.router.wait_routable(conductor=conductor, timeout=timeout):
            return
        if conductor:
            raise RuntimeError(f"the api cannot route to conductor {conductor!r} after {timeout:.0f} s")
        LOG.warning("no live conductor after %.0f s: node operations answer 503 until one registers", timeout)

    async def stop(self) -> None:
        if self._http is not None:
            await self._http.cleanup()
        if self._grpc is not None:
            await stop_grpc_server(self._grpc, self._health, grace=1.0)
        if getattr(self, "hub", None) is not None:
            await self.hub.stop()
        await self.router.stop()
