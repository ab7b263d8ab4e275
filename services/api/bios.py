"""A node's cached BIOS settings (microversion 1.40):
``GET /v1/nodes/{ident}/bios`` and ``GET /v1/nodes/{ident}/bios/{setting}``.

Settings are what the node's BIOS interface last read from the machine;
fake hardware has none, as in Ironic. The 1.74 attribute details
(attribute_type, bounds, ...) are stored but not shown until the advertised
maximum reaches 1.74. Below 1.40 both routes are 404.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from services.api import views
from services.api.rest import RestApi
from services.common.db.bios import BiosRepository
from services.common.db.rows import iso
from services.common.jsonutil import dumps

SINCE = (1, 40)


def setting_document(row: dict[str, Any], *, base: str, node_uuid: str) -> dict[str, Any]:
    return {
        "name": row["name"], "value": row["value"], "created_at": iso(row["created_at"]),
        "updated_at": iso(row["updated_at"]), "links": views.links(base, f"nodes/{node_uuid}/bios", row["name"]),
    }


class BiosApi:
    def __init__(self, rest: RestApi) -> None:
        self.rest = rest
        self.repo = BiosRepository(rest.pool)

    def routes(self, app: web.Application) -> None:
        app.router.add_get("/v1/nodes/{ident}/bios", self.list)
        app.router.add_get("/v1/nodes/{ident}/bios/{setting}", self.get)

    async def list(self, request: web.Request) -> web.Response:
        if request["version"] < SINCE:
            raise web.HTTPNotFound()
        node = await self.rest.node_by_ident(request)
        base = self.rest.base(request)
        rows = await self.repo.list(node["id"])
        return web.json_response({"bios": [setting_document(r, base=base, node_uuid=node["uuid"]) for r in rows]},
                                 dumps=dumps)

    async def get(self, request: web.Request) -> web.Response:
        if request["version"] < SINCE:
            raise web.HTTPNotFound()
        node = await self.rest.node_by_ident(request)
        row = await self.repo.get(node["id"], request.match_info["setting"])
        doc = setting_document(row, base=self.rest.base(request), node_uuid=node["uuid"])
        return web.json_response({row["name"]: doc}, dumps=dumps)
