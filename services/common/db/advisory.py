"""Named advisory locks: one holder at a time across every process that shares the database.

Conductors use one to build a shared boot ISO once: the first to take
``vmedia-iso:<name>`` builds and uploads it, the others wait and then find
the object. A session lock on a dedicated connection, so a conductor that
dies releases it with its connection.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import asyncpg

from services.common.db.pool import session_lock


class AdvisoryLocks:
    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool

    @contextlib.asynccontextmanager
    async def hold(self, name: str) -> AsyncIterator[None]:
        """Wait for, then hold, the lock called ``name`` (hashed to PostgreSQL's 32-bit key space)."""
        async with self._pool.acquire() as conn, session_lock(conn, "hashtext($1)", name):
            yield
