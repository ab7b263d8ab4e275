"""asyncpg connection pools with JSONB decoded to Python objects."""

from __future__ import annotations

import json
from typing import Any

import asyncpg


async def _init_connection(conn: asyncpg.Connection) -> None:
    await conn.set_type_codec("jsonb", encoder=json.dumps, decoder=json.loads, schema="pg_catalog")
    await conn.set_type_codec("json", encoder=json.dumps, decoder=json.loads, schema="pg_catalog")


async def create_pool(url: str, *, min_size: int = 1, max_size: int = 10, **kwargs: Any) -> asyncpg.Pool:
    """A pool whose connections speak JSON for jsonb columns.

    Statement caching stays on: repositories use a fixed set of named queries,
    so every hot query is prepared once per connection.
    """
    return await asyncpg.create_pool(url, min_size=min_size, max_size=max_size, init=_init_connection, **kwargs)
