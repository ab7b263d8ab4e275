"""Shards (microversion 1.82): ``GET /v1/shards``, every node ``shard`` value
with the number of nodes in it, most populated first, as Ironic's
``get_shard_list``: nodes without a shard count under the name ``"None"``
(Ironic renders the NULL group with ``str``). Not paginated (Ironic does not
either). Below 1.82 a 404 with Ironic's message.
"""

from __future__ import annotations

from aiohttp import web

from services.api.context import ApiContext
from services.common import errors

SINCE = (1, 82)


class ShardsApi:
    def __init__(self, ctx: ApiContext) -> None:
        self.ctx = ctx

    async def list_shards(self, request: web.Request) -> web.Response:
        if request["version"] < SINCE:
            raise errors.NotFound("The API version does not allow shards")
        counts = await self.ctx.nodes.shard_counts()
        return web.json_response({"shards": [{"name": str(name), "count": count} for name, count in counts]})
