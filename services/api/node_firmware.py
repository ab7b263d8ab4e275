"""Node firmware components (microversion 1.86): ``GET /v1/nodes/{ident}/firmware``.

What the node's firmware interface last read from the BMC
(``firmware_components``, migration 0017; refreshed when the node is verified
and when cleaning starts, services/conductor/firmware_cache.py). Read straight
from the database, as the inventory is. 404 below 1.86 with Ironic's message. As Ironic: ``?fields=`` picks among the component fields
(``created_at`` and ``updated_at`` always come); ``vendor``, ``model`` and
``serial_number`` are shown from 1.114 and are a 400 in ``fields`` below it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from aiohttp import web

from services.api.context import ApiContext
from services.common import errors
from services.common.db.firmware import IDENTITY, FirmwareRepository
from services.common.db.records import FirmwareComponentRecord
from services.common.db.rows import iso
from services.common.jsonutil import dumps

SINCE = (1, 86)
IDENTITY_SINCE = (1, 114)
DEFAULT_FIELDS = ("component", "initial_version", "current_version", "last_version_flashed")


class NodeFirmwareApi:
    def __init__(self, ctx: ApiContext) -> None:
        self.ctx = ctx
        self.repo = FirmwareRepository(ctx.pool)

    async def list_firmware(self, request: web.Request) -> web.Response:
        if request["version"] < SINCE:
            raise errors.NotFound("The API version does not allow node firmware")
        fields = self._fields(request)
        node = await self.ctx.node_by_ident(request)
        components = await self.repo.list(node["id"])
        return web.json_response({"firmware": [component_document(c, fields) for c in components]}, dumps=dumps)

    @staticmethod
    def _fields(request: web.Request) -> tuple[str, ...]:
        identity = request["version"] >= IDENTITY_SINCE
        known = DEFAULT_FIELDS + IDENTITY if identity else DEFAULT_FIELDS
        raw = request.query.get("fields")
        if raw is None:
            return known
        wanted = tuple(f.strip() for f in raw.split(",") if f.strip())
        too_new = sorted(set(wanted) & set(IDENTITY)) if not identity else []
        if too_new:
            raise errors.InvalidParameterValue(
                f"Fields {', '.join(too_new)} are not allowed in this API version. "
                f"They require at least API version {IDENTITY_SINCE[0]}.{IDENTITY_SINCE[1]}."
            )
        unknown = [f for f in wanted if f not in known and f not in ("created_at", "updated_at")]
        if unknown:
            raise errors.InvalidParameterValue(f'Field(s) "{", ".join(unknown)}" are not valid')
        return wanted


def component_document(row: FirmwareComponentRecord, fields: tuple[str, ...]) -> dict[str, Any]:
    doc: dict[str, Any] = {"created_at": iso(row["created_at"]), "updated_at": iso(row["updated_at"])}
    columns: Mapping[str, Any] = row
    doc.update({name: columns[name] for name in fields if name not in doc})
    return doc
