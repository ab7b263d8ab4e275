"""The renderer's only dependency on storage: a one-method Protocol.

``BootDataReader.read(mac=..)`` / ``read(uuid=..)`` returns a
:class:`~services.common.db.bootdata.BootData` or None. The PostgreSQL
repository implements it with one prepared statement; :class:`CachingReader`
wraps any reader with an in-process cache for boot storms.

The cache is on by default (``FERRUM_IPXE_CACHE_TTL=30``; 0 turns it off). An entry
lives at most ``ttl`` seconds, and database triggers make it exact: every
change to a node's boot data (node columns, ports, volume targets and
connectors, from any writer, direct SQL included) sends ``NOTIFY
ferrum_boot_data`` with the node's uuid, and the cache evicts that node's
entries plus every cached "not found" (a new port may be the missing MAC).
A read that raced a notification is not kept. While the LISTEN connection
is lost (a database restart) nothing is kept; once it is back the cache
starts empty. What remains is the notification's delivery delay
(milliseconds): a replica may answer from the previous state for that long
after a commit, as a request that arrived just before the commit would.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import asyncpg

from services.common.db.bootdata import BOOT_DATA_CHANNEL, BootData

LOG = logging.getLogger(__name__)
Key = tuple[str, str]


class BootDataReader(Protocol):
    """Reads what a boot script needs about one node (exactly one selector)."""

    async def read(self, *, mac: str | None = None, uuid: str | None = None) -> BootData | None: ...


class CachingReader:
    """A TTL cache in front of a reader, evicted per node by LISTEN/NOTIFY.

    ``add_eviction_listener(fn)`` lets a cache built on top (the renderer's
    reply cache) follow along: ``fn(node_uuid)`` for one node, ``fn(None)``
    for everything.
    """

    def __init__(
        self,
        inner: BootDataReader,
        connect: Callable[[], Awaitable[asyncpg.Connection]] | None,
        *,
        ttl: float,
        max_entries: int = 100_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._inner = inner
        self._connect = connect
        self._ttl = ttl
        self._max = max_entries
        self._clock = clock
        self._entries: dict[Key, tuple[float, BootData | None]] = {}
        self._by_node: dict[str, set[Key]] = {}
        self._missing: set[Key] = set()
        self._listeners: list[Callable[[str | None], None]] = []
        self._conn: asyncpg.Connection | None = None
        self._configured_ttl = ttl
        self._relisten: asyncio.Task[None] | None = None
        self._stopped = False
        self._generation = 0
        self.invalidations = 0

    @property
    def generation(self) -> int:
        """Bumped by every eviction: a read that spans one may be stale and is not kept."""
        return self._generation

    @property
    def ttl(self) -> float:
        """Seconds an entry lives; 0 once the LISTEN connection is lost (nothing may be kept then)."""
        return self._ttl

    @property
    def max_entries(self) -> int:
        return self._max

    def add_eviction_listener(self, listener: Callable[[str | None], None]) -> None:
        self._listeners.append(listener)

    @property
    def listening(self) -> bool:
        """True while notifications can arrive (and so while entries are kept)."""
        return self._conn is not None and self._relisten is None

    async def start(self) -> None:
        await self._listen()

    async def _listen(self) -> None:
        # A connection of its own, not the pool's: it is held for the service's
        # life, and a pool closing must not wait for it.
        if self._connect is None:
            raise RuntimeError("this CachingReader has no database to listen to")
        conn = await self._connect()
        try:
            await conn.add_listener(BOOT_DATA_CHANNEL, self._notified)
        except BaseException:
            await conn.close()
            raise
        conn.add_termination_listener(self._lost)
        self._conn = conn

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
        self.invalidate()

    def _notified(self, _conn: Any, _pid: int, _channel: str, payload: object) -> None:
        self.evict(str(payload).lower() or None)  # asyncpg hands over the payload text

    def _lost(self, *_: Any) -> None:
        # Deaf to notifications: keep nothing until listening again.
        if self._stopped or self._relisten is not None:
            return
        LOG.warning("ipxe cache listener connection lost, reason=no notifications; caching paused until it is back")
        self._ttl = 0.0
        self.invalidate()
        lost, self._conn = self._conn, None
        self._relisten = asyncio.get_running_loop().create_task(self._listen_again(lost))

    async def _listen_again(self, lost: asyncpg.Connection | None) -> None:
        """Retry LISTEN with backoff (the database may be restarting); then drop
        whatever could have changed unheard and cache again."""
        if lost is not None:
            lost.terminate()
        delay = 0.2
        while True:
            try:
                await self._listen()
                break
            except Exception as exc:  # noqa: BLE001 - database still down: try again
                LOG.debug("ipxe cache listener not back yet error=%s", type(exc).__name__)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)
        self.invalidate()
        self._ttl = self._configured_ttl
        self._relisten = None
        LOG.info("ipxe cache listener back; caching resumed")

    def invalidate(self) -> None:
        """Forget everything."""
        self.evict(None)

    def evict(self, node_uuid: str | None) -> None:
        """Forget one node's entries and every "not found" (None: forget everything)."""
        self._generation += 1
        self.invalidations += 1
        if node_uuid is None:
            self._entries.clear()
            self._by_node.clear()
            self._missing.clear()
        else:
            for key in self._by_node.pop(node_uuid, ()):
                self._entries.pop(key, None)
            for key in self._missing:
                self._entries.pop(key, None)
            self._missing.clear()
        for listener in self._listeners:
            listener(node_uuid)

    async def read(self, *, mac: str | None = None, uuid: str | None = None) -> BootData | None:
        key = ("mac", mac) if mac is not None else ("uuid", uuid or "")
        now = self._clock()
        hit = self._entries.get(key)
        if hit is not None and hit[0] > now:
            return hit[1]
        generation = self._generation
        data = await self._inner.read(mac=mac, uuid=uuid)
        # A notification that arrived during the read may describe a newer
        # state than the one just read: then do not keep it.
        if self._ttl > 0 and generation == self._generation:
            if len(self._entries) >= self._max:  # full: start over (nothing is stale, so no eviction event)
                self._entries.clear()
                self._by_node.clear()
                self._missing.clear()
            self._entries[key] = (now + self._ttl, data)
            if data is None:
                self._missing.add(key)
            else:
                self._by_node.setdefault(str(data.node["uuid"]).lower(), set()).add(key)
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
