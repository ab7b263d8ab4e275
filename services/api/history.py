"""Node history (microversion 1.78): ``GET /v1/nodes/{ident}/history`` and
``GET /v1/nodes/{ident}/history/{event}``.

Ironic returns ``uuid``, ``created_at``, ``severity`` and ``event`` in the
list (plus ``conductor``, ``user`` and ``event_type`` with ``detail=true``),
and the full entry for a single event. Below 1.78 the endpoint does not exist
(404), as Ironic answers for resources newer than the requested version.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from services.api import views
from services.api.rest import RestApi, _bool
from services.common.db.history import HistoryRepository
from services.common.db.rows import iso
from services.common.jsonutil import dumps

SINCE = (1, 78)
STANDARD_FIELDS = ("uuid", "created_at", "severity", "event")
DETAIL_FIELDS = ("uuid", "created_at", "severity", "event_type", "event", "conductor", "user")


def history_document(row: dict[str, Any], *, base: str, node_uuid: str, detail: bool) -> dict[str, Any]:
    """One history entry as Ironic renders it."""
    values = {
        "uuid": row["uuid"],
        "created_at": iso(row["created_at"]),
        "severity": row["severity"],
        "event_type": row["event_type"],
        "event": row["event"],
        "conductor": row["conductor"],
        "user": row["user_id"],
    }
    doc = {k: values[k] for k in (DETAIL_FIELDS if detail else STANDARD_FIELDS)}
    doc["links"] = views.links(base, f"nodes/{node_uuid}/history", row["uuid"])
    return doc


class HistoryApi:
    def __init__(self, rest: RestApi) -> None:
        self.rest = rest
        self.repo = HistoryRepository(rest.pool)

    def routes(self, app: web.Application) -> None:
        app.router.add_get("/v1/nodes/{ident}/history", self.list)
        app.router.add_get("/v1/nodes/{ident}/history/{event}", self.get)

    async def list(self, request: web.Request) -> web.Response:
        if request["version"] < SINCE:
            raise web.HTTPNotFound()
        q = request.query
        detail = _bool(q["detail"], "detail") if "detail" in q else False
        limit = self.rest._limit(request)
        node = await self.rest.node_by_ident(request)
        rows = await self.repo.list(node["id"], limit=limit, marker=q.get("marker"))
        base = self.rest.base(request)
        body: dict[str, Any] = {
            "history": [history_document(r, base=base, node_uuid=node["uuid"], detail=detail) for r in rows]
        }
        if len(rows) == limit and rows:
            extra = "&detail=True" if detail else ""
            body["next"] = f"{base}/v1/nodes/{node['uuid']}/history?limit={limit}&marker={rows[-1]['uuid']}{extra}"
        return web.json_response(body, dumps=dumps)

    async def get(self, request: web.Request) -> web.Response:
        if request["version"] < SINCE:
            raise web.HTTPNotFound()
        node = await self.rest.node_by_ident(request)
        row = await self.repo.get(node["id"], request.match_info["event"])
        doc = history_document(row, base=self.rest.base(request), node_uuid=node["uuid"], detail=True)
        return web.json_response(doc, dumps=dumps)
