"""The small interface every object store backend implements, plus the
hashing write pipeline they share.

The service owns metadata (PostgreSQL); a backend only stores bytes under an
opaque key that the service picks (a fresh random key per upload), so a
replaced or half-written object never shows through under a live key.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import hashlib
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol

from aiohttp import web

from services.common.db.records import ObjectRecord

COALESCE_BYTES = 4 * 1024 * 1024
MAX_BATCH_PIECES = 64  # well under IOV_MAX for writev()


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

    async def serve(self, request: web.Request, obj: ObjectRecord, *, expires: int) -> web.StreamResponse:
        """Answer a verified temp-URL GET or HEAD for this object row."""
        ...


class HashingPipeline:
    """Feeds chunks to a blocking ``sink`` and a sha256, each on its own thread.

    Chunks are coalesced to about 4 MiB batches. Each batch goes to two
    single-thread executors (so hash updates and writes keep their order),
    up to ``DEPTH`` batches ahead of the slower one: hashing, disk or network
    writes and gRPC receive overlap, a short write stall (page-cache
    writeback) does not stop the receive, and at most ``DEPTH + 1`` batches
    are ever held in RAM.
    """

    DEPTH = 4

    def __init__(
        self,
        sink: Callable[[list[bytes]], None] | None,
        *,
        hash_bytes: bool = True,
        positional_sink: Callable[[list[bytes], int], None] | None = None,
    ) -> None:
        """``hash_bytes=False``: the sink hashes some other way (see filesystem.ReadBackHasher);
        :meth:`finish` then returns the digest of nothing. ``positional_sink`` (instead of
        ``sink``) receives each batch with its offset in the object, on ``DEPTH`` threads at
        once: batches land out of order, so several disk writes are in flight (O_DIRECT
        writes wait for the device: one 4 MiB write at a time reached about 1 GiB/s on
        this machine's disk, four at a time about 1.2-1.4)."""
        self._sink = sink
        self._positional_sink = positional_sink
        self._submitted = 0
        self._hash_bytes = hash_bytes
        self._hash = hashlib.sha256()
        self._buffer: list[bytes] = []
        self._buffered = 0
        self._inflight: collections.deque[asyncio.Future[Any]] = collections.deque()
        self._hash_thread = ThreadPoolExecutor(1, thread_name_prefix="objectstore-hash")
        writers = self.DEPTH if positional_sink is not None else 1
        self._sink_thread = (
            ThreadPoolExecutor(writers, thread_name_prefix="objectstore-write") if sink or positional_sink else None
        )
        self.size = 0

    def _hash_batch(self, batch: list[bytes]) -> None:
        for piece in batch:
            self._hash.update(piece)

    async def _wait_oldest(self) -> None:
        # Shielded and popped only once done: a cancelled caller leaves the
        # batch visible to drain(), which waits for the threads to finish.
        await asyncio.shield(self._inflight[0])
        self._inflight.popleft()

    async def _submit(self) -> None:
        if not self._buffer:
            return
        while len(self._inflight) >= self.DEPTH:
            await self._wait_oldest()
        # The batch stays a list: no join on the event loop, the sink may writev() it.
        batch = self._buffer if len(self._buffer) <= MAX_BATCH_PIECES else [b"".join(self._buffer)]
        self._buffer, self._buffered = [], 0
        loop = asyncio.get_running_loop()
        jobs = [loop.run_in_executor(self._hash_thread, self._hash_batch, batch)] if self._hash_bytes else []
        if self._sink is not None and self._sink_thread is not None:
            jobs.append(loop.run_in_executor(self._sink_thread, self._sink, batch))
        elif self._positional_sink is not None and self._sink_thread is not None:
            jobs.append(loop.run_in_executor(self._sink_thread, self._positional_sink, batch, self._submitted))
        self._submitted += sum(len(piece) for piece in batch)
        self._inflight.append(asyncio.gather(*jobs))

    async def write(self, chunk: bytes) -> None:
        if not chunk:
            return
        self.size += len(chunk)
        self._buffer.append(chunk)
        self._buffered += len(chunk)
        if self._buffered >= COALESCE_BYTES:
            await self._submit()

    def take_whole(self) -> list[bytes] | None:
        """Every byte written so far, if none has gone to a thread yet (an object
        smaller than one batch): the caller then writes and hashes it in one go
        instead of starting this pipeline's threads. None once a batch was submitted."""
        if self._submitted or self._inflight:
            return None
        pieces, self._buffer, self._buffered = self._buffer, [], 0
        self._shutdown()
        return pieces

    def _shutdown(self) -> None:
        self._hash_thread.shutdown(wait=False)
        if self._sink_thread is not None:
            self._sink_thread.shutdown(wait=False)

    async def finish(self) -> str:
        """Flush everything through the sink; returns the sha256 hex digest."""
        await self._submit()
        while self._inflight:
            await self._wait_oldest()
        self._shutdown()
        return self._hash.hexdigest()

    async def drain(self) -> None:
        """Wait for the batches in flight (after a failure) so nothing writes later."""
        self._buffer = []
        while self._inflight:
            with contextlib.suppress(BaseException):
                await self._inflight.popleft()
        self._shutdown()
