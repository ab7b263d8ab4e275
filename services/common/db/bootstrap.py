"""Getting a ready database: the configured URL, or the embedded PostgreSQL
under the state directory (as its non-superuser service role, which owns the
database); migrations applied either way."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from pathlib import Path

from services.common.config import Settings
from services.common.db import migrate
from services.common.db.embedded import EmbeddedPostgres

LOG = logging.getLogger(__name__)
EMBEDDED_DATABASE = "ferrum"


@dataclass
class Database:
    url: str  # carries the password for the embedded database: show it with credentials.mask_password
    embedded: EmbeddedPostgres | None = None

    async def close(self) -> None:
        if self.embedded is not None:
            await asyncio.to_thread(self.embedded.stop)


async def open_database(settings: Settings) -> Database:
    """Start (if embedded), create the database if needed, and migrate."""
    embedded = None
    url = settings.database.url
    if not url:
        state_dir = await asyncio.to_thread(Path(settings.state_dir).resolve)
        embedded = EmbeddedPostgres(
            state_dir / "postgres",
            port=settings.database.embedded_port,
            fsync=settings.database.embedded_fsync,
        )
        await asyncio.to_thread(embedded.start)
        try:
            await asyncio.to_thread(embedded.ensure_database, EMBEDDED_DATABASE)
        except BaseException:
            await asyncio.to_thread(embedded.stop)
            raise
        # The service role owns the database: migrations run as it, not as the superuser.
        url = embedded.database_url(EMBEDDED_DATABASE)
    try:
        applied = await migrate.upgrade(url)
    except BaseException:
        if embedded is not None:
            await asyncio.to_thread(embedded.stop)
        raise
    if applied:
        LOG.info("database migrated to version %s", applied[-1])
    return Database(url=url, embedded=embedded)
