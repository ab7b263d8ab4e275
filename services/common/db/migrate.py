"""Forward-only schema migrations, safe when many processes start at once.

Migrations are ``migrations/NNNN_name.sql`` files applied in order, each in its
own transaction, recorded in ``schema_migrations``. A session-level advisory
lock serialises concurrent upgraders: the first applies, the others wait and
then find nothing left to do.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from importlib import resources

import asyncpg

LOG = logging.getLogger(__name__)
ADVISORY_LOCK_ID = 0x4665_7272_756D  # "Ferrum"
_NAME = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str


def load_migrations() -> list[Migration]:
    """All migrations shipped with the package, in version order."""
    found = []
    for entry in resources.files("services.common.db").joinpath("migrations").iterdir():
        match = _NAME.match(entry.name)
        if match:
            found.append(Migration(int(match.group(1)), match.group(2), entry.read_text()))
    found.sort(key=lambda m: m.version)
    versions = [m.version for m in found]
    if len(set(versions)) != len(versions):
        raise RuntimeError(f"duplicate migration versions: {versions}")
    return found


async def upgrade(url: str) -> list[int]:
    """Apply pending migrations; returns the versions applied by this call."""
    conn = await asyncpg.connect(url)
    try:
        return await upgrade_connection(conn)
    finally:
        await conn.close()


async def upgrade_connection(conn: asyncpg.Connection) -> list[int]:
    applied_now: list[int] = []
    await conn.execute("SELECT pg_advisory_lock($1)", ADVISORY_LOCK_ID)
    try:
        await conn.execute(
            "CREATE TABLE IF NOT EXISTS schema_migrations ("
            " version integer PRIMARY KEY, name text NOT NULL,"
            " applied_at timestamptz NOT NULL DEFAULT now())"
        )
        done = {r["version"] for r in await conn.fetch("SELECT version FROM schema_migrations")}
        for migration in load_migrations():
            if migration.version in done:
                continue
            async with conn.transaction():
                await conn.execute(migration.sql)
                await conn.execute(
                    "INSERT INTO schema_migrations (version, name) VALUES ($1, $2)",
                    migration.version,
                    migration.name,
                )
            LOG.info("applied migration version=%s name=%s", migration.version, migration.name)
            applied_now.append(migration.version)
    finally:
        await conn.execute("SELECT pg_advisory_unlock($1)", ADVISORY_LOCK_ID)
    return applied_now


async def current_version(url: str) -> int:
    conn = await asyncpg.connect(url)
    try:
        exists = await conn.fetchval("SELECT to_regclass('schema_migrations') IS NOT NULL")
        if not exists:
            return 0
        return int(await conn.fetchval("SELECT coalesce(max(version), 0) FROM schema_migrations"))
    finally:
        await conn.close()
