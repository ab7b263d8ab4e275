"""What every REST resource shares: the pool, the conductor router, the
settings, the node repository (most resources hang off a node), and the few request
helpers whose answer must not differ between resources (the public base URL,
body limits, node lookup by UUID or name, the RPC to a node's conductor).

It holds no resource logic; each resource module (``nodes``, ``ports``,
``portgroups``, ...) takes one of these, and ``routes`` wires them up.
"""

from __future__ import annotations

from typing import Any

import asyncpg
from aiohttp import web

from services.api.background import BackgroundWork
from services.api.conductor_router import ConductorRouter
from services.api.fresh_nodes import FreshNodes
from services.api.json_body import read_json
from services.common import errors
from services.common.config import ApiConfig, Settings
from services.common.db.node_secrets import NodeSecrets
from services.common.db.nodes import NodeRepository, is_uuid
from services.common.db.records import NodeRecord
from services.common.endpoints import Endpoints
from services.common.keyring import Keyring

NAMES_SINCE = (1, 5)


class ApiContext:
    def __init__(
        self,
        pool: asyncpg.Pool,
        router: ConductorRouter,
        settings: Settings,
        *,
        internal_token: str,
        endpoints: Endpoints | None = None,
        fresh: FreshNodes | None = None,
    ) -> None:
        self.pool = pool
        self.router = router
        self.settings = settings
        self.internal_token = internal_token  # presented to Ferrum's own gRPC services
        self.endpoints = endpoints if endpoints is not None else Endpoints()
        self.nodes = NodeRepository(pool, secrets=NodeSecrets(Keyring.from_config(settings.security)))
        self.background = BackgroundWork()  # what requests leave running; closed with the app
        self.fresh = fresh  # node documents known current, kept so by NOTIFY (services/api/fresh_nodes.py)

    @property
    def config(self) -> ApiConfig:
        return self.settings.api

    def base(self, request: web.Request) -> str:
        """The URL links start with: the configured public endpoint, else what the client called."""
        return (self.config.public_endpoint or f"{request.scheme}://{request.host}").rstrip("/")

    async def body(self, request: web.Request, *, provision: bool = False) -> Any:
        """The JSON body within the size and depth limits (provision requests carry config drives: larger)."""
        limit = self.config.max_json_body_size_provision if provision else self.config.max_json_body_size
        return await read_json(request, limit=limit, depth=self.config.max_json_body_depth)

    async def create_body(
        self, request: web.Request, what: str, allowed: set[str], versions: dict[str, tuple[int, int]]
    ) -> dict[str, Any]:
        """A create request's JSON object: only known keys, none newer than the version."""
        body = await self.body(request)
        if not isinstance(body, dict):
            raise errors.Invalid(f"A {what} must be a JSON object")
        unknown = set(body) - allowed
        if unknown:
            raise errors.InvalidParameterValue(
                f"Additional properties are not allowed ({', '.join(sorted(map(repr, unknown)))} unexpected)"
            )
        for key in body:
            since = versions.get(key)
            if since and since > request["version"]:
                raise errors.NotAcceptable(f"Field {key} is not supported at this API version")
        return body

    async def rpc(self, node: NodeRecord, method: str, message: Any) -> Any:
        """Call ``method`` on the conductor that owns ``node`` on the hash ring."""
        return await self.router.call(node["uuid"], node["driver"], node["conductor_group"], method, message)

    async def node_by_ident(self, request: web.Request) -> NodeRecord:
        """The node the path's ``{ident}`` names."""
        return await self.nodes.get_by_ident(self.node_ident(request))

    @staticmethod
    def node_ident(request: web.Request) -> str:
        """The path's ``{ident}``, a UUID or a name; names only count from 1.5, as in Ironic."""
        ident: str = request.match_info["ident"]
        if not is_uuid(ident) and request["version"] < NAMES_SINCE:
            raise errors.NodeNotFound(f"Node {ident} could not be found.")
        return ident
