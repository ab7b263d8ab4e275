"""Node history (microversion 1.78): ``GET /v1/nodes/{ident}/history`` and
``GET /v1/nodes/{ident}/history/{event}``.

Ironic returns ``uuid``, ``created_at``, ``severity`` and ``event`` in the
list (plus ``conductor``, ``user`` and ``event_type`` with ``detail=true``),
and the full entry for a single event. Below 1.78 the endpoint does not exist
(404, the routes table gates it), as Ironic answers for resources newer than
the requested version.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from services.api import params, views
from services.api.collection import next_link
from services.api.context import ApiContext
from services.common.db.history import HistoryRepository
from services.common.db.rows import iso
from services.common.jsonutil import dumps
from services.common.secret_masking import mask_text

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
        "event": mask_text(row["event"]) if row["event"] else row["event"],
        "conductor": row["conductor"],
        "user": row["user_id"],
    }
    doc = {k: values[k] for k in (DETAIL_FIELDS if detail else STANDARD_FIELDS)}
    doc["links"] = views.links(base, f"nodes/{node_uuid}/history", row["uuid"])
    return doc


class NodeHistoryApi:
    def __init__(self, ctx: ApiContext) -> None:
        self.ctx = ctx
        self.repo = HistoryRepository(ctx.pool)

    async def list_history(self, request: web.Request) -> web.Response:
        q = request.query
        detail = params.flag(request, "detail")
        limit = params.page_limit(request, self.ctx.config.max_limit)
        node = await self.ctx.node_by_ident(request)
        rows = await self.repo.list(node["id"], limit=limit, marker=q.get("marker"))
        base = self.ctx.base(request)
        body: dict[str, Any] = {
            "history": [history_document(r, base=base, node_uuid=node["uuid"], detail=detail) for r in rows]
        }
        following = next_link(request, rows, base=base, limit=limit, path=f"/v1/nodes/{node['uuid']}/history")
        if following:
            body["next"] = following
        return web.json_response(body, dumps=dumps)

    async def get_event(self, request: web.Request) -> web.Response:
        node = await self.ctx.node_by_ident(request)
        row = await self.repo.get(node["id"], request.match_info["event"])
        doc = history_document(row, base=self.ctx.base(request), node_uuid=node["uuid"], detail=True)
        return web.json_response(doc, dumps=dumps)
