"""One LISTEN connection per api process, fanning node-event notifications out
to every WatchNodes stream. Streams read the events table themselves (by
sequence), so a notification is only a wake-up: none can be lost or reordered.

A stream arms its wake-up (:meth:`EventHub.armed`) before it reads the table
and waits on it after: an event committed between the read and the wait
still wakes it, where a wake-up taken only at the wait would miss that
notification and leave the event unsent until the safety poll, seconds later."""

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

    def armed(self) -> asyncio.Future[None]:
        """A wake-up that the next notification completes, from now on: take it
        before reading the events table, then :meth:`wait` on it."""
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.add(waiter)
        return waiter

    async def wait(self, waiter: asyncio.Future[None], timeout: float) -> None:
        """Return once ``waiter`` was woken (perhaps already), or after ``timeout`` (a safety poll)."""
        try:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(waiter, timeout)
        finally:
            self.disarm(waiter)

    def disarm(self, waiter: asyncio.Future[None]) -> None:
        """Forget a wake-up that will not be waited on (the stream ended, or read a full batch)."""
        self._waiters.discard(waiter)
        waiter.cancel()  # nothing if already woken
