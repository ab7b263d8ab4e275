"""One LISTEN connection per api process, fanning node-event notifications out
to every WatchNodes stream. Streams read the events table themselves (by
sequence), so a notification is only a wake-up: none can be lost or reordered."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import asyncpg

from services.common.db.events import NOTIFY_CHANNEL


class EventHub:
    def __init__(self, url_or_pool: Any) -> None:
        self._pool = url_or_pool
        self._conn: asyncpg.Connection | None = None
        self._changed = asyncio.Event()
        self._generation = 0
        self._waiters: set[asyncio.Future[None]] = set()

    async def start(self) -> None:
        self._conn = await self._pool.acquire()
        await self._conn.add_listener(NOTIFY_CHANNEL, self._notified)

    async def stop(self) -> None:
        for waiter in self._waiters:
            if not waiter.done():
                waiter.cancel()
        if self._conn is not None:
            try:
                await self._conn.remove_listener(NOTIFY_CHANNEL, self._notified)
            except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError):
                # Still listening: the pool does not UNLISTEN on release (db/pool.py), so end the session.
                self._conn.terminate()
            await self._pool.release(self._conn)
            self._conn = None

    def _notified(self, *_: Any) -> None:
        for waiter in list(self._waiters):
            if not waiter.done():
                waiter.set_result(None)

    async def wait(self, timeout: float) -> None:
        """Return on the next notification, or after ``timeout`` (a safety poll)."""
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.add(waiter)
        try:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(waiter, timeout)
        finally:
            self._waiters.discard(waiter)
