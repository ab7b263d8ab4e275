"""A node's traits (microversion 1.37): ``GET|PUT|DELETE /v1/nodes/{ident}/traits``
and ``PUT|DELETE /v1/nodes/{ident}/traits/{trait}``.

Traits are node fields, so every change is an ``UpdateNode`` on the owning
conductor, which holds the node lock; the api checks names and the 50-trait
limit first. Below 1.37 the routes are 404 (the routes table gates them).
"""

from __future__ import annotations

from aiohttp import web

from ferrum.v1 import conductor_pb2 as cpb
from services.api.context import ApiContext
from services.api.validators import MAX_TRAITS, validate_trait
from services.common import errors
from services.common.db.records import NodeRecord
from services.common.jsonutil import dumps

SINCE = (1, 37)


class NodeTraitsApi:
    def __init__(self, ctx: ApiContext) -> None:
        self.ctx = ctx

    async def _save_traits(self, node: NodeRecord, traits: list[str]) -> web.Response:
        await self.ctx.rpc(
            node,
            "UpdateNode",
            cpb.ConductorUpdateNodeRequest(node_uuid=node["uuid"], changes_json=dumps({"traits": traits})),
        )
        return web.Response(status=204)

    async def list_traits(self, request: web.Request) -> web.Response:
        node = await self.ctx.node_by_ident(request)
        return web.json_response({"traits": sorted(node["traits"])})

    async def set_traits(self, request: web.Request) -> web.Response:
        node = await self.ctx.node_by_ident(request)
        body = await self.ctx.body(request)
        if not isinstance(body, dict) or set(body) != {"traits"} or not isinstance(body["traits"], list):
            raise errors.InvalidParameterValue('The body must be {"traits": [...]}')
        traits = sorted({validate_trait(t) for t in body["traits"]})
        if len(traits) > MAX_TRAITS:
            raise errors.InvalidParameterValue(f"Could not modify traits: a node can have at most {MAX_TRAITS} traits")
        return await self._save_traits(node, traits)

    async def clear_traits(self, request: web.Request) -> web.Response:
        return await self._save_traits(await self.ctx.node_by_ident(request), [])

    async def add_trait(self, request: web.Request) -> web.Response:
        node = await self.ctx.node_by_ident(request)
        trait = validate_trait(request.match_info["trait"])
        traits = sorted(set(node["traits"]) | {trait})
        if len(traits) > MAX_TRAITS:
            raise errors.InvalidParameterValue(f"Could not modify traits: a node can have at most {MAX_TRAITS} traits")
        return await self._save_traits(node, traits)

    async def remove_trait(self, request: web.Request) -> web.Response:
        node = await self.ctx.node_by_ident(request)
        trait = request.match_info["trait"]
        if trait not in node["traits"]:
            raise errors.NotFound(f"Node {node['uuid']} doesn't have a trait '{trait}'")
        return await self._save_traits(node, sorted(set(node["traits"]) - {trait}))
