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
from services.common.db.records import NodeHistoryRecord
from services.common.db.rows import iso
from services.common.jsonutil import dumps
from services.common.secret_masking import mask_text

SINCE = (1, 78)
STANDARD_FIELDS = ("uuid", "created_at", "severity", "event")
DETAIL_FIELDS = ("uuid", "created_at", "severity", "event_type", "event", "conductor", "user")
PROJECT_SINCE = (1, 113)  # detail gains the project behind the event
STATE_FIELDS_SINCE = (1, 115)  # detail gains state, target_provision_state, duration_seconds


def detail_fields(version: tuple[int, int]) -> tuple[str, ...]:
    """The fields of a detailed entry at ``version``."""
    fields: tuple[str, ...] = DETAIL_FIELDS
    if version >= PROJECT_SINCE:
        fields += ("project",)
    if version >= STATE_FIELDS_SINCE:
        fields += ("state", "target_provision_state", "duration_seconds")
    return fields


def history_document(
    row: NodeHistoryRecord, *, base: str, node_uuid: str, detail: bool, version: tuple[int, int] = SINCE
) -> dict[str, Any]:
    """One history entry as Ironic renders it at ``version``."""
    values: dict[str, Any] = {
        "uuid": row["uuid"],
        "created_at": iso(row["created_at"]),
        "severity": row["severity"],
        "event_type": row["event_type"],
        "event": mask_text(row["event"]) if row["event"] else row["event"],
        "conductor": row["conductor"],
        "user": row["user_id"],
        "project": row.get("project"),
        "state": row.get("state"),
        "target_provision_state": row.get("target_provision_state"),
        "duration_seconds": row.get("duration_seconds"),
    }
    doc = {k: values[k] for k in (detail_fields(version) if detail else STANDARD_FIELDS)}
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
            "history": [
                history_document(r, base=base, node_uuid=node["uuid"], detail=detail, version=request["version"])
                for r in rows
            ]
        }
        following = next_link(request, rows, base=base, limit=limit, path=f"/v1/nodes/{node['uuid']}/history")
        if following:
            body["next"] = following
        return web.json_response(body, dumps=dumps)

    async def get_event(self, request: web.Request) -> web.Response:
        node = await self.ctx.node_by_ident(request)
        row = await self.repo.get(node["id"], request.match_info["event"])
        doc = history_document(
            row, base=self.ctx.base(request), node_uuid=node["uuid"], detail=True, version=request["version"]
        )
        return web.json_response(doc, dumps=dumps)
