"""Inspection rules (microversion 1.96): ``/v1/inspection_rules``.

Records the api writes itself, as deploy templates; the conductor runs the
stored rules of phase ``main`` after each in-band inspection
(services/conductor/inspection.py). A rule document is checked by
``services.common.inspection_rules.validate_rule`` (Ironic's schema and
``validate_rule``, its messages), on create and again after a patch.

As in Ironic: below 1.96 GET is 404 and POST, PATCH and DELETE are 405 (the
routes table gates them); the list shows ``uuid``, ``priority``, ``phase``
and ``description`` unless ``detail`` or ``fields`` ask for more; a
``sensitive`` rule shows ``null`` conditions and actions, and cannot be made
non-sensitive again; unknown query parameters are a 400. Where Ferrum
differs on purpose: links name ``inspection_rules`` (Ironic's code writes
``inspection``, a path it does not serve), and ``?phase=`` filters the list
(Ironic accepts it and ignores it). docs/api.md lists both.
"""

from __future__ import annotations

import json
import uuid as uuidlib
from collections.abc import Mapping
from typing import Any

from aiohttp import web

from services.api import params, views
from services.api.collection import next_link
from services.api.context import ApiContext
from services.api.json_patch import apply_patch
from services.common import errors
from services.common.db.inspection_rules import InspectionRuleRepository
from services.common.db.nodes import is_uuid
from services.common.db.records import InspectionRuleRecord
from services.common.db.rows import iso
from services.common.inspection_rules import validate_rule
from services.common.jsonutil import dumps

SINCE = (1, 96)
DOCUMENT_FIELDS = (
    "uuid",
    "created_at",
    "updated_at",
    "description",
    "priority",
    "sensitive",
    "phase",
    "conditions",
    "actions",
)
FIELDS: dict[str, tuple[int, int]] = dict.fromkeys((*DOCUMENT_FIELDS, "links"), SINCE)
LIST_FIELDS = ("uuid", "priority", "phase", "description")
CREATE_KEYS = {"uuid", "description", "phase", "priority", "sensitive", "conditions", "actions"}
LIST_QUERY = {"detail", "fields", "marker", "limit", "sort_key", "sort_dir", "phase"}
UNSORTABLE = ("conditions", "actions")
REMOVED_DEFAULTS: dict[str, Any] = {"phase": "main", "priority": 0, "sensitive": False, "conditions": []}


def _shown_operations(items: Any, *, condition: bool) -> Any:
    """Ironic's convert_conditions/convert_actions: op and args, plus loop (and
    multiple, for a condition) only when a loop is set; other keys are dropped."""
    if items is None:
        return None
    shown = []
    for item in items:
        doc = {"op": item.get("op"), "args": item.get("args", {})}
        if item.get("loop"):
            doc["loop"] = item["loop"]
            if condition:
                doc["multiple"] = item.get("multiple") or "any"
        shown.append(doc)
    return shown


def rule_document(row: InspectionRuleRecord, *, base: str, fields: Any = None) -> dict[str, Any]:
    sensitive = bool(row["sensitive"])
    doc: dict[str, Any] = {
        "uuid": str(row["uuid"]),
        "created_at": iso(row["created_at"]),
        "updated_at": iso(row["updated_at"]),
        "description": row["description"],
        "priority": row["priority"],
        "sensitive": sensitive,
        "phase": row["phase"],
        "conditions": None if sensitive else _shown_operations(row["conditions"], condition=True),
        "actions": None if sensitive else _shown_operations(row["actions"], condition=False),
        "links": views.links(base, "inspection_rules", str(row["uuid"])),
    }
    if fields is not None:
        doc = {k: v for k, v in doc.items() if k in set(fields) | {"links"}}
    return doc


def _rule_uuid(request: web.Request) -> str:
    ident = request.match_info["ident"]
    if not is_uuid(ident):
        raise errors.InvalidParameterValue(f"Expected a UUID for an inspection rule but received {ident}.")
    return ident


class InspectionRulesApi:
    def __init__(self, ctx: ApiContext) -> None:
        self.ctx = ctx
        self.repo = InspectionRuleRepository(ctx.pool)

    async def list_rules(self, request: web.Request) -> web.Response:
        q = request.query
        unknown = sorted(set(q) - LIST_QUERY)
        if unknown:
            raise errors.InvalidParameterValue(f"Unknown query parameter(s): {', '.join(unknown)}")
        fields = params.requested_fields(request, FIELDS)
        detail = params.flag(request, "detail")
        if detail and fields:
            raise errors.InvalidParameterValue("Can not specify ?detail=True and fields in the same request.")
        sort_key = q.get("sort_key", "id")
        if sort_key in UNSORTABLE:
            raise errors.InvalidParameterValue(f"The sort_key value {sort_key!r} is an invalid field for sorting")
        limit = params.page_limit(request, self.ctx.config.max_limit)
        rows = await self.repo.list(
            limit=limit,
            marker=q.get("marker"),
            sort_key=sort_key,
            sort_dir=q.get("sort_dir", "asc"),
            phase=q.get("phase"),
        )
        base = self.ctx.base(request)
        shown = None if detail else (fields or LIST_FIELDS)
        body: dict[str, Any] = {"inspection_rules": [rule_document(r, base=base, fields=shown) for r in rows]}
        following = next_link(request, rows, base=base, limit=limit)
        if following:
            body["next"] = following
        return web.json_response(body, dumps=dumps)

    async def get_rule(self, request: web.Request) -> web.Response:
        fields = params.requested_fields(request, FIELDS)
        row = await self.repo.get(_rule_uuid(request))
        return web.json_response(rule_document(row, base=self.ctx.base(request), fields=fields), dumps=dumps)

    async def create_rule(self, request: web.Request) -> web.Response:
        body = await self.ctx.create_body(request, "inspection rule", CREATE_KEYS, FIELDS)
        validate_rule(body)
        values = dict(body)
        if values.get("uuid") is None:
            values["uuid"] = str(uuidlib.uuid4())
        elif not is_uuid(values["uuid"]):
            raise errors.InvalidParameterValue(f"Expected a UUID but received {values['uuid']}.")
        row = await self.repo.create(values)
        doc = rule_document(row, base=self.ctx.base(request))
        return web.json_response(doc, status=201, dumps=dumps, headers={"Location": doc["links"][0]["href"]})

    async def patch_rule(self, request: web.Request) -> web.Response:
        row = await self.repo.get(_rule_uuid(request))
        patch = await self.ctx.body(request)
        editable = ("uuid", "description", "priority", "sensitive", "phase", "conditions", "actions")
        columns: Mapping[str, Any] = row
        current = json.loads(dumps({k: columns[k] for k in editable}))
        changes = apply_patch(current, patch, {"created_at", "updated_at", "links"}, FIELDS, request["version"])
        if row["sensitive"] and "sensitive" in changes and not changes["sensitive"]:
            raise errors.PatchError("Inspection rules cannot have the sensitive flag unset.")
        for key, default in REMOVED_DEFAULTS.items():  # a removed field goes back to its default
            if key in changes and changes[key] is None:
                changes[key] = default
        validate_rule({**current, **changes})
        if "uuid" in changes and not is_uuid(str(changes["uuid"])):
            raise errors.InvalidParameterValue(f"Expected a UUID but received {changes['uuid']}.")
        if changes:
            row = await self.repo.update(str(row["uuid"]), changes)
        return web.json_response(rule_document(row, base=self.ctx.base(request)), dumps=dumps)

    async def delete_rule(self, request: web.Request) -> web.Response:
        await self.repo.delete(_rule_uuid(request))
        return web.Response(status=204)
