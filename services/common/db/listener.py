"""One LISTEN channel over a connection of its own, for caches that must hear every change.

A cache kept exact by NOTIFY (the renderer's boot data, the api's current
node documents) is only as good as its listener: a notification sent while
the connection is down is gone. So :class:`ChannelListener` reports the loss
itself: on a lost connection it calls ``changed(None)`` ("anything may have
changed"), reports ``listening`` False and retries LISTEN with backoff (the
database may be restarting); once listening again it calls ``changed(None)``
once more, since whatever changed while it was deaf went unheard.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import select
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg

LOG = logging.getLogger(__name__)


class ChannelListener:
    """``changed(payload)`` for each notification on ``channel`` (None for an empty
    payload, for a lost connection and for one listening again)."""

    def __init__(
        self,
        connect: Callable[[], Awaitable[asyncpg.Connection]],
        channel: str,
        changed: Callable[[str | None], None],
        *,
        name: str,
    ) -> None:
        self._connect = connect
        self._channel = channel
        self._changed = changed
        self._name = name  # who listens, for the log
        self._conn: asyncpg.Connection | None = None
        self._relisten: asyncio.Task[None] | None = None
        self._stopped = False
        self._poll: select.poll | None = None

    @property
    def listening(self) -> bool:
        """True while notifications can arrive (so while a cache may keep what it read)."""
        return self._conn is not None and self._relisten is None

    @property
    def server_pid(self) -> int | None:
        """The listening backend's pid (tests end it to play a database restart)."""
        return self._conn.get_server_pid() if self._conn is not None else None

    def unheard(self) -> bool:
        """Whether bytes from the database wait unread on the connection (a notification
        not yet handed over). One non-blocking poll of its socket, a few microseconds. True
        also when the socket cannot be polled, or while not listening: nothing is certain."""
        poll = self._poll
        if poll is None or not self.listening:
            return True
        try:
            return bool(poll.poll(0))
        except OSError:
            return True

    async def start(self) -> None:
        await self._listen()

    async def _listen(self) -> None:
        # A connection of its own, not a pool's: it is held for the service's
        # life, and a pool closing must not wait for it.
        conn = await self._connect()
        try:
            await conn.add_listener(self._channel, self._notified)
        except BaseException:
            await conn.close()
            raise
        conn.add_termination_listener(self._lost)
        self._conn = conn
        self._poll = _poller(conn)

    async def stop(self) -> None:
        self._stopped = True
        if self._relisten is not None:
            self._relisten.cancel()
            with contextlib.suppress(BaseException):
                await self._relisten
            self._relisten = None
        if self._conn is not None:
            with contextlib.suppress(Exception):
                await self._conn.close(timeout=5)
            self._conn = None
            self._poll = None
        self._changed(None)

    def _notified(self, _conn: Any, _pid: int, _channel: str, payload: object) -> None:
        self._changed(str(payload).lower() or None)  # asyncpg hands over the payload text

    def _lost(self, *_: Any) -> None:
        if self._stopped or self._relisten is not None:
            return
        LOG.warning("%s listener connection lost, reason=no notifications; caching paused until it is back", self._name)
        lost, self._conn = self._conn, None
        self._poll = None
        self._changed(None)
        self._relisten = asyncio.get_running_loop().create_task(self._listen_again(lost))

    async def _listen_again(self, lost: asyncpg.Connection | None) -> None:
        if lost is not None:
            lost.terminate()
        delay = 0.2
        while True:
            try:
                await self._listen()
                break
            except Exception as exc:  # noqa: BLE001 - database still down: try again
                LOG.debug("%s listener not back yet error=%s", self._name, type(exc).__name__)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)
        self._changed(None)
        self._relisten = None
        LOG.info("%s listener back; caching resumed", self._name)


def _poller(conn: asyncpg.Connection) -> select.poll | None:
    """A poll object on the connection's socket; None where asyncpg does not expose it."""
    transport = getattr(conn, "_transport", None)  # asyncpg has no public accessor for its socket
    sock = transport.get_extra_info("socket") if transport is not None else None
    if sock is None:
        return None
    poll = select.poll()
    poll.register(sock.fileno(), select.POLLIN)
    return poll
