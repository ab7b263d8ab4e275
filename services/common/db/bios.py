"""Cached BIOS settings per node (REST 1.40). A BIOS interface stores what it
read from the machine with :meth:`BiosRepository.replace`; the api reads."""

from __future__ import annotations

import builtins
from collections.abc import Mapping
from typing import Any, cast

import asyncpg
from asyncpg.pool import PoolConnectionProxy

from services.common import errors
from services.common.db.handles import Database
from services.common.db.records import BiosSettingRecord
from services.common.db.rows import row_to_dict

REGISTRY_COLUMNS = (
    "attribute_type",
    "allowable_values",
    "lower_bound",
    "max_length",
    "min_length",
    "read_only",
    "reset_required",
    "unique",
    "upper_bound",
)


class BiosRepository:
    def __init__(self, db: Database) -> None:
        self._db = db

    async def list(self, node_id: int) -> builtins.list[BiosSettingRecord]:
        """Every cached setting of a node, by name (a machine has hundreds at most)."""
        rows = await self._db.fetch("SELECT * FROM bios_settings WHERE node_id = $1 ORDER BY name", node_id)
        return [cast(BiosSettingRecord, row_to_dict(r)) for r in rows]

    async def get(self, node_id: int, name: str) -> BiosSettingRecord:
        row = await self._db.fetchrow("SELECT * FROM bios_settings WHERE node_id = $1 AND name = $2", node_id, name)
        if row is None:
            raise errors.NotFound(f"BIOS setting {name} could not be found.")
        return cast(BiosSettingRecord, row_to_dict(row))

    async def replace(
        self, node_id: int, settings: Mapping[str, str | None], registry: Mapping[str, Mapping[str, Any]] | None = None
    ) -> None:
        """Make the cache exactly ``settings`` (name -> value) in one transaction,
        keeping created_at of settings that stay. ``registry`` (name -> some of
        REGISTRY_COLUMNS) is the BIOS attribute registry a Redfish BIOS offers
        (REST 1.74); settings it does not describe keep no details."""
        registry = registry or {}
        for name, details in registry.items():
            unknown = set(details) - set(REGISTRY_COLUMNS)
            if unknown:
                raise errors.InvalidParameterValue(f"BIOS setting {name}: unknown registry fields {sorted(unknown)}")

        async def run(conn: asyncpg.Connection | PoolConnectionProxy) -> None:
            await conn.execute(
                "DELETE FROM bios_settings WHERE node_id = $1 AND NOT (name = ANY($2::text[]))", node_id, list(settings)
            )
            cols = ", ".join(f'"{c}"' for c in REGISTRY_COLUMNS)
            marks = ", ".join(f"${i}" for i in range(4, 4 + len(REGISTRY_COLUMNS)))
            updates = ", ".join(f'"{c}" = EXCLUDED."{c}"' for c in REGISTRY_COLUMNS)
            olds = ", ".join(f'bios_settings."{c}"' for c in REGISTRY_COLUMNS)
            news = ", ".join(f'EXCLUDED."{c}"' for c in REGISTRY_COLUMNS)
            await conn.executemany(
                f"INSERT INTO bios_settings (node_id, name, value, {cols}) VALUES ($1, $2, $3, {marks}) "
                f"ON CONFLICT (node_id, name) DO UPDATE SET value = EXCLUDED.value, {updates}, updated_at = now() "
                f"WHERE (bios_settings.value, {olds}) IS DISTINCT FROM (EXCLUDED.value, {news})",
                [
                    (node_id, name, value, *[registry.get(name, {}).get(c) for c in REGISTRY_COLUMNS])
                    for name, value in settings.items()
                ],
            )

        if isinstance(self._db, asyncpg.Pool):
            async with self._db.acquire() as conn, conn.transaction():
                await run(conn)
        else:
            async with self._db.transaction():
                await run(self._db)
