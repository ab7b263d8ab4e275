"""A connection guard in front of an HTTP protocol that has none (aiohttp's).

aiohttp 3.x bounds a connection only by ``keepalive_timeout``, whose clock
starts when the connection opens or a reply ends and is not moved by
incoming bytes. It has no deadline for a request head, and no connection
cap. This protocol sits between the transport and aiohttp's
``RequestHandler`` and forwards every call to it. It counts the connection
against the :class:`ConnectionGuard` (refused beyond the cap, before aiohttp
sees it). It also feeds a copy of the bytes to an httptools parser whose only
job is to see where each request head starts and ends, so the guard can
enforce the header deadline. That parser is llhttp, as aiohttp's own is, so
both agree on where the heads end. It costs a C parse of the bytes, and it
stops watching after an upgrade or a parse error (aiohttp answers those
itself).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import httptools

from services.common.connection_guard import ConnectionGuard


class GuardedHttpProtocol(asyncio.Protocol):
    """One connection: the guard's bookkeeping, then the inner protocol."""

    def __init__(
        self,
        guard: ConnectionGuard,
        inner_factory: Callable[[], asyncio.Protocol],
        *,
        admitted: bool = False,
    ) -> None:
        self._guard = guard
        self._factory = inner_factory
        self._admitted = admitted  # already counted (handed over by the object store's front door)
        self._inner: asyncio.Protocol | None = None
        self._transport: asyncio.Transport | None = None
        self._watch: httptools.HttpRequestParser | None = httptools.HttpRequestParser(self)

    # asyncio.Protocol, forwarded
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        if not self._admitted and not self._guard.admit(transport):
            return
        self._admitted = True
        self._guard.head_started(self)
        self._inner = self._factory()
        self._inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        if self._inner is None:
            return
        if self._watch is not None:
            try:
                self._watch.feed_data(data)
            except (httptools.HttpParserError, httptools.HttpParserUpgrade):  # aiohttp answers these itself
                self._stop_watching()
        self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self._inner.eof_received() if self._inner is not None else None

    def pause_writing(self) -> None:
        if self._inner is not None:
            self._inner.pause_writing()

    def resume_writing(self) -> None:
        if self._inner is not None:
            self._inner.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        self._guard.head_finished(self)
        if self._inner is not None:
            self._guard.release()
            inner, self._inner = self._inner, None
            inner.connection_lost(exc)
        self._transport = None

    # httptools callbacks: where heads start and end
    def on_message_begin(self) -> None:
        self._guard.head_started(self)

    def on_headers_complete(self) -> None:
        self._guard.head_finished(self)

    # ConnectionGuard
    def head_timed_out(self) -> None:
        transport = self._transport
        if transport is None or transport.is_closing():
            return
        if not transport.is_reading():  # aiohttp paused reading (flow control): not the client's fault
            self._guard.head_started(self)
            return
        self._guard.dropped_for_timeout()
        transport.abort()

    def _stop_watching(self) -> None:
        self._watch = None
        self._guard.head_finished(self)

    def hand_over(self, data: bytes) -> None:
        """Bytes another protocol read before handing the connection over."""
        if data:
            self.data_received(data)
