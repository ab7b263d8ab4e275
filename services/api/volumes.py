"""REST volume connectors and targets (CONTRACT.md 7.1, microversion 1.32).

These are records, not hardware actions, so the api writes them itself; it
still refuses while the node is locked (409) and applies Ironic's power-state
rules for updates and deletes."""

from __future__ import annotations

import json
import uuid as uuidlib
from typing import Any

from aiohttp import web

from services.api import views
from services.api.rest import RestApi, _bool, apply_patch
from services.common import errors, states
from services.common.db.nodes import is_uuid
from services.common.db.rows import iso
from services.common.db.volumes import VolumeRepository
from services.common.jsonutil import dumps

SINCE = (1, 32)
FIELDS = {
    "connector": {
        "uuid": SINCE,
        "node_uuid": SINCE,
        "type": SINCE,
        "connector_id": SINCE,
        "extra": SINCE,
        "created_at": SINCE,
        "updated_at": SINCE,
        "links": SINCE,
    },
    "target": {
        "uuid": SINCE,
        "node_uuid": SINCE,
        "volume_type": SINCE,
        "boot_index": SINCE,
        "volume_id": SINCE,
        "properties": SINCE,
        "extra": SINCE,
        "created_at": SINCE,
        "updated_at": SINCE,
        "links": SINCE,
    },
}
LIST_FIELDS = {
    "connector": ("uuid", "node_uuid", "type", "connector_id"),
    "target": ("uuid", "node_uuid", "volume_type", "boot_index", "volume_id"),
}
REQUIRED = {
    "connector": ("node_uuid", "type", "connector_id"),
    "target": ("node_uuid", "volume_type", "boot_index", "volume_id"),
}
FREE_STATES = (states.MANAGEABLE, states.ENROLL, states.ADOPTFAIL)


class VolumeApi:
    def __init__(self, rest: RestApi) -> None:
        self.rest = rest
        self.repos = {kind: VolumeRepository(rest.pool, kind) for kind in ("connector", "target")}

    def routes(self, app: web.Application) -> None:
        r = app.router
        r.add_get("/v1/volume", self.root)
        r.add_get("/v1/volume/", self.root)
        for kind in ("connector", "target"):
            plural = f"{kind}s"
            r.add_get(f"/v1/volume/{plural}", self._h(self.list, kind))
            r.add_post(f"/v1/volume/{plural}", self._h(self.create, kind))
            r.add_get(f"/v1/volume/{plural}/{{ident}}", self._h(self.get, kind))
            r.add_patch(f"/v1/volume/{plural}/{{ident}}", self._h(self.patch, kind))
            r.add_delete(f"/v1/volume/{plural}/{{ident}}", self._h(self.delete, kind))
            r.add_get(f"/v1/nodes/{{node}}/volume/{plural}", self._h(self.list, kind))
            r.add_post(f"/v1/nodes/{{node}}/volume/{plural}", self._h(self.refuse_node_post, kind))
        r.add_get("/v1/nodes/{node}/volume", self.root)

    def _h(self, method: Any, kind: str) -> Any:
        async def handler(request: web.Request) -> web.Response:
            if request["version"] < SINCE:
                raise web.HTTPNotFound()
            return await method(request, kind)

        return handler

    def doc(self, request: web.Request, kind: str, row: dict[str, Any], fields: Any = None) -> dict[str, Any]:
        base = self.rest.base(request)
        doc = {
            k: (iso(row.get(k)) if k in ("created_at", "updated_at") else row.get(k))
            for k in FIELDS[kind]
            if k != "links"
        }
        doc["links"] = views.links(base, f"volume/{kind}s", row["uuid"])
        if fields is not None:
            doc = {k: v for k, v in doc.items() if k in set(fields) | {"links"}}
        return doc

    async def root(self, request: web.Request) -> web.Response:
        if request["version"] < SINCE:
            raise web.HTTPNotFound()
        base = self.rest.base(request)
        return web.json_response(
            {
                "links": views.links(base, "volume", "").copy(),
                "connectors": views.links(base, "volume", "connectors"),
                "targets": views.links(base, "volume", "targets"),
            }
        )

    async def list(self, request: web.Request, kind: str) -> web.Response:
        q = request.query
        fields = self.rest._fields(request, FIELDS[kind])
        node_ident = request.match_info.get("node") or q.get("node")
        node_id = (await self.rest.nodes.get_by_ident(node_ident))["id"] if node_ident else None
        detail = _bool(q["detail"], "detail") if "detail" in q else False
        if detail and fields:
            raise errors.InvalidParameterValue("Can not specify ?detail=True and fields in the same request.")
        limit = self.rest._limit(request)
        rows = await self.repos[kind].list(
            node_id=node_id, limit=limit, marker=q.get("marker"), sort_dir=q.get("sort_dir", "asc")
        )
        docs = [self.doc(request, kind, r, None if detail else (fields or LIST_FIELDS[kind])) for r in rows]
        body: dict[str, Any] = {f"{kind}s": docs}
        if len(rows) == limit and rows:
            body["next"] = f"{self.rest.base(request)}{request.path}?limit={limit}&marker={rows[-1]['uuid']}"
        return web.json_response(body, dumps=dumps)

    async def get(self, request: web.Request, kind: str) -> web.Response:
        fields = self.rest._fields(request, FIELDS[kind])
        return web.json_response(
            self.doc(request, kind, await self.repos[kind].get(request.match_info["ident"]), fields), dumps=dumps
        )

    async def refuse_node_post(self, request: web.Request, kind: str) -> web.Response:
        raise errors.InvalidParameterValue(
            f"Creating volume {kind}s through a node is not allowed; POST /v1/volume/{kind}s"
        )

    def _validate(self, kind: str, values: dict[str, Any]) -> dict[str, Any]:
        for key in ("uuid", "node_uuid"):
            if key in values and (not isinstance(values[key], str) or not is_uuid(values[key])):
                raise errors.InvalidParameterValue(f"Expected a UUID for {key} but received {values[key]}.")
        strings = ("type", "connector_id") if kind == "connector" else ("volume_type", "volume_id")
        for key in strings:
            if key in values and (not isinstance(values[key], str) or not values[key]):
                raise errors.InvalidParameterValue(f"{key} must be a non-empty string")
        if kind == "target":
            if "boot_index" in values and (
                not isinstance(values["boot_index"], int)
                or isinstance(values["boot_index"], bool)
                or not 0 <= values["boot_index"] <= 2**31 - 1
            ):
                raise errors.InvalidParameterValue("boot_index must be a non-negative 32-bit integer")
            if "properties" in values and not isinstance(values["properties"], dict):
                raise errors.InvalidParameterValue("properties must be a JSON object")
        if "extra" in values and not isinstance(values["extra"], dict):
            raise errors.InvalidParameterValue("extra must be a JSON object")
        return values

    async def _node_for_change(self, node_uuid: str, *, need_power_off: bool) -> dict[str, Any]:
        node = await self.rest.nodes.get(node_uuid)
        if node["reservation"]:
            raise errors.NodeLocked(
                f"Node {node['uuid']} is locked by host {node['reservation']}, please retry after the current operation is completed."
            )
        if need_power_off and node["power_state"] != states.POWER_OFF and node["provision_state"] not in FREE_STATES:
            raise errors.InvalidStateRequested(
                f'The requested action "volume update" can not be performed on node "{node["uuid"]}" while it is in power state "{node["power_state"]}".'
            )
        return node

    async def create(self, request: web.Request, kind: str) -> web.Response:
        body = await self.rest.body(request)
        if not isinstance(body, dict):
            raise errors.Invalid(f"A volume {kind} must be a JSON object")
        unknown = set(body) - set(FIELDS[kind]) - {"uuid"} | (set(body) & {"created_at", "updated_at", "links"})
        if unknown:
            raise errors.InvalidParameterValue(
                f"Additional properties are not allowed ({', '.join(sorted(unknown))} unexpected)"
            )
        missing = [k for k in REQUIRED[kind] if body.get(k) is None]
        if missing:
            raise errors.InvalidParameterValue(f"Missing mandatory field(s): {', '.join(missing)}")
        if not isinstance(body["node_uuid"], str) or not is_uuid(body["node_uuid"]):
            raise errors.InvalidParameterValue(f"Expected a UUID for node_uuid but received {body['node_uuid']}.")
        values = self._validate(kind, dict(body))
        node = await self.rest.nodes.get(values.pop("node_uuid"))
        values.update(node_id=node["id"])
        values.setdefault("uuid", str(uuidlib.uuid4()))
        row = await self.repos[kind].create(values)
        doc = self.doc(request, kind, row)
        return web.json_response(doc, status=201, dumps=dumps, headers={"Location": doc["links"][0]["href"]})

    async def patch(self, request: web.Request, kind: str) -> web.Response:
        row = await self.repos[kind].get(request.match_info["ident"])
        patch = await self.rest.body(request)
        current = json.loads(dumps({k: row.get(k) for k in FIELDS[kind] if k in row}))
        changes = self._validate(
            kind,
            apply_patch(
                current, patch, {"uuid", "created_at", "updated_at", "links"}, FIELDS[kind], request["version"]
            ),
        )
        node = await self._node_for_change(row["node_uuid"], need_power_off=True)
        if "node_uuid" in changes:
            node = await self.rest.nodes.get(changes.pop("node_uuid"))
            changes["node_id"] = node["id"]
        if changes:
            row = await self.repos[kind].update(row["uuid"], changes)
        return web.json_response(self.doc(request, kind, row), dumps=dumps)

    async def delete(self, request: web.Request, kind: str) -> web.Response:
        row = await self.repos[kind].get(request.match_info["ident"])
        await self._node_for_change(row["node_uuid"], need_power_off=True)
        await self.repos[kind].delete(row["uuid"])
        return web.Response(status=204)
