"""Paged reads of the conductor registry for the REST conductors API (1.49).

``alive`` is computed here the way the api's hash ring decides it: online and
heartbeating within ``heartbeat_timeout`` seconds.
"""

from __future__ import annotations

import builtins
from typing import Any, cast

from services.common import errors
from services.common.db.handles import Database
from services.common.db.records import ConductorSummaryRecord
from services.common.db.rows import row_to_dict

SORT_KEYS = frozenset(("id", "hostname", "conductor_group", "created_at", "heartbeat_at"))
_SELECT = (
    "SELECT id, hostname, conductor_group, hardware_types, created_at, heartbeat_at, "
    "online AND heartbeat_at > now() - make_interval(secs => $1) AS alive FROM conductors"
)


class ConductorListRepository:
    def __init__(self, db: Database) -> None:
        self._db = db

    async def list(
        self,
        *,
        heartbeat_timeout: float,
        limit: int,
        marker: str | None = None,
        sort_key: str = "id",
        sort_dir: str = "asc",
    ) -> builtins.list[ConductorSummaryRecord]:
        """One page, keyset-paginated on (sort_key, id); ``marker`` is a hostname."""
        if sort_key not in SORT_KEYS:
            raise errors.InvalidParameterValue(f"The sort_key value {sort_key!r} is an invalid field for sorting")
        if sort_dir not in ("asc", "desc"):
            raise errors.InvalidParameterValue(
                f"Invalid sort direction: {sort_dir}. Acceptable values are 'asc' or 'desc'"
            )
        args: list[Any] = [heartbeat_timeout]
        where = ""
        op = ">" if sort_dir == "asc" else "<"
        if marker is not None:
            row = await self._db.fetchrow(f"SELECT id, {sort_key} AS k FROM conductors WHERE hostname = $1", marker)
            if row is None:
                raise errors.InvalidParameterValue(f"Marker {marker} could not be found.")
            args += [row["k"], row["id"]]
            where = f" WHERE ({sort_key}, id) {op} ($2, $3)"
        args.append(limit)
        rows = await self._db.fetch(
            f"{_SELECT}{where} ORDER BY {sort_key} {sort_dir}, id {sort_dir} LIMIT ${len(args)}", *args
        )
        return [cast(ConductorSummaryRecord, row_to_dict(r)) for r in rows]

    async def get(self, hostname: str, *, heartbeat_timeout: float) -> ConductorSummaryRecord:
        row = await self._db.fetchrow(f"{_SELECT} WHERE hostname = $2", heartbeat_timeout, hostname)
        if row is None:
            raise errors.NotFound(f"Conductor {hostname} could not be found.")
        return cast(ConductorSummaryRecord, row_to_dict(row))
