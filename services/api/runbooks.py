"""Runbooks (microversion 1.92; traits and ``description`` 1.112): named,
ordered lists of clean or service steps a node may run instead of steps given
in the provision request (:mod:`services.api.runbook_use`).

``/v1/runbooks`` CRUD with JSON PATCH, and from 1.112
``/v1/runbooks/{ident}/traits[/{trait}]``. These are records, so the api
writes them itself, as it does deploy templates. Below 1.92 a read is a 404
and a write a 405, as Ironic's controller answers; the traits routes are a
404 below 1.112.

Ownership follows Ironic's policy for a caller that is either system scoped
(Ferrum's default: no Keystone) or acts for the project named in
``X-Project-Id`` (:mod:`services.common.request_project`): a project creates
runbooks it owns (never public ones, never for another project), sees its own
and the public ones, and may change or delete only its own (403 otherwise).
"""

from __future__ import annotations

import json
import re
import uuid as uuidlib
from typing import Any

from aiohttp import web

from services.api import params, views
from services.api.collection import next_link
from services.api.context import ApiContext
from services.api.json_patch import apply_patch
from services.api.validators import validate_trait
from services.common import errors
from services.common.conductor_messages import is_step_order
from services.common.db.nodes import is_uuid
from services.common.db.records import RunbookRecord, RunbookStep
from services.common.db.rows import iso
from services.common.db.runbooks import RunbookRepository
from services.common.jsonutil import dumps
from services.common.request_project import project_var
from services.common.secret_masking import mask_dict

SINCE = (1, 92)
TRAITS_SINCE = (1, 112)  # traits, description, and names that need not be traits
FIELDS: dict[str, tuple[int, int]] = {
    **dict.fromkeys(
        (
            "uuid",
            "name",
            "steps",
            "disable_ramdisk",
            "extra",
            "public",
            "owner",
            "created_at",
            "updated_at",
            "links",
        ),
        SINCE,
    ),
    "description": TRAITS_SINCE,
    "traits": TRAITS_SINCE,
}
LIST_FIELDS = ("uuid", "name")
CREATE_KEYS = {"uuid", "name", "steps", "disable_ramdisk", "extra", "public", "owner", "description"}
PATCHABLE = ("disable_ramdisk", "extra", "name", "owner", "public", "steps")
# Ironic's CLEANING_INTERFACE_PRIORITY: the interfaces that have clean and service steps.
STEP_INTERFACES = ("vendor", "power", "management", "firmware", "deploy", "bios", "raid")
STEP_KEYS = {"interface", "step", "args", "order"}
NAME_RE = re.compile(r"^[A-Za-z0-9\-._~]{1,255}$")  # 1.112: any logical name (Ironic's RUNBOOK_NAME_SCHEMA)


def validate_steps(steps: Any) -> list[dict[str, Any]]:
    """Ironic's RUNBOOK_STEP_SCHEMA (interface, step and order required; args optional;
    nothing else) and no (interface, step) twice; any violation is a 400."""
    if not isinstance(steps, list) or not steps:
        raise errors.InvalidParameterValue("steps must be a non-empty list")
    seen: set[tuple[str, str]] = set()
    for step in steps:
        if (
            not isinstance(step, dict)
            or set(step) - STEP_KEYS
            or not {"interface", "step", "order"} <= set(step)
            or step["interface"] not in STEP_INTERFACES
            or not isinstance(step["step"], str)
            or not step["step"]
            or not isinstance(step.get("args", {}), dict)
            or not is_step_order(step["order"])
        ):
            raise errors.InvalidParameterValue(
                f'Invalid runbook step {step!r}: expected {{"interface": one of {", ".join(STEP_INTERFACES)}, '
                '"step": name, "args"?: object, "order": integer >= 0}'
            )
        key = (step["interface"], step["step"])
        if key in seen:
            raise errors.InvalidParameterValue(
                "Duplicate deploy steps. A template cannot have multiple deploy steps with the same interface "
                f"and step. Duplicates: interface: {key[0]}, step: {key[1]}"
            )
        seen.add(key)
    return [{**s, "args": s.get("args", {})} for s in steps]


def validate_name(name: Any, version: tuple[int, int]) -> str:
    """Below 1.112 a runbook's name is a trait; from 1.112 any logical name."""
    if version < TRAITS_SINCE:
        return validate_trait(name)
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise errors.InvalidParameterValue(
            f"Invalid runbook name {name!r}: 1 to 255 letters, digits, '-', '.', '_' or '~'"
        )
    return name


def validate_runbook(values: dict[str, Any], version: tuple[int, int]) -> dict[str, Any]:
    out = dict(values)
    if "name" in out:
        validate_name(out["name"], version)
    if "steps" in out:
        out["steps"] = validate_steps(out["steps"])
    for key in ("extra",):
        if key in out and out[key] is None:
            out[key] = {}
        elif key in out and not isinstance(out[key], dict):
            raise errors.InvalidParameterValue(f"{key} must be a JSON object")
    for key in ("public", "disable_ramdisk"):
        if key in out and out[key] is None:
            out[key] = False
        elif key in out and not isinstance(out[key], bool):
            raise errors.InvalidParameterValue(f"{key} must be a boolean")
    for key in ("owner", "description"):
        if out.get(key) is not None and (not isinstance(out[key], str) or len(out[key]) > 255):
            raise errors.InvalidParameterValue(f"{key} must be a string of at most 255 characters")
    if "uuid" in out and out["uuid"] is not None and (not isinstance(out["uuid"], str) or not is_uuid(out["uuid"])):
        raise errors.InvalidParameterValue(f"Expected a UUID but received {out['uuid']}.")
    return out


def step_document(step: RunbookStep) -> dict[str, Any]:
    """Ironic's convert_steps, with secrets in the arguments masked."""
    doc: dict[str, Any] = {
        "interface": step["interface"],
        "step": step["step"],
        "args": mask_dict(step.get("args") or {}),
    }
    if "order" in step:
        doc["order"] = step["order"]
    return doc


def runbook_document(row: RunbookRecord, *, base: str, version: tuple[int, int], fields: Any = None) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "uuid": str(row["uuid"]),
        "name": row["name"],
        "steps": [step_document(s) for s in row["steps"]],
        "disable_ramdisk": row["disable_ramdisk"],
        "extra": row["extra"],
        "public": row["public"],
        "owner": row["owner"],
        "created_at": iso(row["created_at"]),
        "updated_at": iso(row["updated_at"]),
        "links": views.links(base, "runbooks", str(row["uuid"])),
    }
    if version >= TRAITS_SINCE:
        doc["description"] = row.get("description")
        doc["traits"] = list(row.get("traits") or [])
    if fields is not None:
        doc = {k: v for k, v in doc.items() if k in set(fields) | {"links"}}
    return doc


def may_read(row: RunbookRecord, project: str | None) -> bool:
    """System scope reads every runbook; a project its own and the public ones."""
    return project is None or row["owner"] == project or bool(row["public"])


def may_change(row: RunbookRecord, project: str | None) -> bool:
    """System scope changes every runbook; a project only its own (Ironic's RUNBOOK_ADMIN)."""
    return project is None or row["owner"] == project


def forbidden(row: RunbookRecord) -> errors.Forbidden:
    return errors.Forbidden(f"Access was denied to runbook {row['uuid']}.")


class RunbooksApi:
    def __init__(self, ctx: ApiContext) -> None:
        self.ctx = ctx
        self.repo = RunbookRepository(ctx.pool)

    async def _readable(self, request: web.Request) -> RunbookRecord:
        row = await self.repo.get(request.match_info["ident"])
        if not may_read(row, project_var.get()):
            raise forbidden(row)
        return row

    async def _changeable(self, request: web.Request) -> RunbookRecord:
        row = await self.repo.get(request.match_info["ident"])
        if not may_change(row, project_var.get()):
            raise forbidden(row)
        return row

    async def list_runbooks(self, request: web.Request) -> web.Response:
        fields = params.requested_fields(request, FIELDS)
        detail = params.flag(request, "detail")
        if detail and fields:
            raise errors.InvalidParameterValue("Can not specify ?detail=True and fields in the same request.")
        limit = params.page_limit(request, self.ctx.config.max_limit)
        rows = await self.repo.list(
            limit=limit,
            **params.page_order(request),
            visible_to=project_var.get(),
        )
        base, version = self.ctx.base(request), request["version"]
        shown = None if detail else (fields or LIST_FIELDS)
        body: dict[str, Any] = {
            "runbooks": [runbook_document(r, base=base, version=version, fields=shown) for r in rows]
        }
        following = next_link(request, rows, base=base, limit=limit)
        if following:
            body["next"] = following
        return web.json_response(body, dumps=dumps)

    async def get_runbook(self, request: web.Request) -> web.Response:
        fields = params.requested_fields(request, FIELDS)
        row = await self._readable(request)
        doc = runbook_document(row, base=self.ctx.base(request), version=request["version"], fields=fields)
        return web.json_response(doc, dumps=dumps)

    async def create_runbook(self, request: web.Request) -> web.Response:
        version = request["version"]
        body = await self.ctx.create_body(request, "runbook", CREATE_KEYS, FIELDS)
        missing = [k for k in ("name", "steps") if k not in body]
        if missing:
            raise errors.InvalidParameterValue(f"Missing mandatory field(s): {', '.join(missing)}")
        values = validate_runbook(body, version)
        project = project_var.get()
        if project is not None:  # Ironic: a project-scoped caller creates runbooks of its own project
            if values.get("owner") and values["owner"] != project:
                raise errors.Invalid(
                    "Cannot create a runbook as a project scoped admin with an owner other than your own project."
                )
            if values.get("public"):
                raise errors.Invalid("Cannot create a public runbook as a project scoped admin.")
            values["owner"] = project
        if values.get("uuid") is None:
            values["uuid"] = str(uuidlib.uuid4())
        row = await self.repo.create({k: v for k, v in values.items() if v is not None or k == "owner"})
        doc = runbook_document(row, base=self.ctx.base(request), version=version)
        return web.json_response(doc, status=201, dumps=dumps, headers={"Location": doc["links"][0]["href"]})

    async def patch_runbook(self, request: web.Request) -> web.Response:
        version = request["version"]
        patch = await self.ctx.body(request)
        if not isinstance(patch, list) or not all(
            isinstance(op, dict) and isinstance(op.get("path"), str) for op in patch
        ):
            raise errors.PatchError("The patch must be a non-empty JSON list of operations, each with a path")
        allowed = PATCHABLE + (("description",) if version >= TRAITS_SINCE else ())
        for op in patch:
            if op["path"].split("/")[1 if op["path"].startswith("/") else 0] not in allowed:
                raise errors.Invalid(
                    f"Cannot patch {op['path']}. Only the following can be updated: {', '.join(allowed)}"
                )
        row = await self._changeable(request)
        project = project_var.get()
        current = json.loads(dumps({k: row.get(k) for k in (*PATCHABLE, "description")}))
        owner_ops = [op for op in patch if op["path"] == "/owner" and op.get("op") != "remove"]
        public_ops = [op for op in patch if op["path"] == "/public" and op.get("op") != "remove"]
        if owner_ops:
            # Ironic: an owned runbook may be made non-public and given an owner in one patch; a public one has none.
            public_value = public_ops[0].get("value") if public_ops else False
            if (current["public"] and not public_ops) or public_value:
                raise errors.PatchError("There cannot be an owner for a public runbook")
        shed_owner = bool(public_ops) and project is None
        if shed_owner:
            current["owner"] = None  # a change of public sheds the owner, unless the patch names one
        changes = apply_patch(current, patch, set(), FIELDS, version)
        if shed_owner and row["owner"] is not None and "owner" not in changes:
            changes["owner"] = None
        if project is not None and (changes.get("public") or ("owner" in changes and changes["owner"] != project)):
            raise errors.Invalid("A project scoped admin cannot make a runbook public or give it to another project.")
        for key in ("name", "steps"):
            if key in changes and changes[key] is None:
                raise errors.PatchError(f"'/{key}' is a mandatory attribute and can not be removed")
        # Patches check names as 1.112 does at every version, so a name stored by a newer client stays patchable.
        changes = validate_runbook(changes, max(version, TRAITS_SINCE))
        if changes:
            row = await self.repo.update(str(row["uuid"]), changes)
        return web.json_response(runbook_document(row, base=self.ctx.base(request), version=version), dumps=dumps)

    async def delete_runbook(self, request: web.Request) -> web.Response:
        row = await self._changeable(request)
        await self.repo.delete(str(row["uuid"]))
        return web.Response(status=204)

    # -- /v1/runbooks/{ident}/traits (1.112) ---------------------------------------------------------

    async def list_traits(self, request: web.Request) -> web.Response:
        row = await self._readable(request)
        return web.json_response({"traits": list(row["traits"])})

    async def set_traits(self, request: web.Request) -> web.Response:
        """Replace every trait: ``{"traits": [...]}``."""
        row = await self._changeable(request)
        body = await self.ctx.body(request) if request.can_read_body else None
        if not isinstance(body, dict) or set(body) != {"traits"} or not isinstance(body["traits"], list):
            raise errors.Invalid(
                "A single runbook trait may be added via PUT /v1/runbooks/<runbook identifier>/traits/<trait> "
                "with no body, or all runbook traits may be replaced via PUT /v1/runbooks/<runbook identifier>"
                "/traits with the list of traits specified in the request body."
            )
        traits = sorted({validate_trait(t) for t in body["traits"]})
        await self.repo.set_traits(row["id"], traits)
        return web.Response(status=204)

    async def add_trait(self, request: web.Request) -> web.Response:
        row = await self._changeable(request)
        if request.can_read_body and (await request.read()).strip() not in (b"", b"{}", b"null"):
            raise errors.Invalid("No body should be provided when adding a trait")
        trait = validate_trait(request.match_info["trait"])
        await self.repo.add_trait(row["id"], trait)
        location = f"{self.ctx.base(request)}/v1/runbooks/{request.match_info['ident']}/traits/{trait}"
        return web.Response(status=204, headers={"Location": location})

    async def remove_trait(self, request: web.Request) -> web.Response:
        """Removing a trait the runbook does not have is no error (Ironic's no-op)."""
        row = await self._changeable(request)
        await self.repo.remove_trait(row["id"], request.match_info["trait"])
        return web.Response(status=204)

    async def clear_traits(self, request: web.Request) -> web.Response:
        row = await self._changeable(request)
        await self.repo.set_traits(row["id"], [])
        return web.Response(status=204)
