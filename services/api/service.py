"""The api service: Ironic-compatible REST on :6385 plus a gRPC server
(the native ferrum.v1 NodeService with WatchNodes)."""

from __future__ import annotations

import logging
from typing import Any

import asyncpg
from aiohttp import web

from ferrum.v1 import api_pb2
from services.api.conductor_router import ConductorRouter
from services.api.context import ApiContext
from services.api.event_hub import EventHub
from services.api.fresh_nodes import FreshNodes, forgetting_middleware
from services.api.grpc_api import NodeServicer, add_node_service
from services.api.ipxe_passthru import IpxePassthru, install_public_route
from services.api.json_suffix import json_suffix_middleware
from services.api.middlewares import basic_auth_middleware, error_middleware, version_middleware
from services.api.routes import add_routes
from services.api.unversioned_paths import unversioned_path_middleware
from services.common.aiohttp_serving import request_context_middleware, start_http_site
from services.common.basic_auth import BasicAuthVerifier, http_basic_verifier
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
    verifier: BasicAuthVerifier | None = None,
    *,
    internal_token: str,
    endpoints: Endpoints | None = None,
    fresh: FreshNodes | None = None,
) -> web.Application:
    """The REST app. Under http_basic it uses ``verifier``, or makes its own
    (closed with the app) when none is given. ``fresh``: node documents known
    current (services/api/fresh_nodes.py); without it every GET asks the database."""
    config = settings.api
    middlewares: list[Any] = [request_context_middleware(metrics), error_middleware, version_middleware]
    if fresh is not None:
        middlewares.append(forgetting_middleware(fresh))
    owned = None
    if config.auth_strategy == "http_basic" and verifier is None:
        verifier = owned = http_basic_verifier(settings.api)
    if verifier is not None:
        middlewares.append(basic_auth_middleware(verifier))
    middlewares.append(unversioned_path_middleware)  # after negotiation and auth
    middlewares.append(json_suffix_middleware)  # below 1.91 only (services/api/json_suffix.py)
    app = web.Application(middlewares=middlewares, client_max_size=config.max_json_body_size_provision + 1024)
    if owned is not None:

        async def close_verifier(_: web.Application) -> None:
            owned.close()

        app.on_cleanup.append(close_verifier)
    app.router.add_get("/metrics", metrics.handle)
    ctx = ApiContext(pool, router, settings, internal_token=internal_token, endpoints=endpoints, fresh=fresh)
    resources = add_routes(app, ctx)

    async def stop_background(_: web.Application) -> None:
        await ctx.background.close()

    app.on_cleanup.append(stop_background)
    install_public_route(app, resources[IpxePassthru])
    return app


def node_service_authenticator(verifier: BasicAuthVerifier | None) -> Authenticator | None:
    """The public NodeService takes the same credentials as REST, checked by the
    same verifier (one bcrypt pool and cache): none under ``noauth``."""
    return None if verifier is None else basic_authenticator(verifier.verify)


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
            local=self.endpoints.local,
        )
        self._http: web.AppRunner | None = None
        self._grpc: Any = None
        self._health: Any = None
        self.verifier: BasicAuthVerifier | None = None
        self.fresh: FreshNodes | None = None

    async def start(self) -> dict[str, str]:
        c = self.settings.api
        self.verifier = http_basic_verifier(c)  # an unusable htpasswd file fails the start
        self.internal_token = await internal_token(self.settings, self.pool)
        tls = tls_files(self.settings.security)
        await self.router.start(token=self.internal_token, tls=tls)
        self.hub = EventHub(self.pool)
        await self.hub.start()
        if c.node_document_cache > 0 and self.settings.database.url:
            url = self.settings.database.url
            self.fresh = FreshNodes(lambda: asyncpg.connect(url), size=c.node_document_cache)
            await self.fresh.start()
            self.router.after_call = self.fresh.forget
        secrets = NodeSecrets(Keyring.from_config(self.settings.security))
        servicer = NodeServicer(self.pool, self.router, self.hub, secrets=secrets, config=c)
        self._grpc, grpc_port, self._health = await start_grpc_server(
            host=c.host,
            port=c.grpc_port,
            metrics=self.metrics,
            register=lambda server: add_node_service(servicer, server),
            service_names=[api_pb2.DESCRIPTOR.services_by_name["NodeService"].full_name],
            authenticate=node_service_authenticator(self.verifier),
            tls=tls,
        )
        self._http, port = await start_http_site(
            build_app(
                self.settings,
                self.pool,
                self.router,
                self.metrics,
                self.verifier,
                internal_token=self.internal_token,
                endpoints=self.endpoints,
                fresh=self.fresh,
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
        if self.fresh is not None:
            self.router.after_call = None
            await self.fresh.stop()
            self.fresh = None
        await self.router.stop()
        if self.verifier is not None:
            self.verifier.close()
