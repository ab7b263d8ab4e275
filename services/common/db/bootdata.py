"""Everything a boot script needs about one node, read in one round trip.

The iPXE renderer answers every network boot of every machine, so its read
is a single prepared statement: the node row plus its ports, volume targets
and volume connectors aggregated as JSON sub-selects. Any replica reading
the same committed rows renders the same script; nothing is kept on disk.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, cast

import asyncpg

from services.common.db.records import BootNodeRecord

# Every change to what _COLUMNS reads sends NOTIFY on this channel with the
# node's uuid (triggers in migrations/0007_boot_data_notify.sql; keep the two in step).
BOOT_DATA_CHANNEL = "ferrum_boot_data"

_COLUMNS = """
    n.uuid::text AS uuid, n.name, n.driver, n.boot_interface, n.deploy_interface,
    n.storage_interface, n.driver_info, n.driver_internal_info, n.instance_info,
    n.properties, n.provision_state, n.target_provision_state, n.boot_mode,
    coalesce((SELECT jsonb_agg(jsonb_build_object('address', p.address, 'pxe_enabled', p.pxe_enabled)
                               ORDER BY p.id)
              FROM ports p WHERE p.node_id = n.id), '[]'::jsonb) AS ports,
    coalesce((SELECT jsonb_agg(jsonb_build_object('uuid', t.uuid::text, 'volume_type', t.volume_type,
                                                  'boot_index', t.boot_index, 'volume_id', t.volume_id,
                                                  'properties', t.properties) ORDER BY t.boot_index)
              FROM volume_targets t WHERE t.node_id = n.id), '[]'::jsonb) AS volume_targets,
    coalesce((SELECT jsonb_agg(jsonb_build_object('type', c.type, 'connector_id', c.connector_id)
                               ORDER BY c.id)
              FROM volume_connectors c WHERE c.node_id = n.id), '[]'::jsonb) AS volume_connectors
"""

BY_MAC = f"SELECT {_COLUMNS} FROM nodes n WHERE n.id = (SELECT node_id FROM ports WHERE address = $1)"
BY_UUID = f"SELECT {_COLUMNS} FROM nodes n WHERE n.uuid = $1::uuid"


@dataclass(frozen=True, eq=False)
class BootData:
    """A node as the renderer sees it. ``node`` holds the node columns;
    ``ports``, ``volume_targets`` and ``volume_connectors`` are tuples of
    plain dicts (ports by creation order, targets by boot_index).

    Compared and hashed by identity: one read is one snapshot, and a cache
    that hands out the same snapshot lets the renderer reuse its script."""

    node: BootNodeRecord
    ports: tuple[Mapping[str, Any], ...] = ()
    volume_targets: tuple[Mapping[str, Any], ...] = ()
    volume_connectors: tuple[Mapping[str, Any], ...] = ()


class BootDataRepository:
    """The SQL side of the renderer's one-method ``BootDataReader`` Protocol."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool

    async def read(self, *, mac: str | None = None, uuid: str | None = None) -> BootData | None:
        """The node owning port ``mac`` (lowercase, colon form) or with ``uuid``; None if none."""
        if (mac is None) == (uuid is None):
            raise ValueError("read() takes exactly one of mac= or uuid=")
        query, arg = (BY_MAC, mac) if mac is not None else (BY_UUID, uuid)
        record = await self._pool.fetchrow(query, arg)
        if record is None:
            return None
        row = dict(record.items())
        ports = tuple(row.pop("ports") or ())
        targets = tuple(row.pop("volume_targets") or ())
        connectors = tuple(row.pop("volume_connectors") or ())
        node = cast(BootNodeRecord, row)  # _COLUMNS less the three aggregates just popped
        return BootData(node=node, ports=ports, volume_targets=targets, volume_connectors=connectors)
