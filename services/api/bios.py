"""A node's cached BIOS settings (microversion 1.40):
``GET /v1/nodes/{ident}/bios`` and ``GET /v1/nodes/{ident}/bios/{setting}``.

Settings are what the node's BIOS interface last read from the machine;
fake hardware has none, as in Ironic. From 1.74 the BIOS registry details
(attribute_type, allowable_values, bounds, lengths, read_only,
reset_required, unique) show with ``?detail=true`` on the list and always on
one setting, and ``?fields=`` picks columns; below 1.74 ``detail`` and
``fields`` are a 400, as Ironic answers. Below 1.40 both routes are 404.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from services.api import views
from services.api.rest import RestApi, _bool
from services.common import errors
from services.common.db.bios import BiosRepository
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
    row: dict[str, Any], *, base: str, node_uuid: str, registry: bool = False, fields: list[str] | None = None
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
    detail = _bool(q["detail"], "detail") if "detail" in q else None
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
        detail, fields = list_options(request)
        node = await self.rest.node_by_ident(request)
        base = self.rest.base(request)
        rows = await self.repo.list(node["id"])
        return web.json_response(
            {
                "bios": [
                    setting_document(r, base=base, node_uuid=node["uuid"], registry=detail, fields=fields) for r in rows
                ]
            },
            dumps=dumps,
        )

    async def get(self, request: web.Request) -> web.Response:
        if request["version"] < SINCE:
            raise web.HTTPNotFound()
        node = await self.rest.node_by_ident(request)
        row = await self.repo.get(node["id"], request.match_info["setting"])
        doc = setting_document(
            row, base=self.rest.base(request), node_uuid=node["uuid"], registry=request["version"] >= DETAIL_SINCE
        )
        return web.json_response({row["name"]: doc}, dumps=dumps)
