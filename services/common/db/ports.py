"""Port queries. MAC addresses arrive normalized (lowercase, colon-separated)."""

from __future__ import annotations

import builtins
from collections.abc import Mapping, Sequence
from typing import Any, cast

import asyncpg

from services.common import errors
from services.common.db.handles import Database
from services.common.db.nodes import is_uuid
from services.common.db.records import PortRecord
from services.common.db.rows import row_to_dict

WRITABLE_FIELDS = frozenset(
    (
        "uuid",
        "node_id",
        "address",
        "name",
        "pxe_enabled",
        "extra",
        "internal_info",
        "local_link_connection",
        "physical_network",
        "is_smartnic",
        "description",
        "vendor",
        "category",
        "available_for_dynamic_portgroup",
    )
)
SORT_KEYS = frozenset(("id", "uuid", "address", "created_at", "updated_at", "name"))
_SELECT = "SELECT p.*, n.uuid AS node_uuid FROM ports p JOIN nodes n ON n.id = p.node_id"


class PortRepository:
    def __init__(self, db: Database) -> None:
        self._db = db

    async def create(self, values: Mapping[str, Any], *, node_uuid: str | None = None) -> PortRecord:
        """Insert the port. With ``node_uuid`` (instead of ``node_id`` in ``values``)
        the node's id is looked up by the same statement, one round trip less for
        the api; a node that does not exist is ``NodeNotFound``."""
        unknown = set(values) - WRITABLE_FIELDS
        if unknown:
            raise errors.InvalidParameterValue(f"unknown port fields: {', '.join(sorted(unknown))}")
        columns = list(values)
        placeholders = [f"${i}" for i in range(1, len(columns) + 1)]
        args = [values[c] for c in columns]
        if node_uuid is not None:
            args.append(node_uuid)
            columns.append("node_id")
            placeholders.append(f"(SELECT id FROM nodes WHERE uuid = ${len(args)}::uuid)")
        try:
            row = await self._db.fetchrow(
                f"WITH p AS (INSERT INTO ports ({', '.join(columns)}) VALUES ({', '.join(placeholders)}) RETURNING *) "
                "SELECT p.*, n.uuid AS node_uuid FROM p JOIN nodes n ON n.id = p.node_id",
                *args,
            )
        except asyncpg.UniqueViolationError as exc:
            raise _unique_error(exc, values) from None
        except (asyncpg.ForeignKeyViolationError, asyncpg.NotNullViolationError):
            # NOT NULL: the subquery found no node of that UUID (deleted meanwhile, or never).
            raise errors.NodeNotFound("The port's node could not be found.") from None
        return cast(PortRecord, row_to_dict(row))

    async def get(self, ident: str) -> PortRecord:
        if is_uuid(ident):
            row = await self._db.fetchrow(_SELECT + " WHERE p.uuid = $1::uuid", ident)
        else:
            row = await self._db.fetchrow(_SELECT + " WHERE p.name = $1", ident)
        port = cast(PortRecord, row_to_dict(row))
        if port is None:
            raise errors.PortNotFound(f"Port {ident} could not be found.")
        return port

    async def get_by_address(self, address: str) -> PortRecord | None:
        return cast(PortRecord | None, row_to_dict(await self._db.fetchrow(_SELECT + " WHERE p.address = $1", address)))

    async def list(
        self,
        *,
        node_id: int | None = None,
        address: str | None = None,
        node_shards: Sequence[str] | None = None,
        conductor_groups: Sequence[str] | None = None,
        limit: int = 1000,
        marker: str | None = None,
        sort_key: str = "id",
        sort_dir: str = "asc",
    ) -> builtins.list[PortRecord]:
        if sort_key not in SORT_KEYS:
            raise errors.InvalidParameterValue(f"The sort_key value {sort_key!r} is an invalid field for sorting")
        if sort_dir not in ("asc", "desc"):
            raise errors.InvalidParameterValue(f"Invalid sort direction: {sort_dir}.")
        where: list[str] = []
        args: list[Any] = []
        if node_id is not None:
            args.append(node_id)
            where.append(f"p.node_id = ${len(args)}")
        if address is not None:
            args.append(address)
            where.append(f"p.address = ${len(args)}")
        if node_shards is not None:
            args.append(list(node_shards))
            where.append(f"n.shard = ANY(${len(args)}::text[])")
        if conductor_groups is not None:  # REST 1.99: the ports of the nodes in these groups
            args.append([g.lower() for g in conductor_groups])
            where.append(f"lower(n.conductor_group) = ANY(${len(args)}::text[])")
        op = ">" if sort_dir == "asc" else "<"
        if marker:
            row = (
                await self._db.fetchrow(f"SELECT id, {sort_key} AS k FROM ports WHERE uuid = $1::uuid", marker)
                if is_uuid(marker)
                else None
            )
            if row is None:
                raise errors.InvalidParameterValue(f"Marker {marker} could not be found.")
            if sort_key == "id":
                args.append(row["id"])
                where.append(f"p.id {op} ${len(args)}")
            else:
                args.extend([row["k"], row["id"]])
                where.append(f"((p.{sort_key}, p.id) {op} (${len(args) - 1}, ${len(args)}))")
        args.append(limit)
        sql = (
            _SELECT
            + (f" WHERE {' AND '.join(where)}" if where else "")
            + f" ORDER BY p.{sort_key} {sort_dir.upper()}, p.id {sort_dir.upper()} LIMIT ${len(args)}"
        )
        return [cast(PortRecord, row_to_dict(r)) for r in await self._db.fetch(sql, *args)]

    async def list_for_node_ids(self, node_ids: Sequence[int]) -> builtins.list[PortRecord]:
        rows = await self._db.fetch(_SELECT + " WHERE p.node_id = ANY($1::bigint[]) ORDER BY p.id", list(node_ids))
        return [cast(PortRecord, row_to_dict(r)) for r in rows]

    async def update(self, port_uuid: str, changes: Mapping[str, Any]) -> PortRecord:
        unknown = set(changes) - WRITABLE_FIELDS
        if unknown:
            raise errors.InvalidParameterValue(f"unknown port fields: {', '.join(sorted(unknown))}")
        columns = [c for c in changes if c != "uuid"]
        sets = [f"{c} = ${i}" for i, c in enumerate(columns, start=2)] + ["updated_at = now()"]
        try:
            row = await self._db.fetchrow(
                f"WITH p AS (UPDATE ports SET {', '.join(sets)} WHERE uuid = $1::uuid RETURNING *) "
                "SELECT p.*, n.uuid AS node_uuid FROM p JOIN nodes n ON n.id = p.node_id",
                port_uuid,
                *[changes[c] for c in columns],
            )
        except asyncpg.UniqueViolationError as exc:
            raise _unique_error(exc, changes) from None
        except asyncpg.ForeignKeyViolationError:
            raise errors.NodeNotFound("The port's node could not be found.") from None
        if row is None:
            raise errors.PortNotFound(f"Port {port_uuid} could not be found.")
        return cast(PortRecord, row_to_dict(row))

    async def delete(self, port_uuid: str) -> None:
        result = await self._db.execute("DELETE FROM ports WHERE uuid = $1::uuid", port_uuid)
        if result.endswith(" 0"):
            raise errors.PortNotFound(f"Port {port_uuid} could not be found.")


def _unique_error(exc: asyncpg.UniqueViolationError, values: Mapping[str, Any]) -> errors.FerrumError:
    constraint = exc.constraint_name or ""
    if "address" in constraint:
        return errors.MACAlreadyExists(f"A port with MAC address {values.get('address')} already exists.")
    if "name" in constraint:
        return errors.DuplicateName(f"A port with name {values.get('name')} already exists.")
    return errors.Conflict(f"A port with UUID {values.get('uuid')} already exists.")
