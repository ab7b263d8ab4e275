"""Conductors (microversion 1.49): ``GET /v1/conductors`` and
``GET /v1/conductors/{hostname}``, read from the conductor registry.

As in Ironic, a list shows ``hostname``, ``conductor_group``, ``alive`` and
links; ``detail=true`` and the single-conductor view add ``drivers``,
``created_at`` and ``updated_at`` (the last heartbeat). Below 1.49 the
endpoint does not exist (404; the routes table gates it).
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from services.api import params, views
from services.api.collection import next_link
from services.api.context import ApiContext
from services.common import errors
from services.common.db.conductor_list import ConductorListRepository
from services.common.db.records import ConductorSummaryRecord
from services.common.db.rows import iso
from services.common.jsonutil import dumps

SINCE = (1, 49)
FIELDS: dict[str, tuple[int, int]] = dict.fromkeys(
    ("hostname", "conductor_group", "alive", "drivers", "created_at", "updated_at", "links"), SINCE
)
LIST_FIELDS = ("hostname", "conductor_group", "alive")
SORT_KEYS = {
    "id": "id",
    "hostname": "hostname",
    "conductor_group": "conductor_group",
    "created_at": "created_at",
    "updated_at": "heartbeat_at",
}


def conductor_document(row: ConductorSummaryRecord, *, base: str, fields: Any = None) -> dict[str, Any]:
    doc = {
        "hostname": row["hostname"],
        "conductor_group": row["conductor_group"],
        "alive": bool(row["alive"]),
        "drivers": sorted(row["hardware_types"]),
        "created_at": iso(row["created_at"]),
        "updated_at": iso(row["heartbeat_at"]),
        "links": views.links(base, "conductors", row["hostname"]),
    }
    if fields is not None:
        doc = {k: v for k, v in doc.items() if k in set(fields) | {"links"}}
    return doc


class ConductorsApi:
    def __init__(self, ctx: ApiContext) -> None:
        self.ctx = ctx
        self.repo = ConductorListRepository(ctx.pool)

    async def list_conductors(self, request: web.Request) -> web.Response:
        q = request.query
        fields = params.requested_fields(request, FIELDS)
        detail = params.flag(request, "detail")
        if detail and fields:
            raise errors.InvalidParameterValue("Can not specify ?detail=True and fields in the same request.")
        sort_key = q.get("sort_key", "id")
        if sort_key not in SORT_KEYS:
            raise errors.InvalidParameterValue(f"The sort_key value {sort_key!r} is an invalid field for sorting")
        limit = params.page_limit(request, self.ctx.config.max_limit)
        rows = await self.repo.list(
            heartbeat_timeout=self.ctx.router.heartbeat_timeout,
            limit=limit,
            marker=q.get("marker"),
            sort_key=SORT_KEYS[sort_key],
            sort_dir=q.get("sort_dir", "asc"),
        )
        base = self.ctx.base(request)
        shown = None if detail else (fields or LIST_FIELDS)
        body: dict[str, Any] = {"conductors": [conductor_document(r, base=base, fields=shown) for r in rows]}
        following = next_link(request, rows, base=base, limit=limit, marker_field="hostname")
        if following:
            body["next"] = following
        return web.json_response(body, dumps=dumps)

    async def get_conductor(self, request: web.Request) -> web.Response:
        fields = params.requested_fields(request, FIELDS)
        row = await self.repo.get(request.match_info["hostname"], heartbeat_timeout=self.ctx.router.heartbeat_timeout)
        return web.json_response(conductor_document(row, base=self.ctx.base(request), fields=fields), dumps=dumps)
