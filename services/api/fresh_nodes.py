"""Which node documents the api knows to be current, so a GET of a node can skip the database.

A GET of a node that has not changed already reuses its rendered document
(services/api/node_documents.py), but it still asked PostgreSQL for the row's
version first. On this 2-vCPU machine that hop was the largest part of the
slowest GETs (issue 22: 1.39 ms of a 2.8 ms p99 above the median), since each
hop is one more process to wake. This module removes the hop for a node the
api has read since its last change.

It is exact the way the renderer's cache is (services/ipxe/reader.py):
database triggers send ``NOTIFY ferrum_node_changes`` with the node's uuid
for every committed change of its row or of which allocation holds it
(migration 0023), whoever writes it; a notification forgets what was known
of that node. A read that spans a notification is not remembered, and while
the LISTEN connection is lost nothing is known (and all is forgotten once it
is back). Every write request this api passes on forgets everything when its
answer comes back (:meth:`FreshNodes.forget`, called by the REST middleware
and the conductor router), so a client never reads its own write's
predecessor. What remains is the notification's delivery delay for changes
a conductor makes on its own (a deploy reaching ``active``): for that long,
well under a millisecond on an idle machine, a GET can answer with the state
before, as a GET that arrived just before the commit would have.
``Cache-Control: no-cache`` always reads the row.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import asyncpg
from aiohttp import web

from services.common.db.listener import ChannelListener

NODE_CHANGES_CHANNEL = "ferrum_node_changes"
SAFE_METHODS = frozenset(("GET", "HEAD", "OPTIONS"))
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclasses.dataclass(frozen=True)
class Known:
    """What a node's document depends on besides the rendering: the row's version,
    what routes it (its conductor is looked up again on each use) and its allocation."""

    version: int
    driver: str
    conductor_group: str
    allocation: str | None

    def route(self, node_uuid: str) -> dict[str, Any]:
        """The mapping the ring's owner lookup reads."""
        return {"uuid": node_uuid, "driver": self.driver, "conductor_group": self.conductor_group}


class FreshNodes:
    """Node UUID -> :class:`Known`, for nodes unchanged since they were read (at most ``size``)."""

    def __init__(self, connect: Callable[[], Awaitable[asyncpg.Connection]], *, size: int) -> None:
        self.size = size
        self.listener = ChannelListener(connect, NODE_CHANGES_CHANNEL, self.forget, name="api node documents")
        self._known: OrderedDict[str, Known] = OrderedDict()
        self._generation = 0

    def __len__(self) -> int:
        return len(self._known)

    @property
    def generation(self) -> int:
        """Bumped by every forgetting: take it before a read, pass it to :meth:`note` after."""
        return self._generation

    async def start(self) -> None:
        await self.listener.start()

    async def stop(self) -> None:
        await self.listener.stop()

    async def known(self, node_uuid: str) -> Known | None:
        """What was read of the node, if no change of it has been sent by the database since.

        None while deaf, and while a notification waits unread on the listener's socket
        (then the row is read: by the time that read ends the notification is handled).
        Otherwise every notification sent so far has been read off the socket, and
        asyncpg hands each over on a later turn of the loop: one turn here lets all of
        those run first."""
        if node_uuid not in self._known or self.listener.unheard():
            return None
        await asyncio.sleep(0)
        if not self.listener.listening:
            return None
        return self._known.get(node_uuid)

    def note(self, node: Mapping[str, Any], version: int, allocation: str | None, since: int) -> None:
        """Remember a row read after :attr:`generation` was ``since``: not if a change was heard meanwhile."""
        if self.size <= 0 or since != self._generation or not self.listener.listening:
            return
        node_uuid = str(node["uuid"])
        self._known[node_uuid] = Known(version, node["driver"], node["conductor_group"], allocation)
        self._known.move_to_end(node_uuid)
        while len(self._known) > self.size:
            self._known.popitem(last=False)

    def forget(self, node_uuid: str | None = None) -> None:
        """A node changed (None: any may have)."""
        self._generation += 1
        if node_uuid is None:
            self._known.clear()
        else:
            self._known.pop(node_uuid, None)


def forgetting_middleware(fresh: FreshNodes) -> Callable[..., Awaitable[web.StreamResponse]]:
    """Every REST request that may write forgets what is known when its answer is ready, before
    it is sent: the client's next GET reads the database, whether or not the change's
    notification has arrived yet."""

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.method in SAFE_METHODS:
            return await handler(request)
        try:
            return await handler(request)
        finally:
            fresh.forget()

    return middleware
