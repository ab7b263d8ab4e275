"""Nodes: ``/v1/nodes`` (list, detail, create), ``/v1/nodes/{ident}`` (get,
patch, delete) and ``/v1/nodes/{ident}/validate``.

Reads come straight from PostgreSQL; creating, changing and deleting a node
go to the conductor that owns it on the hash ring, which checks the driver
and holds the node lock. The value checks are shared with gRPC
(:mod:`services.api.node_values`); a node's states, traits, VIFs, ports and
management have their own modules.
"""

from __future__ import annotations

import json
import uuid as uuidlib
from typing import Any

from aiohttp import web

from ferrum.v1 import conductor_pb2 as cpb
from services.api import params, views
from services.api.collection import next_link
from services.api.context import ApiContext
from services.api.json_patch import apply_patch
from services.api.node_values import (
    NODE_CREATE_KEYS,
    NODE_READONLY,
    NODE_TIMESTAMPS,
    checked_node_changes,
    validate_node_values,
)
from services.common import errors, states
from services.common.db.allocations import AllocationRepository
from services.common.db.nodes import is_uuid
from services.common.jsonutil import dumps, parse_datetimes

ENROLL_SINCE = (1, 11)  # below it a new node starts available, Ironic's older default
DETAIL_PARAM_SINCE = (1, 43)
RESET_INTERFACES_SINCE = (1, 45)
RETIRED_FILTER_SINCE = (1, 61)
# Query filter -> the microversion that introduced it.
FILTERS = (
    ("provision_state", (1, 9)),
    ("driver", (1, 16)),
    ("resource_class", (1, 21)),
    ("conductor_group", (1, 46)),
    ("owner", (1, 50)),
    ("instance_uuid", (1, 1)),
    ("fault", (1, 42)),
    ("lessee", (1, 65)),
    ("project", (1, 65)),
)


class NodesApi:
    def __init__(self, ctx: ApiContext) -> None:
        self.ctx = ctx
        self.allocations = AllocationRepository(ctx.pool)

    def node_doc(
        self, request: web.Request, row: dict[str, Any], fields: list[str] | None = None, full: bool = True
    ) -> dict[str, Any]:
        """The node as Ironic shows it, with ``conductor`` from the ring as it is now."""
        owner = self.ctx.router.rings.owner(row["uuid"], row["driver"], row["conductor_group"])
        return views.node_document(
            row,
            base=self.ctx.base(request),
            version=request["version"],
            fields=fields,
            conductor=owner["hostname"] if owner else None,
            full=full,
        )

    async def list_nodes(self, request: web.Request) -> web.Response:
        detail = request.query.get("detail")
        if detail is not None:
            params.require_version(request, DETAIL_PARAM_SINCE, "The detail parameter")
            if request.query.get("fields"):
                raise errors.InvalidParameterValue("Can not specify ?detail=True and fields in the same request.")
            # Ironic reads this one loosely: only true and 1 ask for details, any other word does not.
            return await self._list_nodes(request, detail=detail.lower() in ("true", "1"))
        return await self._list_nodes(request, detail=False)

    async def list_nodes_detail(self, request: web.Request) -> web.Response:
        if request.query.get("fields"):
            raise errors.InvalidParameterValue("Can not specify fields on /detail")
        return await self._list_nodes(request, detail=True, path="/v1/nodes/detail")

    async def _list_nodes(self, request: web.Request, *, detail: bool, path: str = "/v1/nodes") -> web.Response:
        q = request.query
        fields = params.requested_fields(request, views.NODE_FIELD_VERSIONS)
        filters: dict[str, Any] = {}
        for name, since in FILTERS:
            if name in q:
                params.require_version(request, since, f"The {name} filter")
                filters[name] = q[name]
        if "provision_state" in filters and filters["provision_state"] not in states.ALL_STATES:
            raise errors.InvalidParameterValue(f"Invalid provision state {filters['provision_state']}")
        if "instance_uuid" in filters and not is_uuid(filters["instance_uuid"]):
            raise errors.InvalidParameterValue(f"Expected a UUID but received {filters['instance_uuid']}.")
        for name in ("maintenance", "retired"):
            if name in q:
                if name == "retired":
                    params.require_version(request, RETIRED_FILTER_SINCE, "The retired filter")
                filters[name] = params.parse_bool(q[name], name)
        associated = params.optional_bool(request, "associated")
        limit = params.page_limit(request, self.ctx.config.max_limit)
        rows = await self.with_allocations(
            await self.ctx.nodes.list(
                filters=filters,
                associated=associated,
                limit=limit,
                marker=q.get("marker"),
                sort_key=q.get("sort_key", "id"),
                sort_dir=q.get("sort_dir", "asc"),
            )
        )
        if detail:
            docs = [self.node_doc(request, r) for r in rows]
        else:
            docs = [self.node_doc(request, r, fields or list(views.NODE_LIST_FIELDS), full=False) for r in rows]
        body: dict[str, Any] = {"nodes": docs}
        following = next_link(request, rows, base=self.ctx.base(request), limit=limit, path=path)
        if following and "instance_uuid" not in filters:  # one instance has one node: nothing follows
            body["next"] = following
        return web.json_response(body, dumps=dumps)

    async def get_node(self, request: web.Request) -> web.Response:
        fields = params.requested_fields(request, views.NODE_FIELD_VERSIONS)
        node = (await self.with_allocations([await self.ctx.node_by_ident(request)]))[0]
        return web.json_response(self.node_doc(request, node, fields), dumps=dumps)

    async def with_allocations(self, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Node rows with ``allocation_uuid`` (1.52). An allocation sets the node's
        instance_uuid, so only nodes with an instance can have one: no query otherwise."""
        uuids = await self.allocations.uuids_for_nodes([r["id"] for r in rows if r.get("instance_uuid") and "id" in r])
        for row in rows:
            row["allocation_uuid"] = uuids.get(row.get("id"))
        return rows

    async def create_node(self, request: web.Request) -> web.Response:
        body = await self.ctx.create_body(request, "node", NODE_CREATE_KEYS, views.NODE_FIELD_VERSIONS)
        values = validate_node_values(body, create=True)
        if request["version"] < ENROLL_SINCE:
            values["provision_state"] = states.AVAILABLE
        if values.get("uuid") is None:  # absent or null: generate one
            values["uuid"] = str(uuidlib.uuid4())
        values.pop("chassis_uuid", None)
        group = values.get("conductor_group", "")
        await self.ctx.router.require_served(values["uuid"], values["driver"], group)
        reply = await self.ctx.router.call(
            values["uuid"],
            values["driver"],
            group,
            "CreateNode",
            cpb.ConductorCreateNodeRequest(node_json=dumps(values)),
        )
        node = parse_datetimes(json.loads(reply.node_json), NODE_TIMESTAMPS)
        doc = self.node_doc(request, node)
        return web.json_response(doc, status=201, dumps=dumps, headers={"Location": doc["links"][0]["href"]})

    async def patch_node(self, request: web.Request) -> web.Response:
        node = await self.ctx.node_by_ident(request)
        patch = await self.ctx.body(request)
        reset = request.query.get("reset_interfaces")
        current = self.node_doc_for_patch(node)
        changes = apply_patch(current, patch, NODE_READONLY, views.NODE_FIELD_VERSIONS, request["version"])
        if reset is not None:
            params.require_version(request, RESET_INTERFACES_SINCE, "reset_interfaces")
            if "driver" not in changes:
                raise errors.InvalidParameterValue(
                    "The reset_interfaces parameter can be provided only when changing the node's driver."
                )
        values = checked_node_changes(node, changes)
        if not values:
            return web.json_response(self.node_doc(request, node), dumps=dumps)
        # A new driver or conductor group must have a conductor, or the node could
        # never be reached again; the change goes to that conductor, as in Ironic.
        driver = values.get("driver", node["driver"])
        group = values.get("conductor_group", node["conductor_group"])
        if "driver" in values or "conductor_group" in values:
            await self.ctx.router.require_served(node["uuid"], driver, group)
        reply = await self.ctx.router.call(
            node["uuid"],
            driver,
            group,
            "UpdateNode",
            cpb.ConductorUpdateNodeRequest(
                node_uuid=node["uuid"],
                changes_json=dumps(values),
                reset_interfaces=params.parse_bool(reset or "false", "reset_interfaces"),
            ),
        )
        updated = (await self.with_allocations([parse_datetimes(json.loads(reply.node_json), NODE_TIMESTAMPS)]))[0]
        return web.json_response(self.node_doc(request, updated), dumps=dumps)

    @staticmethod
    def node_doc_for_patch(node: dict[str, Any]) -> dict[str, Any]:
        """The patchable view: stored fields only, as JSON types, so a patch compares like with like."""
        doc = {k: node.get(k) for k in views.NODE_FIELD_VERSIONS if k in node}
        return json.loads(dumps(doc))

    async def delete_node(self, request: web.Request) -> web.Response:
        node = await self.ctx.node_by_ident(request)
        await self.ctx.rpc(node, "DestroyNode", cpb.NodeRef(node_uuid=node["uuid"]))
        return web.Response(status=204)

    async def validate_node(self, request: web.Request) -> web.Response:
        node = await self.ctx.node_by_ident(request)
        reply = await self.ctx.rpc(node, "ValidateDriverInterfaces", cpb.NodeRef(node_uuid=node["uuid"]))
        doc = {}
        for item in reply.interfaces:
            doc[item.interface] = {"result": item.result, **({"reason": item.reason} if not item.result else {})}
        return web.json_response(doc)
