"""Allocations (microversion 1.52): ask for a node by resource class (and
traits, optionally among candidate nodes) and get one claimed for you.

The api records the allocation, picks a matching node (available, not in
maintenance or retired, without instance or allocation, unlocked) and claims
it by setting its ``instance_uuid`` to the allocation's UUID through the
owning conductor, as Ironic's conductor does. Like Ironic, it answers at once
with the allocation ``allocating`` and picks in the background
(:class:`services.api.background.BackgroundWork`); the allocation then
becomes ``active`` with its ``node_uuid``, or ``error`` with ``last_error``
when no node matches. A locked candidate is retried a few times before it
counts as taken. Picking is serialised across api processes with a
PostgreSQL advisory lock. Deleting an allocation releases
its node (409 while the node is deployed, unless it is in maintenance).
Below 1.52 every route is 404.

Later versions: PATCH of ``name`` and ``extra`` (1.57; 405 before, as in
Ironic); backfill (1.58): ``node`` names an already deployed node, whose
instance becomes the allocation (the allocation's UUID defaults to the node's
``instance_uuid``, ``resource_class`` to the node's); ``owner`` (1.60), shown,
settable on create and usable as a list filter; an allocation with an owner
only takes a node that project owns or leases (1.60/1.65). A node whose name
is the allocation's ``name`` is tried before every other candidate (1.79; as
in Ironic, whose conductor does this whatever version the request asked for).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import uuid as uuidlib
from typing import Any

from aiohttp import web

from ferrum.v1 import conductor_pb2 as cpb
from services.api import params, views
from services.api.collection import next_link
from services.api.context import ApiContext
from services.api.json_patch import apply_patch
from services.api.validators import MAX_TRAITS, is_valid_name, validate_trait
from services.common import errors, states
from services.common.db.allocations import AllocationRepository
from services.common.db.nodes import is_uuid
from services.common.db.records import AllocationRecord, NodeRecord
from services.common.db.rows import iso
from services.common.jsonutil import dumps

SINCE = (1, 52)
PATCH_SINCE = (1, 57)
BACKFILL_SINCE = (1, 58)
OWNER_SINCE = (1, 60)
FIELDS: dict[str, tuple[int, int]] = {
    **dict.fromkeys(
        (
            "uuid",
            "name",
            "node_uuid",
            "state",
            "last_error",
            "resource_class",
            "traits",
            "candidate_nodes",
            "extra",
            "created_at",
            "updated_at",
            "links",
        ),
        SINCE,
    ),
    "owner": OWNER_SINCE,
}
CREATE_KEYS = {"uuid", "name", "resource_class", "traits", "candidate_nodes", "extra", "node", "owner"}
PATCH_READONLY = {
    "uuid",
    "node_uuid",
    "state",
    "last_error",
    "resource_class",
    "traits",
    "candidate_nodes",
    "created_at",
    "updated_at",
    "links",
    "owner",
}
LOG = logging.getLogger(__name__)
RETRY_ON = (errors.NodeLocked, errors.Conflict, errors.ServiceUnavailable, errors.NotFound)


def allocation_document(
    row: AllocationRecord, *, base: str, fields: Any = None, version: tuple[int, int] = SINCE
) -> dict[str, Any]:
    doc = {
        "uuid": row["uuid"],
        "name": row["name"],
        "node_uuid": row["node_uuid"],
        "state": row["state"],
        "last_error": row["last_error"],
        "resource_class": row["resource_class"],
        "traits": row["traits"],
        "candidate_nodes": row["candidate_nodes"],
        "extra": row["extra"],
        "created_at": iso(row["created_at"]),
        "updated_at": iso(row["updated_at"]),
        "links": views.links(base, "allocations", row["uuid"]),
    }
    if version >= OWNER_SINCE:
        doc["owner"] = row.get("owner")
    if fields is not None:
        doc = {k: v for k, v in doc.items() if k in set(fields) | {"links"}}
    return doc


class AllocationsApi:
    def __init__(self, ctx: ApiContext) -> None:
        self.ctx = ctx
        self.repo = AllocationRepository(ctx.pool)

    async def _validate(self, body: dict[str, Any], *, backfill: bool = False) -> dict[str, Any]:
        values = dict(body)
        rc = values.get("resource_class")
        if backfill and rc is None:
            values.pop("resource_class", None)  # the node's, filled in by create
        elif not isinstance(rc, str) or not rc or len(rc) > 80:
            raise errors.InvalidParameterValue(
                "The resource_class field is mandatory when not backfilling: a string of at most 80 characters"
            )
        owner = values.get("owner")
        if owner is not None and (not isinstance(owner, str) or len(owner) > 255):
            raise errors.InvalidParameterValue("owner must be a string of at most 255 characters")
        name = values.get("name")
        if name is not None and not is_valid_name(name):
            raise errors.InvalidParameterValue(f"Cannot use name {name!r}: RFC 3986 unreserved characters, not a UUID")
        if values.get("uuid") is not None and (not isinstance(values["uuid"], str) or not is_uuid(values["uuid"])):
            raise errors.InvalidParameterValue(f"Expected a UUID but received {values['uuid']}.")
        traits = values.get("traits") or []
        if not isinstance(traits, list) or len(traits) > MAX_TRAITS:
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
                    resolved.append((await self.ctx.nodes.get_by_ident(ident))["uuid"])
                except errors.NotFound:
                    raise errors.InvalidParameterValue(f"Candidate node {ident} could not be found.") from None
            values["candidate_nodes"] = sorted(set(resolved))
        return values

    async def create_allocation(self, request: web.Request) -> web.Response:
        body = await self.ctx.create_body(request, "allocation", CREATE_KEYS, FIELDS)
        node_ident = body.pop("node", None)
        node = None
        if node_ident is not None:
            if request["version"] < BACKFILL_SINCE:  # Ironic: Invalid (400), not 406
                raise errors.InvalidParameterValue("Cannot set node when creating an allocation in this API version")
            if not isinstance(node_ident, str) or not node_ident:
                raise errors.InvalidParameterValue(f"Expected a node UUID or name but received {node_ident!r}.")
            try:
                node = await self.ctx.nodes.get_by_ident(node_ident)
            except errors.NotFound:
                raise errors.InvalidParameterValue(f"Node {node_ident} could not be found.") from None
        values = await self._validate(body, backfill=node is not None)
        if node is not None:
            values.setdefault("resource_class", node["resource_class"])
            self._check_backfill(values, node)
        if values.get("uuid") is None:
            values["uuid"] = (node["instance_uuid"] if node is not None else None) or str(uuidlib.uuid4())
        row = await self.repo.create({**values, "state": "allocating"})
        if node is None:
            # Ironic answers at once with the allocation ``allocating`` and picks in the background.
            self.ctx.background.spawn(self._allocate_or_fail(row), name=f"allocation {row['uuid']}")
        else:
            row = await self._backfill(row, node)
        doc = allocation_document(row, base=self.ctx.base(request), version=request["version"])
        return web.json_response(doc, status=201, dumps=dumps, headers={"Location": doc["links"][0]["href"]})

    @staticmethod
    def _check_backfill(values: dict[str, Any], node: NodeRecord) -> None:
        """Ironic's backfill_allocation checks: a deployed node that still fits the request."""
        problems = []
        if node["provision_state"] != states.ACTIVE:
            problems.append(f'Node must be in the "active" state, but the current state is "{node["provision_state"]}"')
        if values["resource_class"] != node["resource_class"]:
            problems.append(
                f"The node's resource class {node['resource_class']} does not match "
                f"the requested resource class {values['resource_class']}"
            )
        missing = set(values.get("traits") or ()) - set(node.get("traits") or ())
        if missing:
            problems.append(f"The node is missing the requested traits {', '.join(sorted(missing))}")
        if values.get("candidate_nodes") and node["uuid"] not in values["candidate_nodes"]:
            problems.append("The node is not among the candidate nodes")
        if problems:
            raise errors.InvalidParameterValue(
                f"Cannot backfill an allocation for node {node['uuid']}: {'; '.join(problems)}"
            )
        if node["instance_uuid"] and values.get("uuid") and node["instance_uuid"] != values["uuid"]:
            raise errors.Conflict(
                f"Node {node['uuid']} is associated with instance {node['instance_uuid']}, "
                f"not with allocation {values['uuid']}."
            )

    async def _backfill(self, row: AllocationRecord, node: NodeRecord) -> AllocationRecord:
        """Tie the allocation to its already deployed node; on any failure the record goes again."""
        try:
            if node["instance_uuid"] != row["uuid"]:
                await self.ctx.rpc(
                    node,
                    "UpdateNode",
                    cpb.ConductorUpdateNodeRequest(
                        node_uuid=node["uuid"], changes_json=dumps({"instance_uuid": row["uuid"]})
                    ),
                )
            return await self.repo.finish(row["id"], node_id=node["id"], state="active", last_error=None)
        except BaseException:
            await self.repo.delete(row["id"])
            raise

    async def patch_allocation(self, request: web.Request) -> web.Response:
        """1.57: only ``name`` and ``extra`` change; 405 before, as Ironic answers."""
        if request["version"] < PATCH_SINCE:
            raise web.HTTPMethodNotAllowed("PATCH", ["GET", "DELETE"])
        row = await self.repo.get(request.match_info["ident"])
        patch = await self.ctx.body(request)
        current = json.loads(
            dumps(
                {k: v for k, v in allocation_document(row, base="", version=request["version"]).items() if k != "links"}
            )
        )
        changes = apply_patch(current, patch, PATCH_READONLY, FIELDS, request["version"])
        if "name" in changes:
            name = changes["name"]
            if name is not None and not is_valid_name(name):
                raise errors.InvalidParameterValue(f"Cannot update allocation with invalid name {name!r}")
        if "extra" in changes:
            if changes["extra"] is None:
                changes["extra"] = {}
            elif not isinstance(changes["extra"], dict):
                raise errors.InvalidParameterValue("extra must be a JSON object")
        if changes:
            row = await self.repo.update(row["id"], changes)
        return web.json_response(
            allocation_document(row, base=self.ctx.base(request), version=request["version"]), dumps=dumps
        )

    async def _allocate_or_fail(self, row: AllocationRecord) -> None:
        """The background pick: whatever goes wrong ends the allocation in ``error``, never ``allocating``."""
        try:
            await self._allocate(row)
        except asyncio.CancelledError:
            await asyncio.shield(self._fail(row, "The allocation was interrupted: the api stopped"))
            raise
        except Exception as exc:  # recorded on the allocation, where the client looks
            LOG.exception("allocation %s failed", row["uuid"])
            await self._fail(row, f"Failed to process allocation {row['uuid']}: {exc}")

    async def _fail(self, row: AllocationRecord, message: str) -> None:
        with contextlib.suppress(errors.NotFound):  # deleted meanwhile: nothing to record
            await self.repo.finish(row["id"], node_id=None, state="error", last_error=message)

    async def _allocate(self, row: AllocationRecord) -> None:
        """Claim the first candidate the owning conductor lets us update.

        A candidate that is locked (a power change is running, say) is tried
        again, like Ironic's ``node_locked_retry_attempts``: up to
        ``[api]node_locked_retry_attempts`` rounds,
        ``node_locked_retry_interval`` seconds apart, each over the locked
        nodes that still match. The pick lock is not held while waiting.
        """
        config = self.ctx.config
        only: list[str] | None = row["candidate_nodes"] or None
        for attempt in range(max(1, config.node_locked_retry_attempts)):
            if attempt:
                await asyncio.sleep(config.node_locked_retry_interval)
            locked: list[str] = []
            async with self.repo.pick_lock():
                candidates = await self.repo.candidates(
                    resource_class=row["resource_class"],
                    traits=row["traits"],
                    node_uuids=only,
                    owner=row.get("owner"),
                    name=row.get("name"),
                )
                for node in candidates:
                    try:
                        await self.ctx.rpc(
                            node,
                            "UpdateNode",
                            cpb.ConductorUpdateNodeRequest(
                                node_uuid=node["uuid"], changes_json=dumps({"instance_uuid": row["uuid"]})
                            ),
                        )
                    except errors.NodeLocked:
                        locked.append(node["uuid"])
                        continue
                    except RETRY_ON:
                        continue
                    await self._finish(row, node)
                    return
            if not locked:
                break
            only = locked
        wanted = f"resource class {row['resource_class']}" + (
            f" and traits {', '.join(row['traits'])}" if row["traits"] else ""
        )
        where = " among the candidate nodes" if row["candidate_nodes"] else ""
        if row.get("owner") is not None:
            where += f" owned or leased by {row['owner']}"
        await self._fail(row, f"No available nodes match the {wanted}{where}")

    async def _finish(self, row: AllocationRecord, node: NodeRecord) -> None:
        """Record the claimed node; if the allocation was deleted meanwhile, give the node back."""
        try:
            await self.repo.finish(row["id"], node_id=node["id"], state="active", last_error=None)
        except errors.NotFound:
            await self.ctx.rpc(
                node,
                "UpdateNode",
                cpb.ConductorUpdateNodeRequest(node_uuid=node["uuid"], changes_json=dumps({"instance_uuid": None})),
            )

    async def list_allocations(self, request: web.Request) -> web.Response:
        q = request.query
        fields = params.requested_fields(request, FIELDS)
        filters: dict[str, Any] = {}
        if "state" in q:
            if q["state"] not in ("allocating", "active", "error"):
                raise errors.InvalidParameterValue(f"Invalid allocation state {q['state']}")
            filters["state"] = q["state"]
        if "resource_class" in q:
            filters["resource_class"] = q["resource_class"]
        if q.get("node"):
            filters["node_id"] = (await self.ctx.nodes.get_by_ident(q["node"]))["id"]
        if "owner" in q:
            params.require_version(request, OWNER_SINCE, "The owner filter")
            filters["owner"] = q["owner"]
        limit = params.page_limit(request, self.ctx.config.max_limit)
        rows = await self.repo.list(
            filters=filters,
            limit=limit,
            **params.page_order(request),
        )
        base = self.ctx.base(request)
        body: dict[str, Any] = {
            "allocations": [allocation_document(r, base=base, fields=fields, version=request["version"]) for r in rows]
        }
        following = next_link(request, rows, base=base, limit=limit)
        if following:
            body["next"] = following
        return web.json_response(body, dumps=dumps)

    async def get_allocation(self, request: web.Request) -> web.Response:
        fields = params.requested_fields(request, FIELDS)
        row = await self.repo.get(request.match_info["ident"])
        return web.json_response(
            allocation_document(row, base=self.ctx.base(request), fields=fields, version=request["version"]),
            dumps=dumps,
        )

    async def get_node_allocation(self, request: web.Request) -> web.Response:
        fields = params.requested_fields(request, FIELDS)
        node = await self.ctx.nodes.get_by_ident(request.match_info["node"])
        row = await self.repo.for_node(node["id"])
        return web.json_response(
            allocation_document(row, base=self.ctx.base(request), fields=fields, version=request["version"]),
            dumps=dumps,
        )

    async def delete_allocation(self, request: web.Request) -> web.Response:
        await self._release(await self.repo.get(request.match_info["ident"]))
        return web.Response(status=204)

    async def delete_node_allocation(self, request: web.Request) -> web.Response:
        node = await self.ctx.nodes.get_by_ident(request.match_info["node"])
        await self._release(await self.repo.for_node(node["id"]))
        return web.Response(status=204)

    async def _release(self, row: AllocationRecord) -> None:
        """Free the node (its instance_uuid, through its conductor), then drop the record."""
        if row["node_uuid"]:
            node = await self.ctx.nodes.get(row["node_uuid"])
            if node["provision_state"] == states.ACTIVE and not node["maintenance"]:
                raise errors.InvalidState(
                    f"Cannot remove allocation {row['uuid']}: node {node['uuid']} is deployed; "
                    "undeploy it or put it in maintenance first"
                )
            if node["instance_uuid"] == row["uuid"]:
                await self.ctx.rpc(
                    node,
                    "UpdateNode",
                    cpb.ConductorUpdateNodeRequest(node_uuid=node["uuid"], changes_json=dumps({"instance_uuid": None})),
                )
        await self.repo.delete(row["id"])
