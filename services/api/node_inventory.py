"""Node inventory (microversion 1.81): ``GET /v1/nodes/{ident}/inventory``.

What the last successful in-band inspection stored (``node_inventory``,
migration 0012): the agent's hardware inventory and the rest of its post
(``plugin_data``, as inspection rules left it). Read straight from the
database, as node history is. 404 below 1.81 (the routes table gates it),
and 404 with Ironic's message when nothing was stored.
"""

from __future__ import annotations

from aiohttp import web

from services.api.context import ApiContext
from services.common.db.inventory import InventoryRepository
from services.common.jsonutil import dumps

SINCE = (1, 81)


class NodeInventoryApi:
    def __init__(self, ctx: ApiContext) -> None:
        self.ctx = ctx
        self.repo = InventoryRepository(ctx.pool)

    async def get_inventory(self, request: web.Request) -> web.Response:
        node = await self.ctx.node_by_ident(request)
        stored = await self.repo.get(node["id"], node["uuid"])
        return web.json_response({"inventory": stored["inventory"], "plugin_data": stored["plugin_data"]}, dumps=dumps)
