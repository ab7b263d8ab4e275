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
from collections.abc import Mapping
from typing import Any

from aiohttp import web

from services.api import params, views
from services.api.collection import next_link
from services.api.context import ApiContext
from services.api.json_patch import apply_patch
from services.api.ports import conductor_groups_filter, with_portgroup_uuids
from services.api.validators import is_valid_name, normalize_mac
from services.common import errors
from services.common.db.nodes import is_uuid
from services.common.db.portgroups import PortgroupRepository
from services.common.db.records import PortgroupRecord
from services.common.db.rows import iso
from services.common.jsonutil import dumps

SINCE = (1, 23)
SUBRESOURCES = (1, 24)
DETAIL_PARAM_SINCE = (1, 43)
SHARD_FILTER_SINCE = (1, 106)
TEXT_LIMITS = {"physical_network": 64, "category": 80}  # Ironic's PORTGROUP_SCHEMA
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
    "physical_network": (1, 102),
    "category": (1, 103),
    "dynamic_portgroup": (1, 111),
    "created_at": SINCE,
    "updated_at": SINCE,
    "links": SINCE,
}
LIST_FIELDS = ("uuid", "address", "name")
CREATE_KEYS = {
    "uuid",
    "name",
    "address",
    "node_uuid",
    "standalone_ports_supported",
    "extra",
    "mode",
    "properties",
    "physical_network",
    "category",
}
READONLY = {"uuid", "created_at", "updated_at", "links", "internal_info", "ports", "dynamic_portgroup"}
DEFAULT_MODE = "active-backup"  # Ironic's [DEFAULT]default_portgroup_mode


def validate_portgroup(values: dict[str, Any]) -> dict[str, Any]:
    out = dict(values)
    if out.get("name") is not None:
        name = out["name"]
        if not is_valid_name(name):
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
    for key, limit in TEXT_LIMITS.items():
        if out.get(key) is not None and (not isinstance(out[key], str) or len(out[key]) > limit):
            raise errors.InvalidParameterValue(f"{key} must be a string of at most {limit} characters")
    if out.get("mode") is not None and (not isinstance(out["mode"], str) or not out["mode"] or len(out["mode"]) > 255):
        raise errors.InvalidParameterValue("mode must be a non-empty string of at most 255 characters")
    return out


def portgroup_document(
    row: PortgroupRecord, *, base: str, version: tuple[int, int], fields: Any = None, full: bool = True
) -> dict[str, Any]:
    columns: Mapping[str, Any] = row  # FIELDS names the keys
    doc: dict[str, Any] = {}
    for key, since in FIELDS.items():
        if since > version:
            continue
        if key == "links":
            doc[key] = views.links(base, "portgroups", row["uuid"])
        elif key in ("created_at", "updated_at"):
            doc[key] = iso(columns[key])
        else:
            doc[key] = columns[key]
    if full and version >= SUBRESOURCES:
        doc["ports"] = views.links(base, "portgroups", row["uuid"] + "/ports")
    if fields is not None:
        doc = {k: v for k, v in doc.items() if k in set(fields) | {"links"}}
    return doc


class PortgroupsApi:
    def __init__(self, ctx: ApiContext) -> None:
        self.ctx = ctx
        self.repo = PortgroupRepository(ctx.pool)

    async def list_portgroups(self, request: web.Request) -> web.Response:
        if "detail" in request.query:
            params.require_version(request, DETAIL_PARAM_SINCE, "The detail parameter")
        return await self._list(request, detail=params.flag(request, "detail"))

    async def list_portgroups_detail(self, request: web.Request) -> web.Response:
        return await self._list(request, detail=True, path="/v1/portgroups/detail")

    async def list_node_portgroups(self, request: web.Request) -> web.Response:
        node = await self.ctx.nodes.get_by_ident(request.match_info["node"])
        return await self._list(request, detail=False, node_id=node["id"])

    async def list_node_portgroups_detail(self, request: web.Request) -> web.Response:
        node = await self.ctx.nodes.get_by_ident(request.match_info["node"])
        return await self._list(request, detail=True, node_id=node["id"])

    async def _list(
        self, request: web.Request, *, detail: bool, node_id: int | None = None, path: str | None = None
    ) -> web.Response:
        q = request.query
        fields = params.requested_fields(request, FIELDS)
        if detail and fields:
            raise errors.InvalidParameterValue("Can not specify ?detail=True and fields in the same request.")
        if node_id is None and q.get("node"):
            node_id = (await self.ctx.nodes.get_by_ident(q["node"]))["id"]
        address = normalize_mac(q["address"]) if "address" in q else None
        groups = conductor_groups_filter(request)
        shards = None
        if "shard" in q:  # 1.106: the groups of the nodes in these shards
            params.require_minimal_version(request, SHARD_FILTER_SINCE)
            shards = [s.strip() for s in q["shard"].split(",") if s.strip()] or None
        if sum(x is not None for x in (node_id, address, shards, groups)) > 1:
            raise errors.InvalidParameterValue("Filtering by node, address, or shard simultaneously is not supported.")
        limit = params.page_limit(request, self.ctx.config.max_limit)
        rows = await self.repo.list(
            node_id=node_id,
            address=address,
            conductor_groups=groups,
            node_shards=shards,
            limit=limit,
            **params.page_order(request),
        )
        base, version = self.ctx.base(request), request["version"]
        shown = None if detail else (fields or LIST_FIELDS)
        body: dict[str, Any] = {
            "portgroups": [portgroup_document(r, base=base, version=version, fields=shown, full=detail) for r in rows]
        }
        following = next_link(request, rows, base=base, limit=limit, path=path)
        if following:
            body["next"] = following
        return web.json_response(body, dumps=dumps)

    async def get_portgroup(self, request: web.Request) -> web.Response:
        fields = params.requested_fields(request, FIELDS)
        row = await self.repo.get(request.match_info["ident"])
        return web.json_response(
            portgroup_document(row, base=self.ctx.base(request), version=request["version"], fields=fields),
            dumps=dumps,
        )

    async def create_portgroup(self, request: web.Request) -> web.Response:
        body = await self.ctx.create_body(request, "port group", CREATE_KEYS, FIELDS)
        if "node_uuid" not in body:
            raise errors.InvalidParameterValue("A port group needs 'node_uuid'")
        values = validate_portgroup(body)
        node = await self.ctx.nodes.get(values.pop("node_uuid"))
        values["node_id"] = node["id"]
        if values.get("uuid") is None:
            values["uuid"] = str(uuidlib.uuid4())
        if values.get("mode") is None:
            values["mode"] = DEFAULT_MODE
        row = await self.repo.create(values)
        doc = portgroup_document(row, base=self.ctx.base(request), version=request["version"])
        return web.json_response(doc, status=201, dumps=dumps, headers={"Location": doc["links"][0]["href"]})

    async def patch_portgroup(self, request: web.Request) -> web.Response:
        row = await self.repo.get(request.match_info["ident"])
        patch = await self.ctx.body(request)
        columns: Mapping[str, Any] = row
        current = json.loads(dumps({k: columns[k] for k in FIELDS if k in columns}))
        changes = validate_portgroup(apply_patch(current, patch, READONLY, FIELDS, request["version"]))
        if "node_uuid" in changes:
            node = await self.ctx.nodes.get(changes.pop("node_uuid"))
            if node["id"] != row["node_id"] and await self.repo.ports(row["id"], limit=1):
                raise errors.InvalidState(f"Port group {row['uuid']} has ports; it cannot move to another node.")
            changes["node_id"] = node["id"]
        if changes:
            row = await self.repo.update(row["uuid"], changes)
        if "physical_network" in changes:  # 1.102: the group's network is its ports' network, as in Ironic
            await self.repo.set_member_physical_network(row["id"], changes["physical_network"])
        return web.json_response(
            portgroup_document(row, base=self.ctx.base(request), version=request["version"]), dumps=dumps
        )

    async def delete_portgroup(self, request: web.Request) -> web.Response:
        row = await self.repo.get(request.match_info["ident"])
        await self.repo.delete_if_empty(row["uuid"])
        return web.Response(status=204)

    async def list_portgroup_ports(self, request: web.Request) -> web.Response:
        return await self._ports(request, detail=False)

    async def list_portgroup_ports_detail(self, request: web.Request) -> web.Response:
        return await self._ports(request, detail=True)

    async def _ports(self, request: web.Request, *, detail: bool) -> web.Response:
        fields = params.requested_fields(request, views.PORT_FIELD_VERSIONS)
        group = await self.repo.get(request.match_info["ident"])
        limit = params.page_limit(request, self.ctx.config.max_limit)
        rows = await with_portgroup_uuids(
            self.repo,
            await self.repo.ports(
                group["id"],
                limit=limit,
                **params.page_order(request),
            ),
        )
        base, version = self.ctx.base(request), request["version"]
        shown = None if detail else (fields or views.PORT_LIST_FIELDS)
        body: dict[str, Any] = {
            "ports": [views.port_document(r, base=base, version=version, fields=shown) for r in rows]
        }
        following = next_link(request, rows, base=base, limit=limit)
        if following:
            body["next"] = following
        return web.json_response(body, dumps=dumps)
