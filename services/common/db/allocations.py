"""Allocation records (REST 1.52) and the search for a node to claim.

The only place with SQL for the ``allocations`` table. Claiming itself (the
node's ``instance_uuid``) goes through the owning conductor; this module
finds candidates and records the outcome.
"""

from __future__ import annotations

import builtins
import contextlib
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any, cast

import asyncpg

from services.common import errors
from services.common.db.handles import Database
from services.common.db.keyset import keyset_page
from services.common.db.nodes import is_uuid
from services.common.db.pool import session_lock
from services.common.db.records import AllocationRecord, NodeRecord
from services.common.db.rows import row_to_dict

SORT_KEYS = frozenset(("id", "uuid", "name", "state", "resource_class", "created_at", "updated_at"))
WRITABLE = frozenset(
    ("uuid", "name", "state", "last_error", "resource_class", "traits", "candidate_nodes", "extra", "node_id", "owner")
)
PATCHABLE = frozenset(("name", "extra"))  # REST 1.57, as Ironic's PATCH_ALLOWED_FIELDS
FILTERS = {
    "state": "a.state = ${}",
    "resource_class": "a.resource_class = ${}",
    "node_id": "a.node_id = ${}",
    "owner": "a.owner = ${}",
}
_SELECT = "SELECT a.*, n.uuid AS node_uuid FROM allocations a LEFT JOIN nodes n ON n.id = a.node_id"
# Serialises node picking across every api process (it spans a conductor call).
PICK_LOCK_ID = 0x4665_7272_4163  # "FerrAc"


def _conflict(exc: asyncpg.UniqueViolationError, values: Mapping[str, Any]) -> errors.Conflict:
    if "name" in (exc.constraint_name or ""):
        return errors.Conflict(f"An allocation with name {values.get('name')} already exists.")
    if "node_id" in (exc.constraint_name or ""):
        return errors.Conflict("The node already has an allocation.")
    return errors.Conflict(f"An allocation with UUID {values.get('uuid')} already exists.")


def _record(row: asyncpg.Record) -> AllocationRecord:
    return cast(AllocationRecord, row_to_dict(row))


class AllocationRepository:
    def __init__(self, db: Database) -> None:
        self._db = db

    async def create(self, values: Mapping[str, Any]) -> AllocationRecord:
        columns = list(values)
        if set(columns) - WRITABLE:
            raise errors.InvalidParameterValue(f"unknown allocation fields: {sorted(set(columns) - WRITABLE)}")
        marks = ", ".join(f"${i}" for i in range(1, len(columns) + 1))
        try:
            row = await self._db.fetchrow(
                f"WITH a AS (INSERT INTO allocations ({', '.join(columns)}) VALUES ({marks}) RETURNING *) "
                "SELECT a.*, n.uuid AS node_uuid FROM a LEFT JOIN nodes n ON n.id = a.node_id",
                *[values[c] for c in columns],
            )
        except asyncpg.UniqueViolationError as exc:
            raise _conflict(exc, values) from None
        return cast(AllocationRecord, row_to_dict(row))

    async def get(self, ident: str) -> AllocationRecord:
        """By UUID or name."""
        if is_uuid(ident):
            row = await self._db.fetchrow(_SELECT + " WHERE a.uuid = $1::uuid", ident)
        else:
            row = await self._db.fetchrow(_SELECT + " WHERE a.name = $1", ident)
        if row is None:
            raise errors.NotFound(f"Allocation {ident} could not be found.")
        return cast(AllocationRecord, row_to_dict(row))

    async def for_node(self, node_id: int) -> AllocationRecord:
        row = await self._db.fetchrow(_SELECT + " WHERE a.node_id = $1", node_id)
        if row is None:
            raise errors.NotFound("The node has no allocation.")
        return cast(AllocationRecord, row_to_dict(row))

    async def list(
        self,
        *,
        filters: Mapping[str, Any],
        limit: int,
        marker: str | None = None,
        sort_key: str = "id",
        sort_dir: str = "asc",
    ) -> builtins.list[AllocationRecord]:
        """One page; ``filters`` maps names of FILTERS to the values they must have."""
        where: builtins.list[str] = []
        args: builtins.list[Any] = []
        for name, value in filters.items():
            args.append(value)
            where.append(FILTERS[name].format(len(args)))
        return await keyset_page(
            self._db,
            _SELECT,
            table="allocations",
            alias="a",
            record=_record,
            limit=limit,
            marker=marker,
            sort_key=sort_key,
            sort_dir=sort_dir,
            sort_keys=SORT_KEYS,
            where=where,
            args=args,
        )

    async def finish(
        self, allocation_id: int, *, node_id: int | None, state: str, last_error: str | None
    ) -> AllocationRecord:
        try:
            row = await self._db.fetchrow(
                "WITH a AS (UPDATE allocations SET node_id = $2, state = $3, last_error = $4, updated_at = now() "
                "WHERE id = $1 RETURNING *) SELECT a.*, n.uuid AS node_uuid FROM a LEFT JOIN nodes n ON n.id = a.node_id",
                allocation_id,
                node_id,
                state,
                last_error,
            )
        except asyncpg.UniqueViolationError as exc:
            raise _conflict(exc, {}) from None
        if row is None:  # deleted while it was being processed
            raise errors.NotFound(f"Allocation {allocation_id} could not be found.")
        return cast(AllocationRecord, row_to_dict(row))

    async def update(self, allocation_id: int, changes: Mapping[str, Any]) -> AllocationRecord:
        """Change an allocation's ``name`` and/or ``extra`` (the only patchable fields)."""
        columns = list(changes)
        if set(columns) - PATCHABLE:
            raise errors.InvalidParameterValue(
                f"allocation fields that cannot change: {sorted(set(columns) - PATCHABLE)}"
            )
        sets = [f"{c} = ${i}" for i, c in enumerate(columns, start=2)] + ["updated_at = now()"]
        try:
            row = await self._db.fetchrow(
                f"WITH a AS (UPDATE allocations SET {', '.join(sets)} WHERE id = $1 RETURNING *) "
                "SELECT a.*, n.uuid AS node_uuid FROM a LEFT JOIN nodes n ON n.id = a.node_id",
                allocation_id,
                *[changes[c] for c in columns],
            )
        except asyncpg.UniqueViolationError as exc:
            raise _conflict(exc, changes) from None
        if row is None:
            raise errors.NotFound(f"Allocation {allocation_id} could not be found.")
        return cast(AllocationRecord, row_to_dict(row))

    async def delete(self, allocation_id: int) -> None:
        await self._db.execute("DELETE FROM allocations WHERE id = $1", allocation_id)

    async def candidates(
        self,
        *,
        resource_class: str | None,
        traits: Sequence[str],
        node_uuids: Sequence[str] | None,
        owner: str | None = None,
        name: str | None = None,
    ) -> builtins.list[NodeRecord]:
        """Nodes that could take the allocation, in random order as Ironic tries them,
        except that a node named as the allocation (``name``, Ironic's 1.79)
        comes first, then the unlocked ones (a locked one may be free in a moment and is retried):
        available, not in maintenance, not retired, not a child node (Ironic's node list
        hides children), no instance, no allocation,
        of the resource class and with every requested trait; with an ``owner``
        (REST 1.60/1.65) only nodes that project owns or leases."""
        args: list[Any] = [resource_class, list(traits), name]
        extra = ""
        if node_uuids is not None:
            args.append(list(node_uuids))
            extra = f" AND n.uuid = ANY(${len(args)}::uuid[])"
        if owner is not None:
            args.append(owner)
            extra += f" AND (n.owner = ${len(args)} OR n.lessee = ${len(args)})"
        rows = await self._db.fetch(
            "SELECT n.* FROM nodes n WHERE n.provision_state = 'available' AND NOT n.maintenance AND NOT n.retired "
            "AND n.instance_uuid IS NULL AND n.parent_node IS NULL AND n.resource_class = $1 "
            "AND n.traits @> $2::text[] AND NOT EXISTS (SELECT 1 FROM allocations a WHERE a.node_id = n.id)"
            f"{extra} ORDER BY coalesce(n.name = $3::text, false) DESC, "
            "n.reservation IS NOT NULL, random() LIMIT 50",
            *args,
        )
        # Whole node rows, their secrets still sealed: the caller routes on uuid, driver and group only.
        return [cast(NodeRecord, row_to_dict(r)) for r in rows]

    @contextlib.asynccontextmanager
    async def pick_lock(self) -> AsyncIterator[None]:
        """Hold the advisory lock that serialises node picking across every api
        process; it is a session lock, so it stays on one connection throughout."""
        async with contextlib.AsyncExitStack() as stack:
            conn: Any = self._db
            owned = isinstance(conn, asyncpg.Pool)
            if owned:
                conn = await stack.enter_async_context(conn.acquire())
            await stack.enter_async_context(session_lock(conn, "$1", PICK_LOCK_ID, owned=owned))
            yield

    async def uuids_for_nodes(self, node_ids: Sequence[int | None]) -> dict[int | None, str]:
        """node id -> allocation UUID, in one query (for the nodes' allocation_uuid field)."""
        wanted = sorted({i for i in node_ids if i is not None})
        if not wanted:
            return {}
        rows = await self._db.fetch("SELECT node_id, uuid FROM allocations WHERE node_id = ANY($1::bigint[])", wanted)
        return {r["node_id"]: str(r["uuid"]) for r in rows}
