"""A keep-alive HTTP/1.1 client that costs the benchmark's client next to nothing.

bench/api_raw.py measures how fast a server answers. Through aiohttp's client
each request cost the client about 0.35 ms on this machine (one GET node: 1.20 ms
through aiohttp against 0.85 ms with the same request written to the socket by
hand, same server, interleaved), a third of Ferrum's 1-worker GET, and the same
for both servers: a constant that only shrank the ratio between them. Like
``wrk`` or ``ab``, this client writes the request's bytes and reads the answer
with a C parser (httptools, llhttp: Content-Length and chunked bodies), one
connection per concurrent request, kept alive between requests.

An idle connection the server closed (an expired keep-alive) is noticed and
dropped before reuse; a request whose reused connection closes before any
byte of the answer arrived is sent again once on a new connection, as
HTTP/1.1 clients do. Anything else that goes wrong is raised.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from types import TracebackType
from typing import Self
from urllib.parse import urlsplit

import httptools


class _Connection(asyncio.Protocol):
    """One TCP connection; one request at a time."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.answer: asyncio.Future[tuple[int, bytes, bool]] | None = None
        self.body: list[bytes] = []
        self.closed = False
        self.received = False  # any byte of the current answer yet

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.answer is not None and not self.answer.done():
            self.answer.set_exception(ConnectionResetError(f"the server closed the connection ({exc})"))

    def data_received(self, data: bytes) -> None:
        self.received = True
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            if self.answer is not None and not self.answer.done():
                self.answer.set_exception(exc)
            self.close()

    # httptools callbacks
    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        if self.answer is not None and not self.answer.done():
            status = self.parser.get_status_code()
            self.answer.set_result((status, b"".join(self.body), self.parser.should_keep_alive()))

    async def exchange(self, request: bytes) -> tuple[int, bytes, bool]:
        """Send one request; its status, its body and whether the connection stays open."""
        assert self.transport is not None
        self.answer = asyncio.get_running_loop().create_future()
        self.body = []
        self.received = False
        self.transport.write(request)
        return await self.answer

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()


class HttpClient:
    """Requests to one ``http://host:port`` server over a pool of kept-alive connections."""

    def __init__(self, base: str) -> None:
        parts = urlsplit(base)
        if parts.scheme != "http" or not parts.hostname or not parts.port:
            raise ValueError(f"{base}: only http://host:port is supported")
        self.host = parts.hostname
        self.port = parts.port
        self.prefix = parts.path.rstrip("/")
        self._head = f"Host: {self.host}:{self.port}\r\n"
        self._idle: list[_Connection] = []
        self._all: set[_Connection] = set()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        for connection in self._all:
            connection.close()
        self._all.clear()
        self._idle.clear()

    async def request(
        self, method: str, path: str, body: bytes | None = None, headers: Mapping[str, str] | None = None
    ) -> tuple[int, bytes]:
        """The status and the whole body of one request; ``path`` is below the base URL."""
        lines = [f"{method} {self.prefix}{path} HTTP/1.1\r\n", self._head]
        lines += [f"{name}: {value}\r\n" for name, value in (headers or {}).items()]
        if body is not None or method in ("POST", "PUT", "PATCH"):
            lines.append(f"Content-Length: {len(body or b'')}\r\n")
        request = "".join(lines).encode("latin-1") + b"\r\n" + (body or b"")
        connection, reused = await self._acquire()
        try:
            try:
                status, data, keep = await connection.exchange(request)
            except ConnectionResetError:
                if not (reused and not connection.received):
                    raise
                self._forget(connection)  # an idle connection the server had already closed
                connection, _ = await self._acquire(fresh=True)
                status, data, keep = await connection.exchange(request)
        except BaseException:
            self._forget(connection)  # a half-read answer would be the next request's
            raise
        if keep and not connection.closed:
            self._idle.append(connection)
        else:
            self._forget(connection)
        return status, data

    async def _acquire(self, *, fresh: bool = False) -> tuple[_Connection, bool]:
        while self._idle and not fresh:
            connection = self._idle.pop()
            if not connection.closed:
                return connection, True
            self._forget(connection)
        _, protocol = await asyncio.get_running_loop().create_connection(_Connection, self.host, self.port)
        self._all.add(protocol)
        return protocol, False

    def _forget(self, connection: _Connection) -> None:
        connection.close()
        self._all.discard(connection)
