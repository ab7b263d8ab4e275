"""asyncpg connection pools with JSONB decoded to Python objects."""

from __future__ import annotations

import contextlib
import json
import json.scanner
from collections.abc import AsyncIterator
from typing import Any

import asyncpg

# json.loads minus its Python layers (type checks, decode, raw_decode): the same C scanner.
_SCAN = json.scanner.make_scanner(json.JSONDecoder())  # type: ignore[arg-type]  # typeshed names the class, not its argument


def _json_value(text: str) -> Any:
    """A json/jsonb column's value, as ``json.loads`` would return it.

    A node row has about a dozen jsonb columns, most of them ``{}``; at
    ~1.5-4.7 us a value, ``json.loads``' own Python layers cost a list of 200
    nodes about 5 ms (issue 22). PostgreSQL writes jsonb as one bare value, so
    the C scanner reads it whole; anything else (leading space in a json
    column) goes through ``json.loads``, which gives its usual answer or error.
    """
    if text == "{}":
        return {}
    try:
        value, end = _SCAN(text, 0)
    except StopIteration:
        return json.loads(text)
    if end != len(text):
        return json.loads(text)
    return value


async def _init_connection(conn: asyncpg.Connection) -> None:
    await conn.set_type_codec("jsonb", encoder=json.dumps, decoder=_json_value, schema="pg_catalog")
    await conn.set_type_codec("json", encoder=json.dumps, decoder=_json_value, schema="pg_catalog")


async def _keep_session(conn: asyncpg.Connection) -> None:
    """What a released connection needs beyond asyncpg's own clean-up: nothing.

    asyncpg's default reset sends ``pg_advisory_unlock_all(); CLOSE ALL;
    UNLISTEN *; RESET ALL`` on every release, a second round trip for every
    single-query repository call: under the api benchmark (issue 22) a GET
    node waited longer for that reset than for its own query. Before this
    hook runs, asyncpg still rolls back any open transaction and drops the
    connection's listeners. Ferrum leaves no other session state on a pooled
    connection: it sets no session parameters and keeps no cursor outside a
    transaction, and the two session-level users, advisory session locks
    (``session_lock``) and the api's LISTEN (``EventHub``), undo their state
    themselves and terminate the connection when they cannot.
    """


async def create_pool(url: str, *, min_size: int = 1, max_size: int = 10, **kwargs: Any) -> asyncpg.Pool:
    """A pool whose connections speak JSON for jsonb columns.

    Statement caching stays on: repositories use a fixed set of named queries,
    so every hot query is prepared once per connection. Release costs no
    round trip (``_keep_session``).
    """
    kwargs.setdefault("reset", _keep_session)
    return await asyncpg.create_pool(url, min_size=min_size, max_size=max_size, init=_init_connection, **kwargs)


@contextlib.asynccontextmanager
async def session_lock(conn: Any, key_sql: str, *args: Any, owned: bool = True) -> AsyncIterator[None]:
    """Hold ``pg_advisory_lock(<key_sql>)`` on ``conn`` for the block.

    A session lock outlives a failed or cancelled lock or unlock call, and the
    pool does not clear it on release (``_keep_session``), so when either call
    does not complete, a connection the caller ``owned`` (took from the pool
    for this lock) is terminated: the server then drops the lock with the
    session, and the pool opens a fresh connection in its place.
    """
    try:
        await conn.execute(f"SELECT pg_advisory_lock({key_sql})", *args)
    except BaseException:
        if owned:
            conn.terminate()
        raise
    try:
        yield
    finally:
        try:
            await conn.execute(f"SELECT pg_advisory_unlock({key_sql})", *args)
        except BaseException:
            if owned:
                conn.terminate()
            raise
