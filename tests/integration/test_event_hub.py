"""The api's LISTEN fan-out (services/api/event_hub.py) against a real
PostgreSQL: a wake-up armed before a reader's read of the events table is
woken by an event committed before the reader waits, so WatchNodes sends
that event at once rather than at its safety poll."""

from __future__ import annotations

import asyncio
import time
import uuid

import asyncpg

from services.api.event_hub import EventHub
from services.common.db.pool import create_pool


async def record_event(pool: asyncpg.Pool) -> None:
    """An event row as the conductor writes one; its trigger sends the NOTIFY."""
    await pool.execute(
        "INSERT INTO node_events (node_uuid, event, provision_state) VALUES ($1::uuid, 'manage', 'verifying')",
        str(uuid.uuid4()),
    )


async def test_an_event_between_read_and_wait_wakes_the_reader(database_url: str) -> None:
    pool = await create_pool(database_url, min_size=1, max_size=3)
    hub = EventHub(pool)
    await hub.start()
    try:
        woken = hub.armed()  # a stream arms, then reads the table...
        await record_event(pool)  # ...an event commits meanwhile...
        deadline = time.monotonic() + 10  # ...and its notification arrives before the stream waits
        while not woken.done() and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        assert woken.done()
        started = time.monotonic()
        await hub.wait(woken, timeout=10.0)
        assert time.monotonic() - started < 1.0  # woken at once, not at the safety poll

        late = hub.armed()  # armed after that notification: nothing has woken it
        started = time.monotonic()
        await hub.wait(late, timeout=0.3)
        assert time.monotonic() - started >= 0.3

        live = hub.armed()
        waiting = asyncio.create_task(hub.wait(live, timeout=10.0))
        await asyncio.sleep(0.1)
        started = time.monotonic()
        await record_event(pool)
        await asyncio.wait_for(waiting, 5.0)  # a notification while waiting wakes it too
        assert time.monotonic() - started < 5.0
        assert not hub._waiters  # every wake-up was forgotten once used
    finally:
        await hub.stop()
        await pool.close()
