"""Conductor registry: who is alive, where to reach it, what it can drive."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from services.common.db.handles import Database
from services.common.db.rows import row_to_dict


class ConductorRepository:
    def __init__(self, db: Database) -> None:
        self._db = db

    async def register(
        self,
        *,
        hostname: str,
        grpc_address: str,
        conductor_group: str,
        hardware_types: Sequence[str],
        interfaces: Mapping[str, Any],
    ) -> dict[str, Any]:
        """Insert or refresh this conductor's row and mark it online."""
        row = await self._db.fetchrow(
            "INSERT INTO conductors (hostname, grpc_address, conductor_group, hardware_types, interfaces) "
            "VALUES ($1, $2, $3, $4, $5) ON CONFLICT (hostname) DO UPDATE SET "
            "grpc_address = EXCLUDED.grpc_address, conductor_group = EXCLUDED.conductor_group, "
            "hardware_types = EXCLUDED.hardware_types, interfaces = EXCLUDED.interfaces, "
            "online = true, heartbeat_at = now() RETURNING *",
            hostname,
            grpc_address,
            conductor_group,
            list(hardware_types),
            dict(interfaces),
        )
        return row_to_dict(row)  # type: ignore[return-value]

    async def heartbeat(self, hostname: str) -> bool:
        result = await self._db.execute(
            "UPDATE conductors SET heartbeat_at = now(), online = true WHERE hostname = $1", hostname
        )
        return not result.endswith(" 0")

    async def unregister(self, hostname: str) -> None:
        await self._db.execute("UPDATE conductors SET online = false WHERE hostname = $1", hostname)

    async def list_alive(self, timeout: float) -> list[dict[str, Any]]:
        rows = await self._db.fetch(
            "SELECT * FROM conductors WHERE online AND heartbeat_at > now() - make_interval(secs => $1) "
            "ORDER BY hostname",
            timeout,
        )
        return [row_to_dict(r) for r in rows]

    async def list_dead(self, timeout: float) -> list[dict[str, Any]]:
        """Conductors that stopped heartbeating or went offline but still exist."""
        rows = await self._db.fetch(
            "SELECT * FROM conductors WHERE NOT online OR heartbeat_at <= now() - make_interval(secs => $1) "
            "ORDER BY hostname",
            timeout,
        )
        return [row_to_dict(r) for r in rows]

    async def mark_offline(self, hostname: str) -> None:
        await self._db.execute("UPDATE conductors SET online = false WHERE hostname = $1", hostname)

    async def list_all(self) -> list[dict[str, Any]]:
        return [row_to_dict(r) for r in await self._db.fetch("SELECT * FROM conductors ORDER BY hostname")]
