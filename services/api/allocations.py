"""Allocations (microversion 1.52): ask for a node by resource class (and
traits, optionally among candidate nodes) and get one claimed for you.

The api records the allocation, picks a matching node (available, not in
maintenance or retired, without instance or allocation, unlocked) and claims
it by setting its ``instance_uuid`` to the allocation's UUID through the
owning conductor, as Ironic's conductor does. It answers when that is done,
so the allocation comes back ``active`` with its ``node_uuid``, or ``error``
with ``last_error`` when no node matches. Picking is serialised across api
processes with a PostgreSQL advisory lock. Deleting an allocation releases
its node (409 while the node is deployed, unless it is in maintenance).
Below 1.52 every route is 404. Not yet: the node field ``allocation_uuid``
(rendered null), PATCH (1.57), backfill (1.58), owner (1.60).
"""

from __future__ import annotations

import uuid as uuidlib
from typing import Any

from aiohttp import web

from ferrum.v1 import conductor_pb2 as cpb
from services.api import views
from services.api.rest import NAME_RE, RestApi, validate_trait
from services.common import errors, states
from services.common.db.allocations import PICK_LOCK_ID, AllocationRepository
from services.common.db.nodes import is_uuid
from services.common.db.rows import iso
from services.common.jsonutil import dumps

SINCE = (1, 52)
FIELDS: dict[str, tuple[int, int]] = {k: SINCE for k in (
    "uuid", "name", "node_uuid", "state", "last_error", "resource_class", "traits", "candidate_nodes", "extra",
    "created_at", "updated_at", "links")}
CREATE_KEYS = {"uuid", "name", "resource_class", "traits", "candidate_nodes", "extra"}
RETRY_ON = (errors.NodeLocked, errors.Conflict, errors.ServiceUnavailable, errors.NotFound)


def allocation_document(row: dict[str, Any], *, base: str, fields: Any = None) -> dict[str, Any]:
    doc = {
        "uuid": row["uuid"], "name": row["name"], "node_uuid": row["node_uuid"], "state": row["state"],
        "last_error": row["last_error"], "resource_class": row["resource_class"], "traits": row["traits"],
        "candidate_nodes": row["candidate_nodes"], "extra": row["extra"], "created_at": iso(row["created_at"]),
        "updated_at": iso(row["updated_at"]), "links": views.links(base, "allocations", row["uuid"]),
    }
    if fields is not None:
        doc = {k: v for k, v in doc.items() if k in set(fields) | {"links"}}
    return doc


class AllocationsApi:
    def __init__(self, rest: RestApi) -> None:
        self.rest = rest
        self.repo = AllocationRepository(rest.pool)

    def routes(self, app: web.Application) -> None:
        r = app.router
        r.add_get("/v1/allocations", self._gate(self.list))
        r.add_post("/v1/allocations", self._gate(self.create))
        r.add_get("/v1/allocations/{ident}", self._gate(self.get))
        r.add_delete("/v1/allocations/{ident}", self._gate(self.delete))
        r.add_get("/v1/nodes/{node}/allocation", self._gate(self.get_for_node))
        r.add_delete("/v1/nodes/{node}/allocation", self._gate(self.delete_for_node))

    @staticmethod
    def _gate(method: Any) -> Any:
        async def handler(request: web.Request) -> web.Response:
            if request["version"] < SINCE:
                raise web.HTTPNotFound()
            return await method(request)
        return handler

    async def _validate(self, body: dict[str, Any]) -> dict[str, Any]:
        values = dict(body)
        rc = values.get("resource_class")
        if not isinstance(rc, str) or not rc or len(rc) > 80:
            raise errors.InvalidParameterValue("resource_class is required: a string of at most 80 characters")
        name = values.get("name")
        if name is not None and (not isinstance(name, str) or not NAME_RE.match(name) or is_uuid(name) or len(name) > 255):
            raise errors.InvalidParameterValue(f"Cannot use name {name!r}: RFC 3986 unreserved characters, not a UUID")
        if values.get("uuid") is not None and (not isinstance(values["uuid"], str) or not is_uuid(values["uuid"])):
            raise errors.InvalidParameterValue(f"Expected a UUID but received {values['uuid']}.")
        traits = values.get("traits") or []
        if not isinstance(traits, list) or len(traits) > 50:
            raise errors.InvalidParameterValue("traits must be a list of at most 50 traits")
        values["traits"] = sorted({validate_trait(t) for t in traits})
        extra = values.get("extra")
        if extra is None:
            values["extra"] = {}
        elif not isinstance(extra, dict):
            raise errors.InvalidParameterValue("extra must be a JSON object")
        candidates = values.get("candidate_nodes")
        if candidates is None:
            values["candidate_nodes"] = []
        elif not isinstance(candidates, list) or not all(isinstance(c, str) for c in candidates):
            raise errors.InvalidParameterValue("candidate_nodes must be a list of node UUIDs or names")
        else:
            resolved = []
            for ident in candidates:
                try:
                    resolved.append((await self.rest.nodes.get_by_ident(ident))["uuid"])
                except errors.NotFound:
                    raise errors.InvalidParameterValue(f"Candidate node {ident} could not be found.") from None
            values["candidate_nodes"] = sorted(set(resolved))
        return values

    async def create(self, request: web.Request) -> web.Response:
        body = await self.rest.create_body(request, "allocation", CREATE_KEYS, FIELDS)
        values = await self._validate(body)
        if values.get("uuid") is None:
            values["uuid"] = str(uuidlib.uuid4())
        row = await self.repo.create({**values, "state": "allocating"})
        row = await self._allocate(row)
        doc = allocation_document(row, base=self.rest.base(request))
        return web.json_response(doc, status=201, dumps=dumps, headers={"Location": doc["links"][0]["href"]})

    async def _allocate(self, row: dict[str, Any]) -> dict[str, Any]:
        """Claim the first candidate the owning conductor lets us update."""
        async with self.rest.pool.acquire() as conn:
            await conn.execute("SELECT pg_advisory_lock($1)", PICK_LOCK_ID)
            try:
                candidates = await self.repo.candidates(
                    resource_class=row["resource_class"], traits=row["traits"],
                    node_uuids=row["candidate_nodes"] or None)
                for node in candidates:
                    try:
                        await self.rest.rpc(node, "UpdateNode", cpb.ConductorUpdateNodeRequest(
                            node_uuid=node["uuid"], changes_json=dumps({"instance_uuid": row["uuid"]})))
                    except RETRY_ON:
                        continue
                    return await self.repo.finish(row["id"], node_id=node["id"], state="active", last_error=None)
            finally:
                await conn.execute("SELECT pg_advisory_unlock($1)", PICK_LOCK_ID)
        wanted = f"resource class {row['resource_class']}" + (f" and traits {', '.join(row['traits'])}" if row["traits"] else "")
        where = " among the candidate nodes" if row["candidate_nodes"] else ""
        return await self.repo.finish(row["id"], node_id=None, state="error",
                                      last_error=f"No available nodes match the {wanted}{where}")

    async def list(self, request: web.Request) -> web.Response:
        q = request.query
        fields = self.rest._fields(request, FIELDS)
        filters: dict[str, Any] = {}
        if "state" in q:
            if q["state"] not in ("allocating", "active", "error"):
                raise errors.InvalidParameterValue(f"Invalid allocation state {q['state']}")
            filters["state"] = q["state"]
        if "resource_class" in q:
            filters["resource_class"] = q["resource_class"]
        if q.get("node"):
            filters["node_id"] = (await self.rest.nodes.get_by_ident(q["node"]))["id"]
        limit = self.rest._limit(request)
        rows = await self.repo.list(filters=filters, limit=limit, marker=q.get("marker"),
                                    sort_key=q.get("sort_key", "id"), sort_dir=q.get("sort_dir", "asc"))
        base = self.rest.base(request)
        body: dict[str, Any] = {"allocations": [allocation_document(r, base=base, fields=fields) for r in rows]}
        if len(rows) == limit and rows:
            carried = {k: v for k, v in q.items() if k not in ("limit", "marker")}
            carried.update(limit=str(limit), marker=rows[-1]["uuid"])
            body["next"] = f"{base}/v1/allocations?" + "&".join(f"{k}={v}" for k, v in carried.items())
        return web.json_response(body, dumps=dumps)

    async def get(self, request: web.Request) -> web.Response:
        fields = self.rest._fields(request, FIELDS)
        row = await self.repo.get(request.match_info["ident"])
        return web.json_response(allocation_document(row, base=self.rest.base(request), fields=fields), dumps=dumps)

    async def get_for_node(self, request: web.Request) -> web.Response:
        fields = self.rest._fields(request, FIELDS)
        node = await self.rest.nodes.get_by_ident(request.match_info["node"])
        row = await self.repo.for_node(node["id"])
        return web.json_response(allocation_document(row, base=self.rest.base(request), fields=fields), dumps=dumps)

    async def delete(self, request: web.Request) -> web.Response:
        await self._release(await self.repo.get(request.match_info["ident"]))
        return web.Response(status=204)

    async def delete_for_node(self, request: web.Request) -> web.Response:
        node = await self.rest.nodes.get_by_ident(request.match_info["node"])
        await self._release(await self.repo.for_node(node["id"]))
        return web.Response(status=204)

    async def _release(self, row: dict[str, Any]) -> None:
        """Free the node (its instance_uuid, through its conductor), then drop the record."""
        if row["node_uuid"]:
            node = await self.rest.nodes.get(row["node_uuid"])
            if node["provision_state"] == states.ACTIVE and not node["maintenance"]:
                raise errors.InvalidState(
                    f"Cannot remove allocation {row['uuid']}: node {node['uuid']} is deployed; "
                    "undeploy it or put it in maintenance first")
            if node["instance_uuid"] == row["uuid"]:
                await self.rest.rpc(node, "UpdateNode", cpb.ConductorUpdateNodeRequest(
                    node_uuid=node["uuid"], changes_json=dumps({"instance_uuid": None})))
        await self.repo.delete(row["id"])
