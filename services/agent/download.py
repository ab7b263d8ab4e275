"""HTTP(S) downloads that survive dropped connections.

The bytes are pushed, in order and exactly once, to a sink coroutine; the
caller decides where they go (the disk, a temp file, a hash). After a dropped
connection or a short body the download resumes with ``Range: bytes=N-``;
a server that ignores Range (200 instead of 206) is re-read from the start
and the bytes already delivered are skipped, so the sink still sees each byte
once. Only consecutive failures without progress count against the retry
budget, so a long image over a flaky link still completes.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import aiohttp

from services.common import errors

LOG = logging.getLogger(__name__)
Sink = Callable[[bytes], Awaitable[None]]
SizeCallback = Callable[[int | None], None]
_CONTENT_RANGE = re.compile(r"bytes (\d+)-(\d+)/(\d+|\*)")
READ_SIZE = 1024 * 1024


@dataclass(frozen=True)
class RetryPolicy:
    attempts: int = 6          # consecutive failures without progress before giving up
    backoff: float = 0.5       # first delay; doubles per consecutive failure
    max_backoff: float = 10.0
    connect_timeout: float = 30.0
    read_timeout: float = 60.0  # no byte for this long = a dead connection


DEFAULT_POLICY = RetryPolicy()


class _Retryable(Exception):
    pass


async def fetch(session: aiohttp.ClientSession, url: str, sink: Sink, *, policy: RetryPolicy = DEFAULT_POLICY,
                on_size: SizeCallback | None = None, headers: dict[str, str] | None = None) -> int:
    """Stream ``url`` into ``sink``; returns the number of bytes delivered."""
    delivered = 0
    failures = 0
    total: int | None = None
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=policy.connect_timeout, sock_read=policy.read_timeout)
    while True:
        request_headers = dict(headers or {})
        if delivered:
            request_headers["Range"] = f"bytes={delivered}-"
        progressed = False
        try:
            async with session.get(url, headers=request_headers, timeout=timeout, auto_decompress=False) as resp:
                skip = 0
                if delivered and resp.status == 206:
                    match = _CONTENT_RANGE.match(resp.headers.get("Content-Range", ""))
                    if not match or int(match.group(1)) != delivered:
                        raise _Retryable(f"bad Content-Range {resp.headers.get('Content-Range')!r} for offset {delivered}")
                    if match.group(3) != "*":
                        total = int(match.group(3))
                elif delivered and resp.status == 416 and total is not None and delivered >= total:
                    return delivered
                elif resp.status == 200:
                    skip = delivered
                    if resp.content_length is not None:
                        total = resp.content_length
                elif resp.status in (408, 425, 429) or resp.status >= 500:
                    raise _Retryable(f"HTTP {resp.status}")
                else:
                    raise errors.ImageError(f"Download of {url} failed: HTTP {resp.status} {resp.reason}")
                if on_size is not None:
                    on_size(total)
                async for data in resp.content.iter_chunked(READ_SIZE):
                    if skip:
                        if len(data) <= skip:
                            skip -= len(data)
                            continue
                        data = data[skip:]
                        skip = 0
                    delivered += len(data)
                    progressed = True
                    await sink(data)
                if total is not None and delivered < total:
                    raise _Retryable(f"connection closed after {delivered} of {total} bytes")
                if total is not None and delivered > total:
                    raise errors.ImageError(f"Download of {url} returned more bytes ({delivered}) than announced ({total})")
                return delivered
        except (aiohttp.ClientError, asyncio.TimeoutError, ConnectionError, _Retryable) as exc:
            failures = 1 if progressed else failures + 1
            if failures > policy.attempts:
                raise errors.ImageError(f"Download of {url} failed after {failures} attempts at byte {delivered}: "
                                        f"{exc or type(exc).__name__}") from None
            delay = min(policy.max_backoff, policy.backoff * 2 ** (failures - 1))
            LOG.warning("download interrupted url=%s offset=%d attempt=%d retry_in=%.1fs reason=%s",
                        url, delivered, failures, delay, exc or type(exc).__name__)
            await asyncio.sleep(delay)


async def fetch_bytes(session: aiohttp.ClientSession, url: str, *, limit: int,
                      policy: RetryPolicy = DEFAULT_POLICY) -> bytes:
    """A small document (checksum file, config drive) in memory, at most ``limit`` bytes."""
    parts: list[bytes] = []
    size = 0

    async def collect(data: bytes) -> None:
        nonlocal size
        size += len(data)
        if size > limit:
            raise errors.ImageError(f"{url} is larger than {limit} bytes")
        parts.append(data)

    await fetch(session, url, collect, policy=policy)
    return b"".join(parts)
