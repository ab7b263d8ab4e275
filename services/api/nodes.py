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
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, cast

from aiohttp import web

from ferrum.v1 import conductor_pb2 as cpb
from services.api import node_documents, params, views
from services.api.collection import next_link
from services.api.context import ApiContext
from services.api.json_patch import apply_patch
from services.api.node_documents import NodeDocumentCache
from services.api.node_values import (
    NODE_CREATE_KEYS,
    NODE_READONLY,
    checked_node_changes,
    linked_parent,
    node_from_json,
    validate_node_values,
)
from services.common import errors, states
from services.common.db.allocations import AllocationRepository
from services.common.db.chassis import ChassisRepository
from services.common.db.nodes import NodePage, NodeVersion, is_uuid
from services.common.db.records import NodeRecord
from services.common.jsonutil import dumps

ENROLL_SINCE = (1, 11)  # below it a new node starts available, Ironic's older default
DETAIL_PARAM_SINCE = (1, 43)
RESET_INTERFACES_SINCE = (1, 45)
RETIRED_FILTER_SINCE = (1, 61)
SHARD_SINCE = (1, 82)
CHILDREN_SINCE = (1, 83)
INSTANCE_NAME_SINCE = (1, 104)
UNSET_CHASSIS_SINCE = (1, 25)
# Ironic's faults.VALID_FAULTS: the only values the fault filter takes.
VALID_FAULTS = ("power failure", "clean failure", "rescue abort failure", "service failure")
# Query filter -> the microversion that introduced it.
FILTERS = (
    ("provision_state", (1, 9)),
    ("driver", (1, 16)),
    ("resource_class", (1, 21)),
    ("conductor_group", (1, 46)),
    ("owner", (1, 50)),
    ("instance_uuid", (1, 1)),
    ("chassis_uuid", (1, 1)),
    ("fault", (1, 42)),
    ("lessee", (1, 65)),
    ("project", (1, 65)),
)


class NodesApi:
    def __init__(self, ctx: ApiContext) -> None:
        self.ctx = ctx
        self.allocations = AllocationRepository(ctx.pool)
        self.chassis = ChassisRepository(ctx.pool)
        self.documents = NodeDocumentCache(ctx.config.node_document_cache)

    def node_doc(
        self, request: web.Request, row: NodeRecord, fields: list[str] | None = None, full: bool = True
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
            return await self._list_nodes(request, detail=detail.lower() in ("true", "1"), path="/v1/nodes")
        return await self._list_nodes(request, detail=False, path="/v1/nodes")

    async def list_nodes_detail(self, request: web.Request) -> web.Response:
        if request.query.get("fields"):
            raise errors.InvalidParameterValue("Can not specify fields on /detail")
        return await self._list_nodes(request, detail=True, path="/v1/nodes/detail")

    async def list_chassis_nodes(self, request: web.Request) -> web.Response:
        """``/v1/chassis/{uuid}/nodes``: the node list of one chassis (404 for an unknown one)."""
        chassis = await self._chassis_in_path(request)
        return await self._list_nodes(request, detail=False, chassis_uuid=chassis)

    async def list_chassis_nodes_detail(self, request: web.Request) -> web.Response:
        if request.query.get("fields"):
            raise errors.InvalidParameterValue("Can not specify fields on /detail")
        chassis = await self._chassis_in_path(request)
        return await self._list_nodes(request, detail=True, chassis_uuid=chassis)

    async def _chassis_in_path(self, request: web.Request) -> str:
        ident = request.match_info["ident"]
        if not is_uuid(ident):
            raise errors.InvalidParameterValue(f"Expected a UUID but received {ident}.")
        return str((await self.chassis.get(ident))["uuid"])

    async def _list_nodes(
        self, request: web.Request, *, detail: bool, path: str | None = None, chassis_uuid: str | None = None
    ) -> web.Response:
        q = request.query
        fields = params.requested_fields(request, views.NODE_FIELD_VERSIONS)
        filters: dict[str, Any] = {}
        if chassis_uuid is not None:
            filters["chassis_uuid"] = chassis_uuid
        for name, since in FILTERS:
            if name in q:
                params.require_version(request, since, f"The {name} filter")
                filters[name] = q[name]
        if "provision_state" in filters and filters["provision_state"] not in states.ALL_STATES:
            raise errors.InvalidParameterValue(f"Invalid provision state {filters['provision_state']}")
        for name in ("instance_uuid", "chassis_uuid"):
            if name in filters and not is_uuid(filters[name]):
                raise errors.InvalidParameterValue(f"Expected a UUID but received {filters[name]}.")
        if "chassis_uuid" in filters:
            await self.chassis.get(filters["chassis_uuid"])  # 404 for an unknown chassis, as Ironic
        if "fault" in filters and filters["fault"] not in VALID_FAULTS:
            raise errors.InvalidParameterValue(
                f'Unrecognized fault "{filters["fault"]}" is specified, allowed faults are {VALID_FAULTS}'
            )
        for name in ("maintenance", "retired"):
            if name in q:
                if name == "retired":
                    params.require_version(request, RETIRED_FILTER_SINCE, "The retired filter")
                filters[name] = params.parse_bool(q[name], name)
        if "shard" in q or "sharded" in q:  # 1.82, both under the same gate, as in Ironic
            params.require_minimal_version(request, SHARD_SINCE)
            if "shard" in q:
                filters["shard_in"] = [s.strip() for s in q["shard"].split(",") if s.strip()]
            if "sharded" in q:
                filters["sharded"] = params.parse_bool(q["sharded"], "sharded")
        if "include_children" in q or "parent_node" in q:  # 1.83, one gate for both, as in Ironic
            params.require_minimal_version(request, CHILDREN_SINCE)
        # Child nodes (1.83) are not in the list, at any version, unless asked for; include_children
        # wins over parent_node, which matches the stored UUID as given (a name matches nothing), as in Ironic.
        if not params.flag(request, "include_children"):
            if "parent_node" in q:
                filters["parent_node"] = q["parent_node"]
            else:
                filters["is_child"] = False
        if "instance_name" in q:  # 1.104
            if request["version"] < INSTANCE_NAME_SINCE:
                raise errors.NotAcceptable("instance_name is not acceptable in this API version")
            filters["instance_name"] = q["instance_name"]
        associated = params.optional_bool(request, "associated")
        limit = params.page_limit(request, self.ctx.config.max_limit)
        # One path at every cache size: with 0 every list reads whole rows and renders them all.
        return await self._list_from_documents(
            request, filters=filters, associated=associated, limit=limit, detail=detail, fields=fields, path=path
        )

    async def _list_from_documents(
        self,
        request: web.Request,
        *,
        filters: dict[str, Any],
        associated: bool | None,
        limit: int,
        detail: bool,
        fields: list[str] | None,
        path: str | None,
    ) -> web.Response:
        """The same list as the rows' own rendering, reusing the documents of unchanged
        rows (services/api/node_documents.py)."""
        page = NodePage(
            filters=filters,
            associated=associated,
            limit=limit,
            **params.page_order(request),
        )
        nodes = self.ctx.nodes
        source = self._source(versions=lambda: nodes.list_versions(page), whole=lambda: nodes.list_versioned(page))
        shown = None if detail else tuple(fields or views.NODE_LIST_FIELDS)
        variant = (request["version"], self.ctx.base(request), shown, detail)
        parts, uuids = await node_documents.documents(
            self.documents,
            variant,
            source,
            conductor=self._conductor,
            render=self._renderer(variant),
            seen=self._noting(),
        )
        body = b'{"nodes":[' + b",".join(parts) + b"]"
        following = next_link(request, [{"uuid": u} for u in uuids], base=variant[1], limit=limit, path=path)
        if following and "instance_uuid" not in filters:  # one instance has one node: nothing follows
            body += b',"next":' + dumps(following).encode()
        return web.Response(body=body + b"}", content_type="application/json", charset="utf-8")

    def _source(
        self,
        *,
        versions: Callable[[], Awaitable[Sequence[NodeVersion]]],
        whole: Callable[[], Awaitable[Sequence[tuple[int, NodeRecord]]]],
    ) -> node_documents.ListSource:
        """Where documents come from: a page (or one node) by versions or whole, then
        changed rows by id and the allocations, for lists and GETs alike."""
        return node_documents.ListSource(
            versions=versions,
            whole=whole,
            by_id=self.ctx.nodes.get_many_versioned,
            allocations=self.allocations.uuids_for_nodes,
        )

    def _conductor(self, node: Mapping[str, Any]) -> str | None:
        """The hostname the ring gives the node now, as its documents show it."""
        owner = self.ctx.router.rings.owner(str(node["uuid"]), node["driver"], node["conductor_group"])
        return owner["hostname"] if owner else None

    @staticmethod
    def _renderer(variant: node_documents.Variant) -> Callable[[dict[str, Any], str | None], bytes]:
        version, base, shown, full = variant
        fields = None if shown is None else list(shown)

        def render(row: dict[str, Any], owner: str | None) -> bytes:
            doc = views.node_document(
                cast(NodeRecord, row), base=base, version=version, fields=fields, conductor=owner, full=full
            )
            return dumps(doc).encode()

        return render

    async def get_node(self, request: web.Request) -> web.Response:
        """The node's document, reused while its row is unchanged (services/api/node_documents.py):
        a client polling a node that is not moving gets the bytes of the last GET. A request
        with ``Cache-Control: no-cache`` has it read whole and rendered afresh."""
        fields = params.requested_fields(request, views.NODE_FIELD_VERSIONS)
        ident = self.ctx.node_ident(request)
        variant = (request["version"], self.ctx.base(request), None if fields is None else tuple(fields), True)
        if "no-cache" in request.headers.get("Cache-Control", ""):
            node = (await self.with_allocations([await self.ctx.nodes.get_by_ident(ident)]))[0]
            document = dumps(self.node_doc(request, node, fields)).encode()
        elif (current := await self._current_document(ident, variant)) is not None:
            document = current
        else:
            nodes = self.ctx.nodes
            source = self._source(
                versions=lambda: nodes.version_by_ident(ident), whole=lambda: nodes.versioned_by_ident(ident)
            )
            found, _ = await node_documents.documents(
                self.documents,
                variant,
                source,
                conductor=self._conductor,
                render=self._renderer(variant),
                kind="GET",
                # A node by UUID of which nothing is kept: one query for the whole row, not two.
                whole=True if is_uuid(ident) and not self.documents.holds(ident, variant) else None,
                seen=self._noting(),
            )
            if not found:
                raise errors.NodeNotFound(f"Node {ident} could not be found.")
            document = found[0]
        return web.Response(body=document, content_type="application/json", charset="utf-8")

    async def _current_document(self, ident: str, variant: node_documents.Variant) -> bytes | None:
        """The kept document of a node addressed by UUID that nothing has changed since it was
        read (services/api/fresh_nodes.py), without asking the database; None to read it."""
        fresh = self.ctx.fresh
        if fresh is None or not is_uuid(ident):
            return None
        node_uuid = str(uuidlib.UUID(ident))
        known = await fresh.known(node_uuid)
        if known is None:
            return None
        inputs = (known.version, self._conductor(known.route(node_uuid)), known.allocation)
        return self.documents.peek(node_uuid, variant, inputs)

    def _noting(self) -> node_documents.Seen | None:
        """Remember the nodes a read returns as current, unless a change is heard before it ends."""
        fresh = self.ctx.fresh
        if fresh is None:
            return None
        since = fresh.generation
        return lambda node, version, allocation: fresh.note(node, version, allocation, since)

    async def with_allocations(self, rows: list[NodeRecord]) -> list[views.ShownNode]:
        """Node rows with ``allocation_uuid`` (1.52). An allocation sets the node's
        instance_uuid, so only nodes with an instance can have one: no query otherwise."""
        uuids = await self.allocations.uuids_for_nodes([r["id"] for r in rows if r["instance_uuid"]])
        return [{**row, "allocation_uuid": uuids.get(row["id"])} for row in rows]

    async def create_node(self, request: web.Request) -> web.Response:
        body = await self.ctx.create_body(request, "node", NODE_CREATE_KEYS, views.NODE_FIELD_VERSIONS)
        values = validate_node_values(body, create=True)
        if request["version"] < ENROLL_SINCE:
            values["provision_state"] = states.AVAILABLE
        if values.get("uuid") is None:  # absent or null: generate one
            values["uuid"] = str(uuidlib.uuid4())
        if values.get("chassis_uuid") is not None:
            await self.existing_chassis(values["chassis_uuid"])
        if values.get("parent_node"):
            values["parent_node"] = await linked_parent(self.ctx.nodes, values, values["parent_node"])
        group = values.get("conductor_group", "")
        await self.ctx.router.require_served(values["uuid"], values["driver"], group)
        reply = await self.ctx.router.call(
            values["uuid"],
            values["driver"],
            group,
            "CreateNode",
            cpb.ConductorCreateNodeRequest(node_json=dumps(values)),
        )
        doc = self.node_doc(request, node_from_json(reply.node_json))
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
        if "chassis_uuid" in values:
            if values["chassis_uuid"] is None:
                params.require_version(request, UNSET_CHASSIS_SINCE, "Removing chassis_uuid")
            else:
                await self.existing_chassis(values["chassis_uuid"])
        if values.get("parent_node"):
            values["parent_node"] = await linked_parent(self.ctx.nodes, node, values["parent_node"])
        if not values:  # nothing changes, but the answer is the same full view a change gets
            unchanged = (await self.with_allocations([node]))[0]
            return web.json_response(self.node_doc(request, unchanged), dumps=dumps)
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
        updated = (await self.with_allocations([node_from_json(reply.node_json)]))[0]
        return web.json_response(self.node_doc(request, updated), dumps=dumps)

    async def list_children(self, request: web.Request) -> web.Response:
        """``GET /v1/nodes/{ident}/children`` (1.83): the UUIDs of the node's children, and
        a link to the node list filtered on them, as Ironic's NodeChildrenController."""
        node = await self.ctx.node_by_ident(request)
        base = self.ctx.base(request)
        return web.json_response(
            {
                "children": await self.ctx.nodes.children(str(node["uuid"])),
                "links": {"href": f"{base}/v1/nodes?parent_node={node['uuid']}", "rel": "children"},
            }
        )

    async def existing_chassis(self, chassis_uuid: str) -> None:
        """A node's chassis must exist; Ironic answers a missing one with 400, not 404,
        since the request is about a node."""
        try:
            await self.chassis.get(chassis_uuid)
        except errors.NotFound as exc:
            raise errors.InvalidParameterValue(str(exc)) from None

    @staticmethod
    def node_doc_for_patch(node: NodeRecord) -> dict[str, Any]:
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
