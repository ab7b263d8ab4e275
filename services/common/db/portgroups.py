"""Port group records (REST 1.23+) and which group each port is in.

The only place with SQL for the ``portgroups`` table and ``ports.portgroup_id``;
keyset pagination on (sort_key, id).
"""

from __future__ import annotations

import builtins
from collections.abc import Mapping, Sequence
from typing import Any, cast

import asyncpg

from services.common import errors
from services.common.db.handles import Database
from services.common.db.keyset import keyset_page
from services.common.db.nodes import is_uuid
from services.common.db.ports import SORT_KEYS as PORT_SORT_KEYS
from services.common.db.records import PortgroupRecord, PortRecord
from services.common.db.rows import row_to_dict

SORT_KEYS = frozenset(("id", "uuid", "name", "address", "created_at", "updated_at"))
WRITABLE = frozenset(
    (
        "uuid",
        "node_id",
        "name",
        "address",
        "mode",
        "properties",
        "extra",
        "standalone_ports_supported",
        "physical_network",
        "category",
    )
)
_SELECT = "SELECT g.*, n.uuid AS node_uuid FROM portgroups g JOIN nodes n ON n.id = g.node_id"
_PORTS = "SELECT p.*, n.uuid AS node_uuid FROM ports p JOIN nodes n ON n.id = p.node_id"


def _conflict(exc: asyncpg.UniqueViolationError, values: Mapping[str, Any]) -> errors.Conflict:
    constraint = exc.constraint_name or ""
    if "address" in constraint:
        return errors.Conflict(f"A port group with MAC address {values.get('address')} already exists.")
    if "name" in constraint:
        return errors.Conflict(f"A port group with name {values.get('name')} already exists.")
    return errors.Conflict(f"A port group with UUID {values.get('uuid')} already exists.")


def _group(row: asyncpg.Record) -> PortgroupRecord:
    return cast(PortgroupRecord, row_to_dict(row))


def _port(row: asyncpg.Record) -> PortRecord:
    return cast(PortRecord, row_to_dict(row))


class PortgroupRepository:
    def __init__(self, db: Database) -> None:
        self._db = db

    async def create(self, values: Mapping[str, Any]) -> PortgroupRecord:
        unknown = set(values) - WRITABLE
        if unknown:
            raise errors.InvalidParameterValue(f"unknown port group fields: {', '.join(sorted(unknown))}")
        columns = list(values)
        marks = ", ".join(f"${i}" for i in range(1, len(columns) + 1))
        try:
            row = await self._db.fetchrow(
                f"WITH g AS (INSERT INTO portgroups ({', '.join(columns)}) VALUES ({marks}) RETURNING *) "
                "SELECT g.*, n.uuid AS node_uuid FROM g JOIN nodes n ON n.id = g.node_id",
                *[values[c] for c in columns],
            )
        except asyncpg.UniqueViolationError as exc:
            raise _conflict(exc, values) from None
        except asyncpg.ForeignKeyViolationError:
            raise errors.NodeNotFound("The port group's node could not be found.") from None
        return cast(PortgroupRecord, row_to_dict(row))

    async def get(self, ident: str) -> PortgroupRecord:
        """By UUID or name."""
        if is_uuid(ident):
            row = await self._db.fetchrow(_SELECT + " WHERE g.uuid = $1::uuid", ident)
        else:
            row = await self._db.fetchrow(_SELECT + " WHERE g.name = $1", ident)
        if row is None:
            raise errors.NotFound(f"Port group {ident} could not be found.")
        return cast(PortgroupRecord, row_to_dict(row))

    async def list(
        self,
        *,
        node_id: int | None = None,
        address: str | None = None,
        conductor_groups: Sequence[str] | None = None,
        node_shards: Sequence[str] | None = None,
        limit: int,
        marker: str | None = None,
        sort_key: str = "id",
        sort_dir: str = "asc",
    ) -> builtins.list[PortgroupRecord]:
        where: list[str] = []
        args: list[Any] = []
        if node_id is not None:
            args.append(node_id)
            where.append(f"g.node_id = ${len(args)}")
        if address is not None:
            args.append(address)
            where.append(f"g.address = ${len(args)}")
        if conductor_groups is not None:  # REST 1.99: the groups of the nodes in these conductor groups
            args.append([g.lower() for g in conductor_groups])
            where.append(f"lower(n.conductor_group) = ANY(${len(args)}::text[])")
        if node_shards is not None:  # REST 1.106: the groups of the nodes in these shards
            args.append(list(node_shards))
            where.append(f"n.shard = ANY(${len(args)}::text[])")
        return await keyset_page(
            self._db,
            _SELECT,
            table="portgroups",
            alias="g",
            record=_group,
            limit=limit,
            marker=marker,
            sort_key=sort_key,
            sort_dir=sort_dir,
            sort_keys=SORT_KEYS,
            where=where,
            args=args,
        )

    async def update(self, portgroup_uuid: str, changes: Mapping[str, Any]) -> PortgroupRecord:
        unknown = set(changes) - WRITABLE
        if unknown:
            raise errors.InvalidParameterValue(f"unknown port group fields: {', '.join(sorted(unknown))}")
        columns = list(changes)
        sets = [f"{c} = ${i}" for i, c in enumerate(columns, start=2)] + ["updated_at = now()"]
        try:
            row = await self._db.fetchrow(
                f"WITH g AS (UPDATE portgroups SET {', '.join(sets)} WHERE uuid = $1::uuid RETURNING *) "
                "SELECT g.*, n.uuid AS node_uuid FROM g JOIN nodes n ON n.id = g.node_id",
                portgroup_uuid,
                *[changes[c] for c in columns],
            )
        except asyncpg.UniqueViolationError as exc:
            raise _conflict(exc, changes) from None
        if row is None:
            raise errors.NotFound(f"Port group {portgroup_uuid} could not be found.")
        return cast(PortgroupRecord, row_to_dict(row))

    async def delete_if_empty(self, portgroup_uuid: str) -> None:
        """Delete a group that has no ports; one with ports is a 409, as in Ironic."""
        result = await self._db.execute(
            "DELETE FROM portgroups g WHERE uuid = $1::uuid "
            "AND NOT EXISTS (SELECT 1 FROM ports p WHERE p.portgroup_id = g.id)",
            portgroup_uuid,
        )
        if result.endswith(" 0"):
            if await self._db.fetchval("SELECT 1 FROM portgroups WHERE uuid = $1::uuid", portgroup_uuid):
                raise errors.InvalidState(f"Port group {portgroup_uuid} cannot be deleted because it contains ports.")
            raise errors.NotFound(f"Port group {portgroup_uuid} could not be found.")

    async def ports(
        self, portgroup_id: int, *, limit: int, marker: str | None = None, sort_key: str = "id", sort_dir: str = "asc"
    ) -> builtins.list[PortRecord]:
        """A page of the group's ports, as the ports API renders them."""
        return await keyset_page(
            self._db,
            _PORTS,
            table="ports",
            alias="p",
            record=_port,
            limit=limit,
            marker=marker,
            sort_key=sort_key,
            sort_dir=sort_dir,
            sort_keys=PORT_SORT_KEYS,
            where=["p.portgroup_id = $1"],
            args=[portgroup_id],
        )

    async def set_member_physical_network(self, portgroup_id: int, physical_network: str | None) -> int:
        """Give every port of the group ``physical_network`` (REST 1.102, as Ironic's
        ``Portgroup.update_physical_network``); returns how many ports changed."""
        result = await self._db.execute(
            "UPDATE ports SET physical_network = $2, updated_at = now() "
            "WHERE portgroup_id = $1 AND physical_network IS DISTINCT FROM $2",
            portgroup_id,
            physical_network,
        )
        return int(result.rsplit(" ", 1)[-1])

    async def member_physical_networks(self, portgroup_id: int, *, except_port: str | None = None) -> set[str | None]:
        """The physical networks of the group's ports (``None`` for a port without one), but ``except_port``."""
        rows = await self._db.fetch(
            "SELECT DISTINCT physical_network FROM ports WHERE portgroup_id = $1 "
            "AND ($2::uuid IS NULL OR uuid <> $2::uuid)",
            portgroup_id,
            except_port,
        )
        return {r["physical_network"] for r in rows}

    async def set_port_group(self, port_uuid: str, portgroup_id: int | None) -> None:
        """Put a port in a group (or take it out with None)."""
        await self._db.execute(
            "UPDATE ports SET portgroup_id = $2, updated_at = now() WHERE uuid = $1::uuid", port_uuid, portgroup_id
        )

    async def uuids_by_id(self, portgroup_ids: Sequence[int | None]) -> dict[int | None, str]:
        """Group UUIDs for the ports' ``portgroup_id`` values, in one query."""
        wanted = sorted({i for i in portgroup_ids if i is not None})
        if not wanted:
            return {}
        rows = await self._db.fetch("SELECT id, uuid FROM portgroups WHERE id = ANY($1::bigint[])", wanted)
        return {r["id"]: str(r["uuid"]) for r in rows}

    async def resolve_for_port(self, portgroup_uuid: Any, node_id: int) -> int | None:
        """The id of the group (by UUID, or by name as the CLI sends it) a port on
        ``node_id`` may join; None leaves every group."""
        if portgroup_uuid is None:
            return None
        if not isinstance(portgroup_uuid, str) or not portgroup_uuid:
            raise errors.InvalidParameterValue(f"Expected a port group UUID or name but received {portgroup_uuid!r}.")
        if is_uuid(portgroup_uuid):
            row = await self._db.fetchrow("SELECT id, node_id FROM portgroups WHERE uuid = $1::uuid", portgroup_uuid)
        else:
            row = await self._db.fetchrow("SELECT id, node_id FROM portgroups WHERE name = $1", portgroup_uuid)
        if row is None:
            raise errors.InvalidParameterValue(f"Port group {portgroup_uuid} could not be found.")
        if row["node_id"] != node_id:
            raise errors.InvalidParameterValue(
                f"Port group {portgroup_uuid} belongs to another node; a port can only join its own node's groups."
            )
        return int(row["id"])
