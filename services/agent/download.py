"""HTTP(S) downloads that survive dropped connections.

The bytes are pushed, in order and exactly once, to a sink coroutine; the
caller decides where they go (the disk, a temp file, a hash). After a dropped
connection or a short body the download resumes with ``Range: bytes=N-``;
a server that ignores Range (200 instead of 206) is re-read from the start
and the bytes already delivered are skipped, so the sink still sees each byte
once. Only consecutive failures without progress count against the retry
budget, so a long image over a flaky link still completes.

Plain ``http://`` downloads of an ordinary response (a Content-Length, no
transfer or content encoding) skip aiohttp's body machinery: a raw socket
receives straight into the sink's own buffer (``sock_recv_into``), which
halves the event loop's work per byte. Anything else (https, redirects,
chunked bodies, error statuses) goes through aiohttp.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import re
import socket
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol
from urllib.parse import urlsplit

import aiohttp

from services.common import errors

LOG = logging.getLogger(__name__)
Sink = Callable[[bytes], Awaitable[None]]
TLS = ssl.SSLContext | bool
SizeCallback = Callable[[int | None], None]
# Per-request auto_decompress arrived in aiohttp 3.9; the deploy ramdisk runs Debian's 3.8,
# which only has it per session. Image bytes must arrive exactly as stored either way.
_REQUEST_DECOMPRESS = "auto_decompress" in inspect.signature(aiohttp.ClientSession._request).parameters
_CONTENT_RANGE = re.compile(r"bytes (\d+)-(\d+)/(\d+|\*)")


@dataclass(frozen=True)
class RetryPolicy:
    attempts: int = 6  # consecutive failures without progress before giving up
    backoff: float = 0.5  # first delay; doubles per consecutive failure
    max_backoff: float = 10.0
    connect_timeout: float = 30.0
    read_timeout: float = 60.0  # no byte for this long = a dead connection
    direct: bool = True  # plain http: receive into the sink's buffer over a raw socket


DEFAULT_POLICY = RetryPolicy()


class _Retryable(Exception):
    pass


class DirectSink(Protocol):
    """A sink that can also lend its own buffer, so plain-HTTP bodies are
    received straight into it (``recv_into``) with no copy in Python."""

    async def __call__(self, data: bytes) -> None: ...

    def direct_buffer(self) -> memoryview | None: ...

    async def direct_commit(self, count: int) -> None: ...


class _Unsupported(Exception):
    """The raw-socket path cannot take this response: aiohttp takes the attempt instead."""


@dataclass
class _State:
    url: str
    delivered: int = 0
    total: int | None = None


def _accept_status(
    state: _State, status: int, reason: str, header: Callable[[str], str | None], content_length: int | None
) -> int | None:
    """How many leading body bytes to skip, or None when the download is already complete."""
    if state.delivered and status == 206:
        match = _CONTENT_RANGE.match(header("Content-Range") or "")
        if not match or int(match.group(1)) != state.delivered:
            raise _Retryable(f"bad Content-Range {header('Content-Range')!r} for offset {state.delivered}")
        if match.group(3) != "*":
            state.total = int(match.group(3))
        return 0
    if state.delivered and status == 416 and state.total is not None and state.delivered >= state.total:
        return None
    if status == 200:
        if content_length is not None:
            state.total = content_length
        return state.delivered  # a server that ignored Range: skip what we already have
    if status in (408, 425, 429) or status >= 500:
        raise _Retryable(f"HTTP {status}")
    raise errors.ImageError(f"Download of {state.url} failed: HTTP {status} {reason}")


def _check_end(state: _State) -> None:
    if state.total is not None and state.delivered < state.total:
        raise _Retryable(f"connection closed after {state.delivered} of {state.total} bytes")
    if state.total is not None and state.delivered > state.total:
        raise errors.ImageError(
            f"Download of {state.url} returned more bytes ({state.delivered}) than announced ({state.total})"
        )


async def _deliver(state: _State, sink: Sink, data: bytes, skip: int) -> int:
    if skip:
        if len(data) <= skip:
            return skip - len(data)
        data, skip = data[skip:], 0
    state.delivered += len(data)
    await sink(data)
    return 0


async def _attempt_aiohttp(
    session: aiohttp.ClientSession,
    state: _State,
    sink: Sink,
    headers: dict[str, str],
    policy: RetryPolicy,
    on_size: SizeCallback | None,
    tls: TLS,
) -> None:
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=policy.connect_timeout, sock_read=policy.read_timeout)
    async with contextlib.AsyncExitStack() as stack:
        if _REQUEST_DECOMPRESS:
            request = session.get(state.url, headers=headers, timeout=timeout, auto_decompress=False, ssl=tls)
        else:  # a session over the same connections that never decompresses
            raw = aiohttp.ClientSession(connector=session.connector, connector_owner=False, auto_decompress=False)
            await stack.enter_async_context(raw)
            request = raw.get(state.url, headers=headers, timeout=timeout, ssl=tls)
        resp = await stack.enter_async_context(request)
        skip = _accept_status(state, resp.status, resp.reason or "", resp.headers.get, resp.content_length)
        if skip is None:
            return
        if on_size is not None:
            on_size(state.total)
        async for data in resp.content.iter_any():
            skip = await _deliver(state, sink, data, skip)
        _check_end(state)


async def _attempt_socket(
    state: _State, sink: DirectSink, headers: dict[str, str], policy: RetryPolicy, on_size: SizeCallback | None
) -> None:
    """Plain HTTP/1.1 over a raw socket for the common case (Content-Length, no
    encoding): the body lands in the sink's own buffer. Anything unusual
    (redirect, chunked, errors) raises _Unsupported before a body byte is used."""
    parts = urlsplit(state.url)
    loop = asyncio.get_running_loop()
    host, port = parts.hostname or "", parts.port or 80
    infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    sock.setblocking(False)
    try:
        async with asyncio.timeout(policy.connect_timeout):
            await loop.sock_connect(sock, address)
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        lines = [
            f"GET {target} HTTP/1.1",
            f"Host: {parts.netloc}",
            "Accept-Encoding: identity",
            "Connection: close",
            "User-Agent: ferrum-agent",
        ]
        lines += [f"{k}: {v}" for k, v in headers.items()]
        await loop.sock_sendall(sock, ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
        head = bytearray()
        while b"\r\n\r\n" not in head:
            if len(head) > 65536:
                raise _Unsupported("response headers too large")
            async with asyncio.timeout(policy.read_timeout):
                chunk = await loop.sock_recv(sock, 65536)
            if not chunk:
                raise _Retryable("connection closed before the response headers")
            head += chunk
        blob, _, rest = bytes(head).partition(b"\r\n\r\n")
        status_line, *header_lines = blob.decode("latin-1").split("\r\n")
        fields = status_line.split(" ", 2)
        if len(fields) < 2 or not fields[0].startswith("HTTP/1.") or not fields[1].isdigit():
            raise _Unsupported(f"unexpected status line {status_line!r}")
        status = int(fields[1])
        found: dict[str, str] = {}
        for line in header_lines:
            name, _, value = line.partition(":")
            found[name.strip().lower()] = value.strip()
        if (
            status not in (200, 206)
            or "transfer-encoding" in found
            or "content-length" not in found
            or found.get("content-encoding", "identity").lower() != "identity"
        ):
            raise _Unsupported(f"HTTP {status} {found.get('transfer-encoding', '')}")
        length = int(found["content-length"])
        skip = _accept_status(
            state, status, "", lambda name: found.get(name.lower()), length if status == 200 else None
        )
        if skip is None:
            return
        if on_size is not None:
            on_size(state.total)
        remaining = length
        body = rest[:remaining]
        remaining -= len(body)
        if body:
            skip = await _deliver(state, sink, body, skip)
        scratch: bytearray | None = None
        while remaining > 0:
            view = None if skip else sink.direct_buffer()
            if view is None:  # skipping, or the sink wants bytes first (format detection)
                scratch = scratch or bytearray(1024 * 1024)
                target_view = memoryview(scratch)[:remaining]
            else:
                target_view = view[:remaining]
            async with asyncio.timeout(policy.read_timeout):
                count = await loop.sock_recv_into(sock, target_view)
            if count == 0:
                break
            remaining -= count
            if view is None:
                skip = await _deliver(state, sink, bytes(target_view[:count]), skip)
            else:
                state.delivered += count
                await sink.direct_commit(count)
        _check_end(state)
    finally:
        sock.close()


async def fetch(
    session: aiohttp.ClientSession,
    url: str,
    sink: Sink,
    *,
    policy: RetryPolicy = DEFAULT_POLICY,
    on_size: SizeCallback | None = None,
    headers: dict[str, str] | None = None,
    tls: TLS = True,
) -> int:
    """Stream ``url`` into ``sink``; returns the number of bytes delivered. ``tls`` is
    aiohttp's ``ssl`` argument: True (system CAs), False (no verification) or a context."""
    state = _State(url)
    failures = 0
    direct = policy.direct and urlsplit(url).scheme == "http" and hasattr(sink, "direct_buffer")
    while True:
        request_headers = dict(headers or {})
        if state.delivered:
            request_headers["Range"] = f"bytes={state.delivered}-"
        before = state.delivered
        try:
            if direct:
                try:
                    await _attempt_socket(state, sink, request_headers, policy, on_size)  # type: ignore[arg-type]  # direct: sink has direct_buffer
                    return state.delivered
                except _Unsupported as exc:
                    direct = False  # this server's answers need aiohttp: do not probe again on retries
                    LOG.debug("raw socket download not possible url=%s reason=%s; using aiohttp", url, exc)
            await _attempt_aiohttp(session, state, sink, request_headers, policy, on_size, tls)
            return state.delivered
        except aiohttp.ClientConnectorCertificateError as exc:  # retrying will not change the certificate
            raise errors.ImageError(f"Download of {url} failed: TLS certificate not trusted: {exc}") from None
        except (TimeoutError, aiohttp.ClientError, OSError, _Retryable) as exc:
            failures = 1 if state.delivered > before else failures + 1
            if failures > policy.attempts:
                raise errors.ImageError(
                    f"Download of {url} failed after {failures} attempts at byte "
                    f"{state.delivered}: {exc or type(exc).__name__}"
                ) from None
            delay = min(policy.max_backoff, policy.backoff * 2 ** (failures - 1))
            LOG.warning(
                "download interrupted url=%s offset=%d attempt=%d retry_in=%.1fs reason=%s",
                url,
                state.delivered,
                failures,
                delay,
                exc or type(exc).__name__,
            )
            await asyncio.sleep(delay)


async def fetch_bytes(
    session: aiohttp.ClientSession, url: str, *, limit: int, policy: RetryPolicy = DEFAULT_POLICY, tls: TLS = True
) -> bytes:
    """A small document (checksum file, config drive) in memory, at most ``limit`` bytes."""
    parts: list[bytes] = []
    size = 0

    async def collect(data: bytes) -> None:
        nonlocal size
        size += len(data)
        if size > limit:
            raise errors.ImageError(f"{url} is larger than {limit} bytes")
        parts.append(data)

    await fetch(session, url, collect, policy=policy, tls=tls)
    return b"".join(parts)
