"""Port groups (microversion 1.23; node and group port sub-resources 1.24;
``mode`` and ``properties`` 1.26).

A port group bonds some of a node's ports. These are records, so the api
writes them itself, as it does volume records; ports join a group through
their ``portgroup_uuid`` (ports API). A group with ports cannot be deleted
(409), a duplicate name or MAC is a 409, and a port may only join a group of
its own node. Below 1.23 every route is 404.
"""

from __future__ import annotations

import json
import uuid as uuidlib
from typing import Any

from aiohttp import web

from services.api import views
from services.api.rest import NAME_RE, RestApi, _bool, apply_patch, normalize_mac
from services.common import errors
from services.common.db.nodes import is_uuid
from services.common.db.rows import iso
from services.common.jsonutil import dumps

SINCE = (1, 23)
SUBRESOURCES = (1, 24)
FIELDS: dict[str, tuple[int, int]] = {
    "uuid": SINCE,
    "name": SINCE,
    "address": SINCE,
    "node_uuid": SINCE,
    "standalone_ports_supported": SINCE,
    "internal_info": SINCE,
    "extra": SINCE,
    "mode": (1, 26),
    "properties": (1, 26),
    "created_at": SINCE,
    "updated_at": SINCE,
    "links": SINCE,
}
LIST_FIELDS = ("uuid", "address", "name")
CREATE_KEYS = {"uuid", "name", "address", "node_uuid", "standalone_ports_supported", "extra", "mode", "properties"}
READONLY = {"uuid", "created_at", "updated_at", "links", "internal_info", "ports"}
DEFAULT_MODE = "active-backup"  # Ironic's [DEFAULT]default_portgroup_mode


def validate_portgroup(values: dict[str, Any]) -> dict[str, Any]:
    out = dict(values)
    if out.get("name") is not None:
        name = out["name"]
        if not isinstance(name, str) or not NAME_RE.match(name) or is_uuid(name) or len(name) > 255:
            raise errors.InvalidParameterValue(
                f"Cannot use name {name!r}: RFC 3986 unreserved characters only, not a UUID, at most 255"
            )
    if out.get("address") is not None:
        out["address"] = normalize_mac(out["address"])
    for key in ("uuid", "node_uuid"):
        if key in out and (not isinstance(out[key], str) or not is_uuid(out[key])):
            raise errors.InvalidParameterValue(f"Expected a UUID for {key} but received {out[key]}.")
    for key in ("extra", "properties"):
        if key in out:
            if out[key] is None:
                out[key] = {}
            elif not isinstance(out[key], dict):
                raise errors.InvalidParameterValue(f"{key} must be a JSON object")
    if "standalone_ports_supported" in out:
        if out["standalone_ports_supported"] is None:
            out["standalone_ports_supported"] = True
        elif not isinstance(out["standalone_ports_supported"], bool):
            raise errors.InvalidParameterValue("standalone_ports_supported must be a boolean")
    if out.get("mode") is not None and (not isinstance(out["mode"], str) or not out["mode"] or len(out["mode"]) > 255):
        raise errors.InvalidParameterValue("mode must be a non-empty string of at most 255 characters")
    return out


def portgroup_document(
    row: dict[str, Any], *, base: str, version: tuple[int, int], fields: Any = None, full: bool = True
) -> dict[str, Any]:
    doc: dict[str, Any] = {}
    for key, since in FIELDS.items():
        if since > version:
            continue
        if key == "links":
            doc[key] = views.links(base, "portgroups", row["uuid"])
        elif key in ("created_at", "updated_at"):
            doc[key] = iso(row[key])
        else:
            doc[key] = row[key]
    if full and version >= SUBRESOURCES:
        doc["ports"] = views.links(base, "portgroups", row["uuid"] + "/ports")
    if fields is not None:
        doc = {k: v for k, v in doc.items() if k in set(fields) | {"links"}}
    return doc


class PortgroupsApi:
    def __init__(self, rest: RestApi) -> None:
        self.rest = rest
        self.repo = rest.portgroups

    def routes(self, app: web.Application) -> None:
        r = app.router
        gate, sub = self._gate(SINCE), self._gate(SUBRESOURCES)
        r.add_get("/v1/portgroups", gate(self.list))
        r.add_post("/v1/portgroups", gate(self.create))
        r.add_get("/v1/portgroups/detail", gate(self.list_detail))
        r.add_get("/v1/portgroups/{ident}", gate(self.get))
        r.add_patch("/v1/portgroups/{ident}", gate(self.patch))
        r.add_delete("/v1/portgroups/{ident}", gate(self.delete))
        r.add_get("/v1/portgroups/{ident}/ports", sub(self.ports))
        r.add_get("/v1/portgroups/{ident}/ports/detail", sub(self.ports_detail))
        r.add_get("/v1/nodes/{node}/portgroups", sub(self.node_list))
        r.add_get("/v1/nodes/{node}/portgroups/detail", sub(self.node_list_detail))

    @staticmethod
    def _gate(since: tuple[int, int]) -> Any:
        def wrap(method: Any) -> Any:
            async def handler(request: web.Request) -> web.Response:
                if request["version"] < since:
                    raise web.HTTPNotFound()
                return await method(request)

            return handler

        return wrap

    async def list(self, request: web.Request) -> web.Response:
        detail = request.query.get("detail")
        if detail is not None and request["version"] < (1, 43):
            raise errors.NotAcceptable("The detail parameter requires API version 1.43 or newer")
        return await self._list(request, detail=_bool(detail, "detail") if detail is not None else False)

    async def list_detail(self, request: web.Request) -> web.Response:
        return await self._list(request, detail=True, path="/v1/portgroups/detail")

    async def node_list(self, request: web.Request) -> web.Response:
        node = await self.rest.nodes.get_by_ident(request.match_info["node"])
        return await self._list(request, detail=False, node_id=node["id"])

    async def node_list_detail(self, request: web.Request) -> web.Response:
        node = await self.rest.nodes.get_by_ident(request.match_info["node"])
        return await self._list(request, detail=True, node_id=node["id"])

    async def _list(
        self, request: web.Request, *, detail: bool, node_id: int | None = None, path: str | None = None
    ) -> web.Response:
        q = request.query
        fields = self.rest._fields(request, FIELDS)
        if detail and fields:
            raise errors.InvalidParameterValue("Can not specify ?detail=True and fields in the same request.")
        if node_id is None and q.get("node"):
            node_id = (await self.rest.nodes.get_by_ident(q["node"]))["id"]
        address = normalize_mac(q["address"]) if "address" in q else None
        limit = self.rest._limit(request)
        rows = await self.repo.list(
            node_id=node_id,
            address=address,
            limit=limit,
            marker=q.get("marker"),
            sort_key=q.get("sort_key", "id"),
            sort_dir=q.get("sort_dir", "asc"),
        )
        base, version = self.rest.base(request), request["version"]
        shown = None if detail else (fields or LIST_FIELDS)
        body: dict[str, Any] = {
            "portgroups": [portgroup_document(r, base=base, version=version, fields=shown, full=detail) for r in rows]
        }
        if len(rows) == limit and rows:
            carried = {k: v for k, v in q.items() if k not in ("limit", "marker")}
            carried.update(limit=str(limit), marker=rows[-1]["uuid"])
            body["next"] = f"{base}{path or request.path}?" + "&".join(f"{k}={v}" for k, v in carried.items())
        return web.json_response(body, dumps=dumps)

    async def get(self, request: web.Request) -> web.Response:
        fields = self.rest._fields(request, FIELDS)
        row = await self.repo.get(request.match_info["ident"])
        return web.json_response(
            portgroup_document(row, base=self.rest.base(request), version=request["version"], fields=fields),
            dumps=dumps,
        )

    async def create(self, request: web.Request) -> web.Response:
        body = await self.rest.create_body(request, "port group", CREATE_KEYS, FIELDS)
        if "node_uuid" not in body:
            raise errors.InvalidParameterValue("A port group needs 'node_uuid'")
        values = validate_portgroup(body)
        node = await self.rest.nodes.get(values.pop("node_uuid"))
        values["node_id"] = node["id"]
        if values.get("uuid") is None:
            values["uuid"] = str(uuidlib.uuid4())
        if values.get("mode") is None:
            values["mode"] = DEFAULT_MODE
        row = await self.repo.create(values)
        doc = portgroup_document(row, base=self.rest.base(request), version=request["version"])
        return web.json_response(doc, status=201, dumps=dumps, headers={"Location": doc["links"][0]["href"]})

    async def patch(self, request: web.Request) -> web.Response:
        row = await self.repo.get(request.match_info["ident"])
        patch = await self.rest.body(request)
        current = json.loads(dumps({k: row[k] for k in FIELDS if k in row}))
        changes = validate_portgroup(apply_patch(current, patch, READONLY, FIELDS, request["version"]))
        if "node_uuid" in changes:
            node = await self.rest.nodes.get(changes.pop("node_uuid"))
            if node["id"] != row["node_id"] and await self.repo.ports(row["id"], limit=1):
                raise errors.InvalidState(f"Port group {row['uuid']} has ports; it cannot move to another node.")
            changes["node_id"] = node["id"]
        if changes:
            row = await self.repo.update(row["uuid"], changes)
        return web.json_response(
            portgroup_document(row, base=self.rest.base(request), version=request["version"]), dumps=dumps
        )

    async def delete(self, request: web.Request) -> web.Response:
        row = await self.repo.get(request.match_info["ident"])
        await self.repo.delete_if_empty(row["uuid"])
        return web.Response(status=204)

    async def ports(self, request: web.Request) -> web.Response:
        return await self._ports(request, detail=False)

    async def ports_detail(self, request: web.Request) -> web.Response:
        return await self._ports(request, detail=True)

    async def _ports(self, request: web.Request, *, detail: bool) -> web.Response:
        q = request.query
        fields = self.rest._fields(request, views.PORT_FIELD_VERSIONS)
        group = await self.repo.get(request.match_info["ident"])
        limit = self.rest._limit(request)
        rows = await self.rest.with_portgroups(
            await self.repo.ports(
                group["id"],
                limit=limit,
                marker=q.get("marker"),
                sort_key=q.get("sort_key", "id"),
                sort_dir=q.get("sort_dir", "asc"),
            )
        )
        base, version = self.rest.base(request), request["version"]
        shown = None if detail else (fields or views.PORT_LIST_FIELDS)
        body: dict[str, Any] = {
            "ports": [views.port_document(r, base=base, version=version, fields=shown) for r in rows]
        }
        if len(rows) == limit and rows:
            body["next"] = f"{base}{request.path}?limit={limit}&marker={rows[-1]['uuid']}"
        return web.json_response(body, dumps=dumps)
