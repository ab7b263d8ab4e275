"""Secrets Ferrum generates once and every process shares.

Kept in PostgreSQL because it is the one thing every Ferrum process (api,
conductors, renderers, object stores, on any host) already shares, and the
embedded server admits only Ferrum's own role (docs/security.md). The first
process to ask creates the value; everyone after reads the same one.
"""

from __future__ import annotations

import secrets

import asyncpg


class SecretRepository:
    def __init__(self, db: asyncpg.Pool | asyncpg.Connection) -> None:
        self._db = db

    async def get_or_create(self, name: str, candidate: str | None = None) -> str:
        """The stored secret of that name; the first caller's ``candidate`` (or a
        new 256-bit random value) wins."""
        await self._db.execute(
            "INSERT INTO service_secrets (name, value) VALUES ($1, $2) ON CONFLICT (name) DO NOTHING",
            name,
            candidate or secrets.token_urlsafe(32),
        )
        return str(await self._db.fetchval("SELECT value FROM service_secrets WHERE name = $1", name))
