"""Where VIFs are recorded: ``tenant_vif_port_id`` in a port's or port group's internal_info."""

from __future__ import annotations

from typing import cast

import asyncpg

from services.common.db.records import VifPortgroupRecord
from services.common.db.rows import row_to_dict

VIF_KEY = "tenant_vif_port_id"


class VifRepository:
    def __init__(self, db: asyncpg.Pool | asyncpg.Connection) -> None:
        self._db = db

    async def node_holding(self, vif_id: str) -> str | None:
        """The node (uuid) any of whose ports or port groups carries the VIF."""
        value = await self._db.fetchval(
            "SELECT n.uuid FROM ports p JOIN nodes n ON n.id = p.node_id "
            f"WHERE p.internal_info->>'{VIF_KEY}' = $1 UNION ALL "
            "SELECT n.uuid FROM portgroups g JOIN nodes n ON n.id = g.node_id "
            f"WHERE g.internal_info->>'{VIF_KEY}' = $1 LIMIT 1",
            vif_id,
        )
        return None if value is None else str(value)

    async def portgroups_of(self, node_id: int) -> list[VifPortgroupRecord]:
        rows = await self._db.fetch(
            "SELECT id, uuid, node_id, internal_info FROM portgroups WHERE node_id = $1 ORDER BY id", node_id
        )
        return [cast(VifPortgroupRecord, row_to_dict(r)) for r in rows]

    async def portgroup(self, portgroup_uuid: str) -> VifPortgroupRecord | None:
        row = await self._db.fetchrow(
            "SELECT id, uuid, node_id, internal_info FROM portgroups WHERE uuid = $1::uuid", portgroup_uuid
        )
        return cast(VifPortgroupRecord, row_to_dict(row))

    async def set_on_portgroup(self, portgroup_id: int, vif_id: str) -> None:
        await self._db.execute(
            "UPDATE portgroups SET internal_info = internal_info || jsonb_build_object($2::text, $3::text), "
            "updated_at = now() WHERE id = $1",
            portgroup_id,
            VIF_KEY,
            vif_id,
        )

    async def remove_from_portgroups(self, node_id: int, vif_id: str) -> str | None:
        """Take the VIF off the node's port group that has it; its uuid, or None."""
        value = await self._db.fetchval(
            f"UPDATE portgroups SET internal_info = internal_info - '{VIF_KEY}', updated_at = now() "
            f"WHERE node_id = $1 AND internal_info->>'{VIF_KEY}' = $2 RETURNING uuid",
            node_id,
            vif_id,
        )
        return None if value is None else str(value)

    async def remove_all(self, node_id: int) -> list[str]:
        """Take every VIF off the node's ports and port groups (tear down); the VIFs removed."""
        rows = await self._db.fetch(
            f"WITH old AS (SELECT id, internal_info->>'{VIF_KEY}' AS vif FROM ports "
            f"WHERE node_id = $1 AND internal_info ? '{VIF_KEY}' FOR UPDATE), "
            f"oldg AS (SELECT id, internal_info->>'{VIF_KEY}' AS vif FROM portgroups "
            f"WHERE node_id = $1 AND internal_info ? '{VIF_KEY}' FOR UPDATE), "
            f"done AS (UPDATE ports p SET internal_info = p.internal_info - '{VIF_KEY}', updated_at = now() "
            "FROM old WHERE p.id = old.id), "
            f"doneg AS (UPDATE portgroups g SET internal_info = g.internal_info - '{VIF_KEY}', updated_at = now() "
            "FROM oldg WHERE g.id = oldg.id) "
            "SELECT vif FROM old UNION ALL SELECT vif FROM oldg",
            node_id,
        )
        return [str(r["vif"]) for r in rows]
