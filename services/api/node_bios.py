"""A node's cached BIOS settings (microversion 1.40):
``GET /v1/nodes/{ident}/bios`` and ``GET /v1/nodes/{ident}/bios/{setting}``.

Settings are what the node's BIOS interface last read from the machine;
fake hardware has none, as in Ironic. From 1.74 the BIOS registry details
(attribute_type, allowable_values, bounds, lengths, read_only,
reset_required, unique) show with ``?detail=true`` on the list and always on
one setting, and ``?fields=`` picks columns; below 1.74 ``detail`` and
``fields`` are a 400, as Ironic answers. Below 1.40 both routes are 404 (the
routes table gates them).
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from services.api import params, views
from services.api.context import ApiContext
from services.common import errors
from services.common.db.bios import BiosRepository
from services.common.db.records import BiosSettingRecord
from services.common.db.rows import iso
from services.common.jsonutil import dumps

SINCE = (1, 40)
DETAIL_SINCE = (1, 74)
REGISTRY_FIELDS = (
    "attribute_type",
    "allowable_values",
    "lower_bound",
    "max_length",
    "min_length",
    "read_only",
    "reset_required",
    "unique",
    "upper_bound",
)
FIELDS = ("name", "value", "created_at", "updated_at", *REGISTRY_FIELDS)


def setting_document(
    row: BiosSettingRecord, *, base: str, node_uuid: str, registry: bool = False, fields: list[str] | None = None
) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "name": row["name"],
        "value": row["value"],
        "created_at": iso(row["created_at"]),
        "updated_at": iso(row["updated_at"]),
    }
    if registry or fields is not None:
        doc.update({k: row.get(k) for k in REGISTRY_FIELDS})
    if fields is not None:
        doc = {k: v for k, v in doc.items() if k in fields}
    doc["links"] = views.links(base, f"nodes/{node_uuid}/bios", row["name"])
    return doc


def list_options(request: web.Request) -> tuple[bool, list[str] | None]:
    """``detail`` and ``fields`` of a list request: 400 below 1.74 and together, as in Ironic."""
    q = request.query
    detail = params.optional_bool(request, "detail")
    fields = [f.strip() for f in q["fields"].split(",") if f.strip()] if "fields" in q else None
    if request["version"] < DETAIL_SINCE:
        if detail is not None:
            raise errors.InvalidParameterValue(f"Invalid query parameter ?detail={q['detail']} received.")
        if fields is not None:
            raise errors.InvalidParameterValue(f"Invalid query parameter ?fields={q['fields']} received.")
    if detail and fields is not None:
        raise errors.InvalidParameterValue("Can not specify ?detail=True and fields in the same request.")
    for name in fields or ():
        if name not in FIELDS:
            raise errors.InvalidParameterValue(f'Field(s) "{name}" are not valid')
    return bool(detail), fields or None


class NodeBiosApi:
    def __init__(self, ctx: ApiContext) -> None:
        self.ctx = ctx
        self.repo = BiosRepository(ctx.pool)

    async def list_settings(self, request: web.Request) -> web.Response:
        detail, fields = list_options(request)
        node = await self.ctx.node_by_ident(request)
        base = self.ctx.base(request)
        rows = await self.repo.list(node["id"])
        return web.json_response(
            {
                "bios": [
                    setting_document(r, base=base, node_uuid=node["uuid"], registry=detail, fields=fields) for r in rows
                ]
            },
            dumps=dumps,
        )

    async def get_setting(self, request: web.Request) -> web.Response:
        node = await self.ctx.node_by_ident(request)
        row = await self.repo.get(node["id"], request.match_info["setting"])
        doc = setting_document(
            row, base=self.ctx.base(request), node_uuid=node["uuid"], registry=request["version"] >= DETAIL_SINCE
        )
        return web.json_response({row["name"]: doc}, dumps=dumps)
