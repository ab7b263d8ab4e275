"""The objectstore service: gRPC ObjectStore (put/get/stat/list/delete,
temp URLs, atomic usage counts), HTTP temp-URL downloads plus /metrics, and
the expiry sweeper.

After ``start()`` the bound addresses are attributes: ``grpc_address``
(``host:port``, what ``ObjectStoreClient`` and the conductor's
``objectstore_address`` take), ``http_url`` and ``public_url`` (the base of
temp URLs; ``FERRUM_OBJECTSTORE_PUBLIC_URL`` when set)."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import asyncpg
from aiohttp import web

from ferrum.v1 import objectstore_pb2 as pb
from ferrum.v1 import objectstore_pb2_grpc as pb_grpc
from services.common.aiohttp_serving import IDLE_TIMEOUT, request_context_middleware
from services.common.config import Settings
from services.common.connection_guard import ConnectionGuard, ListenerLimits
from services.common.db.objects import ObjectRepository
from services.common.db.service_secrets import SecretRepository
from services.common.endpoints import Endpoints
from services.common.grpc_auth import internal_token_authenticator
from services.common.grpcserver import start_grpc_server, stop_grpc_server
from services.common.internal_token import internal_token
from services.common.local_rpc import LocalServicer
from services.common.metrics import ServiceMetrics
from services.common.tls import tls_files
from services.objectstore import tempurl_routes
from services.objectstore.backends import Backend, make_backend
from services.objectstore.grpc_api import ObjectStoreServicer
from services.objectstore.sealed_objects import ObjectSealing
from services.objectstore.store import ObjectStore
from services.objectstore.sweeper import Sweeper
from services.objectstore.upload_front_door import UploadFrontDoor
from services.objectstore.upload_requests import HttpUploads

LOG = logging.getLogger(__name__)
SECRET_NAME = "temp_url"
SERVICE_NAME = pb.DESCRIPTOR.services_by_name["ObjectStore"].full_name


class ObjectStoreService:
    name = "objectstore"

    def __init__(self, settings: Settings, pool: asyncpg.Pool, endpoints: Endpoints | None = None) -> None:
        self.settings = settings
        self.pool = pool
        self.endpoints = endpoints if endpoints is not None else Endpoints()
        self.metrics = ServiceMetrics("objectstore")
        self.grpc_address = ""
        self.http_url = ""
        self.public_url = ""
        self.store: ObjectStore | None = None
        self._backend: Backend | None = None
        self._sweeper: Sweeper | None = None
        self._http: web.AppRunner | None = None
        self._listener: asyncio.Server | None = None
        self._front_doors: set[UploadFrontDoor] = set()
        self.http_guard: ConnectionGuard | None = None  # the HTTP port's connection bounds
        self._grpc: Any = None
        self._health: Any = None

    async def _secret(self) -> bytes:
        """The configured secret, else one generated once and kept in PostgreSQL,
        so temp URLs survive restarts and every replica accepts them."""
        configured = self.settings.objectstore.temp_url_secret
        if configured:
            return configured.encode()
        value = await SecretRepository(self.pool).get_or_create(SECRET_NAME)
        LOG.info(
            "using the generated temp URL secret stored in PostgreSQL (set FERRUM_OBJECTSTORE_TEMP_URL_SECRET "
            "to choose one)"
        )
        return value.encode()

    async def start(self) -> dict[str, str]:
        c = self.settings.objectstore
        sealing = ObjectSealing.from_settings(self.settings)  # a bad key file stops the start here
        repo = ObjectRepository(self.pool)
        self._backend = make_backend(c, self.settings.state_dir)
        await self._backend.start()
        secret = await self._secret()
        self.internal_token = await internal_token(self.settings, self.pool)

        # The public URL needs the bound port; the store gets it right after the bind,
        # before any gRPC call can ask for a temp URL.
        self.store = ObjectStore(c, repo, self._backend, secret=secret, public_url="", sealing=sealing)
        servicer = ObjectStoreServicer(self.store, self.metrics)
        uploads = HttpUploads(self.store)
        app = web.Application(middlewares=[request_context_middleware(self.metrics)])
        app.router.add_get("/metrics", self.metrics.handle)
        tempurl_routes.add_routes(app, self.store, uploads)
        port = await self._start_http(app, uploads, servicer)
        self.http_url = f"http://{_url_host(c.host)}:{port}"
        self.public_url = (c.public_url or self.http_url).rstrip("/")
        self.store.public_url = self.public_url
        if c.host in ("0.0.0.0", "::") and not c.public_url:
            LOG.warning(
                "objectstore listens on %s without FERRUM_OBJECTSTORE_PUBLIC_URL: temp URLs will name %s, "
                "which BMCs cannot reach",
                c.host,
                self.public_url,
            )

        self._grpc, grpc_port, self._health = await start_grpc_server(
            host=c.host,
            port=c.grpc_port,
            metrics=self.metrics,
            register=lambda server: pb_grpc.add_ObjectStoreServicer_to_server(servicer, server),
            service_names=[SERVICE_NAME],
            authenticate=internal_token_authenticator(self.internal_token),
            tls=tls_files(self.settings.security),  # the temp-URL HTTP port stays plain: BMCs and ramdisks fetch there
        )
        self.grpc_address = f"{_url_host(c.host)}:{grpc_port}"
        self.endpoints.objectstore_grpc = self.grpc_address
        # The conductor of this process stores config drives without gRPC.
        self.endpoints.servicers[self.grpc_address] = LocalServicer(
            servicer, pb.DESCRIPTOR.services_by_name["ObjectStore"], metrics=self.metrics
        )
        self._sweeper = Sweeper(self.store, interval=c.sweep_interval, orphan_grace=c.orphan_grace)
        self._sweeper.start()
        LOG.info(
            "objectstore started backend=%s grpc=%s public_url=%s",
            self._backend.name,
            self.grpc_address,
            self.public_url,
        )
        return {
            "objectstore gRPC": self.grpc_address,
            "objectstore HTTP": self.http_url,
            "objectstore temp URLs": f"{self.public_url}/t/...",
            "objectstore metrics": f"{self.http_url}/metrics",
        }

    async def _start_http(self, app: web.Application, uploads: HttpUploads, servicer: ObjectStoreServicer) -> int:
        """The HTTP port: UploadFrontDoor takes fast PUT uploads and hands every
        other connection to the aiohttp app. Returns the bound port."""
        c = self.settings.objectstore
        self._http = web.AppRunner(
            app, access_log=None, handle_signals=False, shutdown_timeout=5.0, keepalive_timeout=IDLE_TIMEOUT
        )
        await self._http.setup()
        aiohttp_server = self._http.server
        assert aiohttp_server is not None
        loop = asyncio.get_running_loop()
        guard = self.http_guard = ConnectionGuard(
            "objectstore",
            ListenerLimits(max_connections=c.http_max_connections, header_timeout=c.http_header_timeout),
        )
        try:
            self._listener = await loop.create_server(
                lambda: UploadFrontDoor(
                    uploads, aiohttp_server, self.metrics, servicer.bytes, self._front_doors, guard
                ),
                c.host,
                c.http_port,
                reuse_address=True,
                backlog=1024,
            )
        except OSError as exc:
            await self._http.cleanup()
            self._http = None
            raise OSError(f"cannot listen on {c.host}:{c.http_port}: {exc.strerror or exc}") from None
        guard.start()
        return int(self._listener.sockets[0].getsockname()[1])

    async def stop(self) -> None:
        if self._sweeper is not None:
            await self._sweeper.stop()
            self._sweeper = None
        if self._listener is not None:
            self._listener.close()
            self._listener = None
        if self.http_guard is not None:
            self.http_guard.stop()
        doors = list(self._front_doors)
        for door in doors:
            door.abort()  # an upload in progress stores nothing
        tasks = [door.task for door in doors if door.task is not None]
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        if self._http is not None:
            await self._http.cleanup()
            self._http = None
        self.endpoints.servicers.pop(self.grpc_address, None)
        if self._grpc is not None:
            await stop_grpc_server(self._grpc, self._health)
            self._grpc = None
        if self._backend is not None:
            await self._backend.close()
            self._backend = None


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host
