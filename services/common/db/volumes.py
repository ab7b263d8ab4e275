"""Volume connector and target queries (boot from volume, seed 004)."""

from __future__ import annotations

import builtins
from collections.abc import Mapping
from typing import Any, Generic, TypeVar, cast

import asyncpg

from services.common import errors
from services.common.db.handles import Database
from services.common.db.nodes import is_uuid
from services.common.db.records import (
    NodeVolumeConnector,
    NodeVolumeTarget,
    PortRecord,
    VolumeConnectorRecord,
    VolumeTargetRecord,
)
from services.common.db.rows import row_to_dict

VolumeRecord = VolumeConnectorRecord | VolumeTargetRecord
VolumeT = TypeVar("VolumeT", bound=VolumeRecord)

_SPECS = {
    "connector": ("volume_connectors", frozenset(("uuid", "node_id", "type", "connector_id", "extra"))),
    "target": (
        "volume_targets",
        frozenset(("uuid", "node_id", "volume_type", "boot_index", "volume_id", "properties", "extra")),
    ),
}


class VolumeRepository(Generic[VolumeT]):
    """One repository for both kinds; ``kind`` is ``connector`` or ``target``.

    The caller names the record type with the kind, e.g.
    ``VolumeRepository[VolumeTargetRecord](pool, "target")``: the kind is a
    runtime value (the api picks it per route), so the pairing is the caller's.
    """

    def __init__(self, db: Database, kind: str) -> None:
        self._db = db
        self.kind = kind
        self.table, self.writable = _SPECS[kind]
        self._select = f"SELECT v.*, n.uuid AS node_uuid FROM {self.table} v JOIN nodes n ON n.id = v.node_id"

    def _conflict(self, values: Mapping[str, Any]) -> errors.FerrumError:
        if self.kind == "connector":
            return errors.VolumeConnectorExists(
                f"A volume connector with type {values.get('type')} and connector ID {values.get('connector_id')} already exists."
            )
        return errors.VolumeTargetBootIndexExists(
            f"A volume target with boot index '{values.get('boot_index')}' for the same node already exists."
        )

    async def create(self, values: Mapping[str, Any]) -> VolumeT:
        columns = [c for c in values if c in self.writable]
        placeholders = ", ".join(f"${i}" for i in range(1, len(columns) + 1))
        try:
            row = await self._db.fetchrow(
                f"WITH v AS (INSERT INTO {self.table} ({', '.join(columns)}) VALUES ({placeholders}) RETURNING *) "
                "SELECT v.*, n.uuid AS node_uuid FROM v JOIN nodes n ON n.id = v.node_id",
                *[values[c] for c in columns],
            )
        except asyncpg.UniqueViolationError:
            raise self._conflict(values) from None
        except asyncpg.CheckViolationError as exc:
            raise errors.InvalidParameterValue(f"invalid volume {self.kind}: {exc.constraint_name}") from None
        return cast(VolumeT, row_to_dict(row))

    async def get(self, ident: str) -> VolumeT:
        row = await self._db.fetchrow(self._select + " WHERE v.uuid = $1::uuid", ident) if is_uuid(ident) else None
        if row is None:
            raise errors.VolumeNotFound(f"Volume {self.kind} {ident} could not be found.")
        return cast(VolumeT, row_to_dict(row))

    async def list(
        self, *, node_id: int | None = None, limit: int = 1000, marker: str | None = None, sort_dir: str = "asc"
    ) -> builtins.list[VolumeT]:
        if sort_dir not in ("asc", "desc"):
            raise errors.InvalidParameterValue(f"Invalid sort direction: {sort_dir}.")
        where, args = [], []
        if node_id is not None:
            args.append(node_id)
            where.append(f"v.node_id = ${len(args)}")
        if marker:
            marker_id = (
                await self._db.fetchval(f"SELECT id FROM {self.table} WHERE uuid = $1::uuid", marker)
                if is_uuid(marker)
                else None
            )
            if marker_id is None:
                raise errors.InvalidParameterValue(f"Marker {marker} could not be found.")
            args.append(marker_id)
            where.append(f"v.id {'>' if sort_dir == 'asc' else '<'} ${len(args)}")
        args.append(limit)
        sql = (
            self._select
            + (f" WHERE {' AND '.join(where)}" if where else "")
            + f" ORDER BY v.id {sort_dir.upper()} LIMIT ${len(args)}"
        )
        return [cast(VolumeT, row_to_dict(r)) for r in await self._db.fetch(sql, *args)]

    async def update(self, ident: str, changes: Mapping[str, Any]) -> VolumeT:
        columns = [c for c in changes if c in self.writable and c != "uuid"]
        sets = [f"{c} = ${i}" for i, c in enumerate(columns, start=2)] + ["updated_at = now()"]
        try:
            row = await self._db.fetchrow(
                f"WITH v AS (UPDATE {self.table} SET {', '.join(sets)} WHERE uuid = $1::uuid RETURNING *) "
                "SELECT v.*, n.uuid AS node_uuid FROM v JOIN nodes n ON n.id = v.node_id",
                ident,
                *[changes[c] for c in columns],
            )
        except asyncpg.UniqueViolationError:
            raise self._conflict(changes) from None
        if row is None:
            raise errors.VolumeNotFound(f"Volume {self.kind} {ident} could not be found.")
        return cast(VolumeT, row_to_dict(row))

    async def delete(self, ident: str) -> None:
        result = await self._db.execute(f"DELETE FROM {self.table} WHERE uuid = $1::uuid", ident)
        if result.endswith(" 0"):
            raise errors.VolumeNotFound(f"Volume {self.kind} {ident} could not be found.")


# A node's targets (by boot_index) and connectors in one round trip: every
# locked operation reads them, as Ironic's task does, so the interfaces and
# the capability checks see the node's volumes without a query of their own.
_NODE_VOLUMES = """
SELECT
    coalesce((SELECT jsonb_agg(jsonb_build_object('uuid', t.uuid::text, 'volume_type', t.volume_type,
                                                  'boot_index', t.boot_index, 'volume_id', t.volume_id,
                                                  'properties', t.properties, 'extra', t.extra)
                               ORDER BY t.boot_index)
              FROM volume_targets t WHERE t.node_id = $1), '[]'::jsonb) AS targets,
    coalesce((SELECT jsonb_agg(jsonb_build_object('uuid', c.uuid::text, 'type', c.type,
                                                  'connector_id', c.connector_id, 'extra', c.extra)
                               ORDER BY c.id)
              FROM volume_connectors c WHERE c.node_id = $1), '[]'::jsonb) AS connectors
"""


# The same for many nodes in one round trip (the power sync reads a batch of nodes at once).
_NODES_VOLUMES = """
SELECT
    n.id,
    coalesce((SELECT jsonb_agg(jsonb_build_object('uuid', t.uuid::text, 'volume_type', t.volume_type,
                                                  'boot_index', t.boot_index, 'volume_id', t.volume_id,
                                                  'properties', t.properties, 'extra', t.extra)
                               ORDER BY t.boot_index)
              FROM volume_targets t WHERE t.node_id = n.id), '[]'::jsonb) AS targets,
    coalesce((SELECT jsonb_agg(jsonb_build_object('uuid', c.uuid::text, 'type', c.type,
                                                  'connector_id', c.connector_id, 'extra', c.extra)
                               ORDER BY c.id)
              FROM volume_connectors c WHERE c.node_id = n.id), '[]'::jsonb) AS connectors
FROM unnest($1::bigint[]) AS n(id)
"""


async def nodes_volumes(
    db: asyncpg.Pool | asyncpg.Connection, node_ids: list[int]
) -> dict[int, tuple[list[NodeVolumeTarget], list[NodeVolumeConnector]]]:
    """``node_volumes`` of many nodes in one round trip, by node id."""
    rows = await db.fetch(_NODES_VOLUMES, node_ids)
    return {row["id"]: (list(row["targets"]), list(row["connectors"])) for row in rows}


async def node_volumes(
    db: asyncpg.Pool | asyncpg.Connection, node_id: int
) -> tuple[list[NodeVolumeTarget], list[NodeVolumeConnector]]:
    """(volume targets, volume connectors) of one node, as plain dicts."""
    row = await db.fetchrow(_NODE_VOLUMES, node_id)
    assert row is not None  # an aggregate-only SELECT always returns its row
    return list(row["targets"]), list(row["connectors"])


# A locked task's ports (the columns of PortRepository's reads) and volumes in one
# round trip: every lifecycle step reads both right after taking the lock (issue 22).
# One row per port, each carrying the volume aggregates; one row of NULL port
# columns when the node has no port.
_NODE_PORTS_AND_VOLUMES = f"""
SELECT v.targets AS volume_targets_, v.connectors AS volume_connectors_, p.*
FROM ({_NODE_VOLUMES}) v
LEFT JOIN (SELECT p.*, n.uuid AS node_uuid FROM ports p JOIN nodes n ON n.id = p.node_id WHERE p.node_id = $1) p
    ON true
ORDER BY p.id
"""


async def node_ports_and_volumes(
    db: asyncpg.Pool | asyncpg.Connection, node_id: int
) -> tuple[list[PortRecord], list[NodeVolumeTarget], list[NodeVolumeConnector]]:
    """(ports by id, volume targets, volume connectors) of one node: what
    ``PortRepository.list_for_node_ids`` and :func:`node_volumes` return, in one query."""
    rows = await db.fetch(_NODE_PORTS_AND_VOLUMES, node_id)
    ports: list[PortRecord] = []
    for record in rows:
        if record["id"] is not None:
            port = row_to_dict(record)
            del port["volume_targets_"], port["volume_connectors_"]
            ports.append(cast(PortRecord, port))
    return ports, list(rows[0]["volume_targets_"]), list(rows[0]["volume_connectors_"])
