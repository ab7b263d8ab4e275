"""This conductor's liveness lock: a session-level advisory lock on a connection of its own.

PostgreSQL releases a session's advisory locks the moment the session ends,
and a killed process's session ends when the server sees its socket close,
so the other conductors (and the api's ring) know within about a second that
this one is gone, instead of waiting out the heartbeat timeout. The
heartbeat stays as the fallback for what the lock cannot see: a hung process
whose connection stays open, or a host that vanished without closing it.

The lock is also a guard: a second process with the same hostname cannot
take it, and refuses to start rather than share node locks with the first.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable

import asyncpg

from services.common import errors
from services.common.db.conductors import ConductorRepository

LOG = logging.getLogger(__name__)

Connect = Callable[[], Awaitable[asyncpg.Connection]]


class LivenessLock:
    def __init__(
        self, connect: Connect, *, conductor_id: int, hostname: str, check_interval: float, start_timeout: float
    ) -> None:
        self._connect = connect
        self.conductor_id = conductor_id
        self.hostname = hostname
        self.check_interval = check_interval
        self.start_timeout = start_timeout
        self._conn: asyncpg.Connection | None = None
        self._keeper: asyncio.Task[None] | None = None
        self.held = False

    async def start(self) -> None:
        """Take the lock, waiting out a previous incarnation's session for a
        while (a restart right after a crash); then keep it."""
        deadline = time.monotonic() + self.start_timeout
        while not await self._try_lock():
            if time.monotonic() > deadline:
                raise errors.Conflict(
                    f"Another conductor with hostname {self.hostname!r} is running on this database "
                    f"(it holds the liveness lock); give each conductor its own hostname"
                )
            await asyncio.sleep(0.5)
        self._keeper = asyncio.create_task(self._keep(), name="liveness-lock")

    async def _try_lock(self) -> bool:
        conn = await self._connect()
        try:
            got = await ConductorRepository(conn).try_liveness_lock(self.conductor_id)
        except BaseException:
            await _close(conn)
            raise
        if not got:
            await _close(conn)
            return False
        self._conn, self.held = conn, True
        return True

    async def _keep(self) -> None:
        """Notice a lost session (a database restart) and take the lock again."""
        delay = self.check_interval
        while True:
            await asyncio.sleep(delay)
            try:
                if self._conn is None or self._conn.is_closed():
                    raise ConnectionError("liveness connection closed")
                await ConductorRepository(self._conn).ping(timeout=max(self.check_interval * 5, 5.0))
                delay = self.check_interval
                continue
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - any failure of the check means the session is gone
                if self.held:
                    LOG.warning("liveness lock lost hostname=%s reason=%s; taking it again", self.hostname, exc)
                self.held = False
                if self._conn is not None:
                    await _close(self._conn)
                    self._conn = None
            try:
                if await self._try_lock():
                    LOG.info("liveness lock taken again hostname=%s", self.hostname)
                    delay = self.check_interval
                else:
                    LOG.error("liveness lock of %s is held by another session; retrying", self.hostname)
                    delay = min(delay * 2, 5.0)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - the database is still away: back off and retry
                LOG.info("liveness lock: database unavailable (%s); retrying", type(exc).__name__)
                delay = min(max(delay, 0.2) * 2, 5.0)

    async def stop(self) -> None:
        if self._keeper is not None:
            self._keeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._keeper
        if self._conn is not None:
            await _close(self._conn)  # ends the session: the lock is released with it
            self._conn = None
        self.held = False


async def _close(conn: asyncpg.Connection) -> None:
    try:
        await asyncio.wait_for(conn.close(), 2.0)
    except Exception:  # noqa: BLE001 - a connection to a dead server: drop it without the goodbye
        conn.terminate()
