"""Stored inspection data (migration 0012): one inventory per node."""

from __future__ import annotations

from typing import Any

from services.common import errors
from services.common.db.records import NodeInventoryRecord


class InventoryRepository:
    def __init__(self, db: Any) -> None:
        self._db = db  # a pool or a connection

    async def save(self, node_id: int, inventory: dict[str, Any], plugin_data: dict[str, Any]) -> None:
        """Replace the node's stored inspection data."""
        await self._db.execute(
            "INSERT INTO node_inventory (node_id, inventory, plugin_data) VALUES ($1, $2, $3) "
            "ON CONFLICT (node_id) DO UPDATE SET inventory = EXCLUDED.inventory, "
            "plugin_data = EXCLUDED.plugin_data, created_at = now()",
            node_id,
            inventory,  # the pool's jsonb codec encodes
            plugin_data,
        )

    async def get(self, node_id: int, node_uuid: str) -> NodeInventoryRecord:
        """``{"inventory", "plugin_data"}``; NotFound with Ironic's message when none is stored."""
        row = await self._db.fetchrow(
            "SELECT inventory, plugin_data FROM node_inventory WHERE node_id = $1",
            node_id,
        )
        if row is None:
            raise errors.NotFound(f"Node inventory record for node {node_uuid} could not be found.")
        return {"inventory": row["inventory"], "plugin_data": row["plugin_data"]}
