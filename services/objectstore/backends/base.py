"""The small interface every object store backend implements, plus the
hashing write pipeline and HTTP range resolution they share.

The service owns metadata (PostgreSQL); a backend only stores bytes under an
opaque key that the service picks (a fresh random key per upload), so a
replaced or half-written object never shows through under a live key.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any, Protocol

from aiohttp import web

COALESCE_BYTES = 4 * 1024 * 1024


class Upload(Protocol):
    """One object being written. Bytes become visible under the key only at
    ``commit``; ``abort`` removes every trace and is safe to call twice."""

    async def write(self, chunk: bytes) -> None: ...

    async def commit(self) -> tuple[int, str]:
        """Make the bytes durable and visible; returns (size, sha256 hex)."""
        ...

    async def abort(self) -> None: ...


class Backend(Protocol):
    name: str

    async def start(self) -> None: ...

    async def close(self) -> None: ...

    def begin_upload(self, key: str) -> Upload: ...

    def read(self, key: str, *, offset: int, length: int, chunk_size: int) -> AsyncIterator[bytes]:
        """Bytes [offset, offset+length); raises ObjectNotFound when the key is gone."""
        ...

    async def delete(self, key: str) -> None:
        """Remove the bytes; a missing key is not an error."""
        ...

    async def stale_keys(self, older_than: float) -> list[str]:
        """Keys written before ``older_than`` (Unix time), for the orphan sweep;
        also drops abandoned partial uploads older than that."""
        ...

    async def serve(self, request: web.Request, obj: Mapping[str, Any], *, expires: int) -> web.StreamResponse:
        """Answer a verified temp-URL GET or HEAD for this object row."""
        ...


class HashingPipeline:
    """Feeds chunks to a blocking ``sink`` and a sha256, each in a worker thread.

    Chunks are coalesced to about 4 MiB; the hash and the sink of one batch
    run in parallel (both release the GIL) while the event loop receives the
    next batch, so hashing, disk writes and gRPC receive overlap without
    holding more than two batches in RAM.
    """

    def __init__(self, sink: Callable[[bytes], None] | None) -> None:
        self._sink = sink
        self._hash = hashlib.sha256()
        self._buffer: list[bytes] = []
        self._buffered = 0
        self._pending: asyncio.Future[Any] | None = None
        self.size = 0

    async def _submit(self) -> None:
        if self._pending is not None:
            # Shielded and cleared only once done: a cancelled caller leaves the
            # batch visible to drain(), which waits for the thread to finish.
            await asyncio.shield(self._pending)
            self._pending = None
        if not self._buffer:
            return
        data = self._buffer[0] if len(self._buffer) == 1 else b"".join(self._buffer)
        self._buffer, self._buffered = [], 0
        jobs = [asyncio.to_thread(self._hash.update, data)]
        if self._sink is not None:
            jobs.append(asyncio.to_thread(self._sink, data))
        self._pending = asyncio.ensure_future(asyncio.gather(*jobs))

    async def write(self, chunk: bytes) -> None:
        if not chunk:
            return
        self.size += len(chunk)
        self._buffer.append(chunk)
        self._buffered += len(chunk)
        if self._buffered >= COALESCE_BYTES:
            await self._submit()

    async def finish(self) -> str:
        """Flush everything through the sink; returns the sha256 hex digest."""
        await self._submit()
        if self._pending is not None:
            await asyncio.shield(self._pending)
            self._pending = None
        return self._hash.hexdigest()

    async def drain(self) -> None:
        """Wait for the batch in flight (after a failure) so nothing writes later."""
        self._buffer = []
        if self._pending is not None:
            pending, self._pending = self._pending, None
            with contextlib.suppress(BaseException):
                await pending


def resolve_range(request: web.Request, size: int) -> tuple[int, int, int] | None:
    """(status, start, count) for a GET/HEAD with an optional single Range;
    None when the range cannot be satisfied (answer 416)."""
    try:
        rng = request.http_range
    except ValueError:
        return None
    start, stop = rng.start, rng.stop
    if start is None:
        return 200, 0, size
    if start < 0 and stop is None:
        if size == 0:
            return None
        start = max(size + start, 0)
        return 206, start, size - start
    if start >= size:
        return None
    end = min(stop if stop is not None else size, size)
    return 206, start, end - start
