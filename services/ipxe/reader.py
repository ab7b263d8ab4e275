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

import time
from collections.abc import Awaitable, Callable
from typing import Protocol

import asyncpg

from services.common.db.bootdata import BOOT_DATA_CHANNEL, BootData
from services.common.db.listener import ChannelListener

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
        self._ttl = ttl
        self._max = max_entries
        self._clock = clock
        self._entries: dict[Key, tuple[float, BootData | None]] = {}
        self._by_node: dict[str, set[Key]] = {}
        self._missing: set[Key] = set()
        self._listeners: list[Callable[[str | None], None]] = []
        self.listener = (
            None if connect is None else ChannelListener(connect, BOOT_DATA_CHANNEL, self.evict, name="ipxe cache")
        )
        self._generation = 0
        self.invalidations = 0

    @property
    def generation(self) -> int:
        """Bumped by every eviction: a read that spans one may be stale and is not kept."""
        return self._generation

    @property
    def ttl(self) -> float:
        """Seconds an entry lives; 0 while the LISTEN connection is lost (nothing may be kept
        then). Without a database to listen to (a reader over fixed data) the TTL alone bounds it."""
        return 0.0 if self.listener is not None and not self.listener.listening else self._ttl

    @property
    def max_entries(self) -> int:
        return self._max

    def add_eviction_listener(self, listener: Callable[[str | None], None]) -> None:
        self._listeners.append(listener)

    @property
    def listening(self) -> bool:
        """True while notifications can arrive (and so while entries are kept)."""
        return self.listener is not None and self.listener.listening

    async def start(self) -> None:
        if self.listener is None:
            raise RuntimeError("this CachingReader has no database to listen to")
        await self.listener.start()

    async def stop(self) -> None:
        if self.listener is not None:
            await self.listener.stop()
        self.invalidate()

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
        if self.ttl > 0 and generation == self._generation:
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
