"""Deploy templates (microversion 1.55): named lists of deploy steps that a
node picks up when its instance asks for the matching trait.

These are records, not hardware actions, so the api writes them itself, as it
does volume records. The name must be a valid trait (CUSTOM_... or a standard
one); each step is ``{"interface", "step", "args", "priority"}`` and the same
(interface, step) may appear only once. Below 1.55 every route is 404 (the
routes table gates them).
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
from services.api.validators import validate_trait
from services.common import errors
from services.common.db.deploy_templates import DeployTemplateRepository
from services.common.db.nodes import is_uuid
from services.common.db.records import DeployTemplateRecord
from services.common.db.rows import iso
from services.common.jsonutil import dumps
from services.common.secret_masking import mask_dict

SINCE = (1, 55)
FIELDS: dict[str, tuple[int, int]] = dict.fromkeys(
    ("uuid", "name", "steps", "extra", "created_at", "updated_at", "links"), SINCE
)
LIST_FIELDS = ("uuid", "name")
CREATE_KEYS = {"uuid", "name", "steps", "extra"}
STEP_INTERFACES = ("bios", "deploy", "firmware", "management", "raid")
STEP_KEYS = {"interface", "step", "args", "priority"}


def validate_steps(steps: Any) -> list[dict[str, Any]]:
    """Ironic's deploy template step rules; any violation is a 400."""
    if not isinstance(steps, list) or not steps:
        raise errors.InvalidParameterValue("steps must be a non-empty list")
    seen = set()
    for step in steps:
        if not isinstance(step, dict) or set(step) != STEP_KEYS:
            raise errors.InvalidParameterValue(
                f"Invalid deploy step {step!r}: it needs exactly interface, step, args and priority"
            )
        if step["interface"] not in STEP_INTERFACES:
            raise errors.InvalidParameterValue(
                f"Invalid deploy step interface {step['interface']!r}: one of {', '.join(STEP_INTERFACES)}"
            )
        if not isinstance(step["step"], str) or not step["step"] or len(step["step"]) > 255:
            raise errors.InvalidParameterValue("A deploy step's step must be a non-empty string")
        if not isinstance(step["args"], dict):
            raise errors.InvalidParameterValue("A deploy step's args must be an object")
        priority = step["priority"]
        if isinstance(priority, bool) or not isinstance(priority, int) or not 0 <= priority <= 2**31 - 1:
            raise errors.InvalidParameterValue("A deploy step's priority must be a non-negative integer")
        key = (step["interface"], step["step"])
        if key in seen:
            raise errors.InvalidParameterValue(f"Duplicate deploy steps for {key[0]}.{key[1]}")
        seen.add(key)
    return steps


def validate_template(values: dict[str, Any]) -> dict[str, Any]:
    if "name" in values:
        validate_trait(values["name"])
    if "steps" in values:
        validate_steps(values["steps"])
    if "extra" in values and not isinstance(values["extra"], dict):
        raise errors.InvalidParameterValue("extra must be a JSON object")
    if "uuid" in values and (not isinstance(values["uuid"], str) or not is_uuid(values["uuid"])):
        raise errors.InvalidParameterValue(f"Expected a UUID but received {values['uuid']}.")
    return values


def mask_step(step: Any) -> Any:
    """A step with the secrets in its arguments masked, as Ironic shows templates."""
    if isinstance(step, dict) and isinstance(step.get("args"), dict):
        return {**step, "args": mask_dict(step["args"])}
    return step


def template_document(row: DeployTemplateRecord, *, base: str, fields: Any = None) -> dict[str, Any]:
    doc = {
        "uuid": row["uuid"],
        "name": row["name"],
        "steps": [mask_step(step) for step in row["steps"]],
        "extra": row["extra"],
        "created_at": iso(row["created_at"]),
        "updated_at": iso(row["updated_at"]),
        "links": views.links(base, "deploy_templates", row["uuid"]),
    }
    if fields is not None:
        doc = {k: v for k, v in doc.items() if k in set(fields) | {"links"}}
    return doc


class DeployTemplatesApi:
    def __init__(self, ctx: ApiContext) -> None:
        self.ctx = ctx
        self.repo = DeployTemplateRepository(ctx.pool)

    async def list_templates(self, request: web.Request) -> web.Response:
        fields = params.requested_fields(request, FIELDS)
        detail = params.flag(request, "detail")
        if detail and fields:
            raise errors.InvalidParameterValue("Can not specify ?detail=True and fields in the same request.")
        limit = params.page_limit(request, self.ctx.config.max_limit)
        rows = await self.repo.list(limit=limit, **params.page_order(request))
        base = self.ctx.base(request)
        shown = None if detail else (fields or LIST_FIELDS)
        body: dict[str, Any] = {"deploy_templates": [template_document(r, base=base, fields=shown) for r in rows]}
        following = next_link(request, rows, base=base, limit=limit)
        if following:
            body["next"] = following
        return web.json_response(body, dumps=dumps)

    async def get_template(self, request: web.Request) -> web.Response:
        fields = params.requested_fields(request, FIELDS)
        row = await self.repo.get(request.match_info["ident"])
        return web.json_response(template_document(row, base=self.ctx.base(request), fields=fields), dumps=dumps)

    async def create_template(self, request: web.Request) -> web.Response:
        body = await self.ctx.create_body(request, "deploy template", CREATE_KEYS, FIELDS)
        missing = [k for k in ("name", "steps") if k not in body]
        if missing:
            raise errors.InvalidParameterValue(f"Missing mandatory field(s): {', '.join(missing)}")
        values = validate_template(dict(body))
        values.setdefault("extra", {})
        if values.get("uuid") is None:
            values["uuid"] = str(uuidlib.uuid4())
        row = await self.repo.create(values)
        doc = template_document(row, base=self.ctx.base(request))
        return web.json_response(doc, status=201, dumps=dumps, headers={"Location": doc["links"][0]["href"]})

    async def patch_template(self, request: web.Request) -> web.Response:
        row = await self.repo.get(request.match_info["ident"])
        patch = await self.ctx.body(request)
        current = json.loads(dumps({k: row[k] for k in ("uuid", "name", "steps", "extra")}))
        changes = apply_patch(current, patch, {"uuid", "created_at", "updated_at", "links"}, FIELDS, request["version"])
        if "extra" in changes and changes["extra"] is None:  # removing /extra empties it
            changes["extra"] = {}
        validate_template(changes)
        if set(changes) - {"name", "steps", "extra"}:
            raise errors.PatchError(f"Cannot remove or change {sorted(set(changes) - {'name', 'steps', 'extra'})}")
        if changes:
            row = await self.repo.update(row["uuid"], changes)
        return web.json_response(template_document(row, base=self.ctx.base(request)), dumps=dumps)

    async def delete_template(self, request: web.Request) -> web.Response:
        row = await self.repo.get(request.match_info["ident"])
        await self.repo.delete(row["uuid"])
        return web.Response(status=204)
