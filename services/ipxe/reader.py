"""The renderer's only dependency on storage: a one-method Protocol.

``BootDataReader.read(mac=..)`` / ``read(uuid=..)`` returns a
:class:`~services.common.db.bootdata.BootData` or None. The PostgreSQL
repository implements it with one prepared statement; :class:`CachingReader`
wraps any reader with a small in-process cache for boot storms.

The cache is off by default (``FERRUM_IPXE_CACHE_TTL=0``). When on, an entry
lives at most ``ttl`` seconds and the whole cache is dropped on every
``ferrum_node_events`` notification (every provision state change writes one),
so a node that moves to ``deploying`` is rendered from fresh data at once.
Changes that write no node event (a port added or removed, a field set
directly in SQL) show up within ``ttl``. Replicas therefore agree within
``ttl`` at worst and exactly with the cache off.
"""

from __future__ import annotations

import contextlib
import logging
import time
from typing import Any, Protocol

import asyncpg

from services.common.db.bootdata import BootData
from services.common.db.events import NOTIFY_CHANNEL

LOG = logging.getLogger(__name__)


class BootDataReader(Protocol):
    """Reads what a boot script needs about one node (exactly one selector)."""

    async def read(self, *, mac: str | None = None, uuid: str | None = None) -> BootData | None: ...


class CachingReader:
    """A TTL cache in front of a reader, flushed by LISTEN/NOTIFY."""

    def __init__(self, inner: BootDataReader, pool: asyncpg.Pool, *, ttl: float, max_entries: int = 100_000) -> None:
        self._inner = inner
        self._pool = pool
        self._ttl = ttl
        self._max = max_entries
        self._entries: dict[tuple[str, str], tuple[float, BootData | None]] = {}
        self._conn: asyncpg.Connection | None = None
        self._generation = 0
        self.invalidations = 0

    async def start(self) -> None:
        self._conn = await self._pool.acquire()
        await self._conn.add_listener(NOTIFY_CHANNEL, self._notified)
        self._conn.add_termination_listener(self._lost)

    async def stop(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(Exception):
                await self._conn.remove_listener(NOTIFY_CHANNEL, self._notified)
            with contextlib.suppress(Exception):
                await self._pool.release(self._conn)
            self._conn = None
        self._entries.clear()

    def _notified(self, *_: Any) -> None:
        self.invalidate()

    def _lost(self, *_: Any) -> None:
        # Without the LISTEN connection notifications could be missed: stop caching.
        LOG.warning("ipxe cache listener connection lost, reason=no notifications; cache disabled")
        self._ttl = 0.0
        self.invalidate()

    def invalidate(self) -> None:
        """Forget everything (a node changed somewhere)."""
        self._generation += 1
        self.invalidations += 1
        self._entries.clear()

    async def read(self, *, mac: str | None = None, uuid: str | None = None) -> BootData | None:
        key = ("mac", mac) if mac is not None else ("uuid", uuid or "")
        now = time.monotonic()
        hit = self._entries.get(key)
        if hit is not None and hit[0] > now:
            return hit[1]
        generation = self._generation
        data = await self._inner.read(mac=mac, uuid=uuid)
        # A notification that arrived during the read may describe a newer
        # state than the one just read: then do not keep it.
        if self._ttl > 0 and generation == self._generation:
            if len(self._entries) >= self._max:
                self._entries.clear()
            self._entries[key] = (now + self._ttl, data)
        return data



class StaticReader:
    """A reader over fixed boot data: for unit tests, the simulator and demos.

    ``nodes`` are BootData; a node is found by UUID or by any of its ports' MACs.
    """

    def __init__(self, nodes: list[BootData]) -> None:
        self._by_uuid = {str(n.node["uuid"]): n for n in nodes}
        self._by_mac = {str(p["address"]): n for n in nodes for p in n.ports}

    async def read(self, *, mac: str | None = None, uuid: str | None = None) -> BootData | None:
        return self._by_mac.get(mac or "") if mac is not None else self._by_uuid.get(uuid or "")
