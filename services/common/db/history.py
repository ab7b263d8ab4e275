"""Reads of the per-node audit trail (``node_history``) for the REST history API.

Writes stay in ``events.py`` (they commit together with state changes); this
module only pages through what was recorded, keyset-paginated on ``id`` so a
long history is never loaded whole.
"""

from __future__ import annotations

import builtins
from typing import cast

from services.common import errors
from services.common.db.handles import Database
from services.common.db.nodes import is_uuid
from services.common.db.records import NodeHistoryRecord
from services.common.db.rows import row_to_dict


class HistoryRepository:
    def __init__(self, db: Database) -> None:
        self._db = db

    async def list(self, node_id: int, *, limit: int, marker: str | None = None) -> builtins.list[NodeHistoryRecord]:
        """One page of a node's history, oldest first, after ``marker`` (an entry UUID)."""
        if marker is None:
            rows = await self._db.fetch(
                "SELECT * FROM node_history WHERE node_id = $1 ORDER BY id LIMIT $2", node_id, limit
            )
        else:
            if not is_uuid(marker):
                raise errors.InvalidParameterValue(f"Expected a UUID for marker but received {marker}.")
            after = await self._db.fetchval(
                "SELECT id FROM node_history WHERE node_id = $1 AND uuid = $2::uuid", node_id, marker
            )
            if after is None:
                raise errors.NotFound(f"Node history record {marker} could not be found.")
            rows = await self._db.fetch(
                "SELECT * FROM node_history WHERE node_id = $1 AND id > $2 ORDER BY id LIMIT $3",
                node_id,
                after,
                limit,
            )
        return [cast(NodeHistoryRecord, row_to_dict(r)) for r in rows]

    async def get(self, node_id: int, entry_uuid: str) -> NodeHistoryRecord:
        """One entry of this node's history; 404 if it is not this node's."""
        row = None
        if is_uuid(entry_uuid):
            row = await self._db.fetchrow(
                "SELECT * FROM node_history WHERE node_id = $1 AND uuid = $2::uuid", node_id, entry_uuid
            )
        if row is None:
            raise errors.NotFound(f"Node history record {entry_uuid} could not be found.")
        return cast(NodeHistoryRecord, row_to_dict(row))
