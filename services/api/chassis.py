"""Chassis (microversion 1.1): ``/v1/chassis`` (list, detail, create),
``/v1/chassis/{uuid}`` (get, patch, delete) and the nodes of a chassis,
``/v1/chassis/{uuid}/nodes[/detail]`` (served by :class:`NodesApi`).

A chassis is a record that groups nodes: a UUID, a description of at most
255 characters and ``extra``. It has no name, so only its UUID finds it. The
api writes these records itself, as it does deploy templates. A node joins a
chassis with ``chassis_uuid`` on create or patch. A chassis that still holds
nodes cannot be deleted (400, Ironic's ChassisNotEmpty).
"""

from __future__ import annotations

import json
import uuid as uuidlib
from typing import Any

from aiohttp import web

from services.api import params, views
from services.api.collection import next_link
from services.api.context import ApiContext
from services.api.json_patch import apply_patch
from services.common import errors
from services.common.db.chassis import ChassisRepository
from services.common.db.nodes import is_uuid
from services.common.db.records import ChassisRecord
from services.common.db.rows import iso
from services.common.jsonutil import dumps

FIELDS: dict[str, tuple[int, int]] = dict.fromkeys(
    ("uuid", "description", "extra", "created_at", "updated_at", "links", "nodes"), (1, 1)
)
LIST_FIELDS = ("uuid", "description")
CREATE_KEYS = {"uuid", "description", "extra"}
READONLY = {"created_at", "updated_at", "links", "nodes"}
MAX_DESCRIPTION = 255


def validate_chassis(values: dict[str, Any]) -> dict[str, Any]:
    """Ironic's CHASSIS_SCHEMA; any violation is a 400."""
    description = values.get("description")
    if description is not None and (not isinstance(description, str) or len(description) > MAX_DESCRIPTION):
        raise errors.InvalidParameterValue(f"description must be a string of at most {MAX_DESCRIPTION} characters")
    if "extra" in values and values["extra"] is None:
        values["extra"] = {}
    if "extra" in values and not isinstance(values["extra"], dict):
        raise errors.InvalidParameterValue("extra must be a JSON object")
    if values.get("uuid") is not None and (not isinstance(values["uuid"], str) or not is_uuid(values["uuid"])):
        raise errors.InvalidParameterValue(f"Expected a UUID but received {values['uuid']}.")
    return values


def chassis_document(row: ChassisRecord, *, base: str, fields: Any = None) -> dict[str, Any]:
    doc = {
        "uuid": row["uuid"],
        "description": row["description"],
        "extra": row["extra"],
        "created_at": iso(row["created_at"]),
        "updated_at": iso(row["updated_at"]),
        "links": views.links(base, "chassis", row["uuid"]),
        "nodes": views.links(base, "chassis", f"{row['uuid']}/nodes"),
    }
    if fields is not None:
        doc = {k: v for k, v in doc.items() if k in set(fields) | {"links"}}
    return doc


class ChassisApi:
    def __init__(self, ctx: ApiContext) -> None:
        self.ctx = ctx
        self.repo = ChassisRepository(ctx.pool)

    async def list_chassis(self, request: web.Request) -> web.Response:
        fields = params.requested_fields(request, FIELDS)
        detail = params.flag(request, "detail")
        if detail and fields:
            raise errors.InvalidParameterValue("Can not specify ?detail=True and fields in the same request.")
        return await self._list(request, None if detail else (fields or LIST_FIELDS))

    async def list_chassis_detail(self, request: web.Request) -> web.Response:
        return await self._list(request, None)

    async def _list(self, request: web.Request, shown: Any) -> web.Response:
        q = request.query
        if q.get("marker") is not None and not is_uuid(q["marker"]):
            raise errors.InvalidParameterValue(f"Expected a UUID but received {q['marker']}.")
        limit = params.page_limit(request, self.ctx.config.max_limit)
        rows = await self.repo.list(limit=limit, **params.page_order(request))
        base = self.ctx.base(request)
        body: dict[str, Any] = {"chassis": [chassis_document(r, base=base, fields=shown) for r in rows]}
        following = next_link(request, rows, base=base, limit=limit)
        if following:
            body["next"] = following
        return web.json_response(body, dumps=dumps)

    async def get_chassis(self, request: web.Request) -> web.Response:
        fields = params.requested_fields(request, FIELDS)
        row = await self._by_path(request)
        return web.json_response(chassis_document(row, base=self.ctx.base(request), fields=fields), dumps=dumps)

    async def create_chassis(self, request: web.Request) -> web.Response:
        body = await self.ctx.create_body(request, "chassis", CREATE_KEYS, FIELDS)
        values = validate_chassis(dict(body))
        values.setdefault("extra", {})
        if values.get("uuid") is None:
            values["uuid"] = str(uuidlib.uuid4())
        row = await self.repo.create(values)
        doc = chassis_document(row, base=self.ctx.base(request))
        return web.json_response(doc, status=201, dumps=dumps, headers={"Location": doc["links"][0]["href"]})

    async def patch_chassis(self, request: web.Request) -> web.Response:
        row = await self._by_path(request)
        patch = await self.ctx.body(request)
        current = json.loads(dumps({k: row[k] for k in ("uuid", "description", "extra")}))
        changes = apply_patch(current, patch, READONLY, FIELDS, request["version"])
        if "uuid" in changes and changes["uuid"] is None:
            raise errors.InvalidParameterValue("uuid cannot be removed from a chassis")
        validate_chassis(changes)
        if changes:
            row = await self.repo.update(row["uuid"], changes)
        return web.json_response(chassis_document(row, base=self.ctx.base(request)), dumps=dumps)

    async def delete_chassis(self, request: web.Request) -> web.Response:
        row = await self._by_path(request)
        await self.repo.delete(row["uuid"])
        return web.Response(status=204)

    async def _by_path(self, request: web.Request) -> ChassisRecord:
        """The chassis the path names; a value that is not a UUID is a 400, as in Ironic (args.uuid)."""
        ident = request.match_info["ident"]
        if not is_uuid(ident):
            raise errors.InvalidParameterValue(f"Expected a UUID but received {ident}.")
        return await self.repo.get(ident)
