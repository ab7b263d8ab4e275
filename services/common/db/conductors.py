"""Conductor registry: who is alive, where to reach it, what it can drive.

A conductor is alive while it is online, heartbeats within the timeout and,
if it registered with a liveness lock, its database session still holds
that lock. The lock goes away the moment the process dies (the server sees
the socket close), so a killed conductor is found within a second instead of
a heartbeat timeout. Right after a PostgreSQL restart every session is new
and the locks are being taken again, so for ``restart_grace`` seconds only
the heartbeat counts.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, cast

from services.common.db.handles import Database
from services.common.db.records import ConductorRecord
from services.common.db.rows import row_to_dict

LIVENESS_LOCK_CLASS = 0x46455243  # "FERC": the first key of pg_try_advisory_lock(int, int)

_ALIVE = (
    "(c.online AND c.heartbeat_at > now() - make_interval(secs => $1) AND (NOT c.liveness_lock "
    "OR pg_postmaster_start_time() > now() - make_interval(secs => $2) "
    "OR EXISTS (SELECT 1 FROM pg_locks l WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 2 "
    f"AND l.classid = {LIVENESS_LOCK_CLASS}::oid AND l.objid = c.id::oid "
    "AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()))))"
)


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
        liveness_lock: bool = False,
    ) -> ConductorRecord:
        """Insert or refresh this conductor's row and mark it online."""
        row = await self._db.fetchrow(
            "INSERT INTO conductors (hostname, grpc_address, conductor_group, hardware_types, interfaces, "
            "liveness_lock) VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (hostname) DO UPDATE SET "
            "grpc_address = EXCLUDED.grpc_address, conductor_group = EXCLUDED.conductor_group, "
            "hardware_types = EXCLUDED.hardware_types, interfaces = EXCLUDED.interfaces, "
            "liveness_lock = EXCLUDED.liveness_lock, online = true, heartbeat_at = now() RETURNING *",
            hostname,
            grpc_address,
            conductor_group,
            list(hardware_types),
            dict(interfaces),
            liveness_lock,
        )
        return cast(ConductorRecord, row_to_dict(row))

    async def row_id(self, hostname: str) -> int:
        """This hostname's row id (the key of its liveness lock), creating an
        offline row for a conductor starting for the first time."""
        return int(
            await self._db.fetchval(
                "INSERT INTO conductors (hostname, grpc_address, online) VALUES ($1, '', false) "
                "ON CONFLICT (hostname) DO UPDATE SET hostname = EXCLUDED.hostname RETURNING id",
                hostname,
            )
        )

    async def try_liveness_lock(self, conductor_id: int) -> bool:
        """Take this conductor's liveness lock for the session (on a connection
        of its own: the lock lives exactly as long as that session)."""
        return bool(
            await self._db.fetchval("SELECT pg_try_advisory_lock($1::int, $2::int)", LIVENESS_LOCK_CLASS, conductor_id)
        )

    async def ping(self, *, timeout: float) -> None:
        """A round trip on the liveness session: fails when the session is gone."""
        await self._db.fetchval("SELECT 1", timeout=timeout)

    async def heartbeat(self, hostname: str) -> bool:
        result = await self._db.execute(
            "UPDATE conductors SET heartbeat_at = now(), online = true WHERE hostname = $1", hostname
        )
        return not result.endswith(" 0")

    async def unregister(self, hostname: str) -> None:
        await self._db.execute("UPDATE conductors SET online = false WHERE hostname = $1", hostname)

    async def list_alive(self, timeout: float, *, restart_grace: float = 10.0) -> list[ConductorRecord]:
        rows = await self._db.fetch(
            f"SELECT c.* FROM conductors c WHERE {_ALIVE} ORDER BY c.hostname", timeout, restart_grace
        )
        return [cast(ConductorRecord, row_to_dict(r)) for r in rows]

    async def list_dead(self, timeout: float, *, restart_grace: float = 10.0) -> list[ConductorRecord]:
        """Conductors that went offline, stopped heartbeating or lost their session, but still exist."""
        rows = await self._db.fetch(
            f"SELECT c.* FROM conductors c WHERE NOT {_ALIVE} ORDER BY c.hostname", timeout, restart_grace
        )
        return [cast(ConductorRecord, row_to_dict(r)) for r in rows]

    async def mark_offline(self, hostname: str) -> None:
        await self._db.execute("UPDATE conductors SET online = false WHERE hostname = $1", hostname)

    async def list_all(self) -> list[ConductorRecord]:
        return [
            cast(ConductorRecord, row_to_dict(r))
            for r in await self._db.fetch("SELECT * FROM conductors ORDER BY hostname")
        ]
