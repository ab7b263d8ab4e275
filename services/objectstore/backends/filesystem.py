"""Objects as files under one directory.

Layout: ``<root>/data/<key[:2]>/<key>`` for committed objects and
``<root>/tmp/<key>.part`` for uploads in progress. An upload is written to
its temp file, fsynced, renamed into place and the directory fsynced, so a
crash leaves either the whole object or an unreferenced temp file that the
orphan sweep removes later; never half an object under a live key.
Files are 0600 and the backend's directories 0700: objects include config
drives, which carry secrets.
Downloads are answered by ``download_response`` (preconditions, ranges),
with each span sent by sendfile(2).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import hashlib
import logging
import os
import stat
import threading
from collections.abc import AsyncIterator, Callable
from pathlib import Path

from aiohttp import web

from services.common import direct_write, errors
from services.common.db.records import ObjectRecord
from services.objectstore.backends.base import HashingPipeline
from services.objectstore.backends.download_response import ObjectVersion, answer_download

LOG = logging.getLogger(__name__)
# Objects hold config drives (passwords, keys): readable by the service's user alone (issue 16).
FILE_MODE = 0o600
DIR_MODE = 0o700


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _make_private(folder: Path) -> None:
    """Tighten a directory made by an older version (0755): without search
    permission on data/ and tmp/, nobody else reaches the files below, whatever
    their own mode."""
    mode = stat.S_IMODE(folder.stat().st_mode)
    if mode & 0o077:
        os.chmod(folder, mode & ~0o077)
        LOG.info("closed an object directory to other users path=%s mode=%o", folder, mode & ~0o077)


class ReadBackHasher:
    """sha256 of a file being written, read back from the page cache on a thread of its own.

    Why not hash the received bytes as they are written: sha256 is the slowest
    stage, and hashing in step gates the whole receive on it. Reading back lets
    the receive run at write speed and the final fsync (disk-bound) overlap the
    hash catching up; the page cache is the buffer, so the process's memory
    stays flat. The digest is of the bytes in the file, which is what is served.

    The thread runs at nice 19: while bytes arrive, receiving and writing get
    the CPU first, and the hash uses what is left and then the fsync's wait
    (the median 1 GiB upload went from 1.46 s to 1.26 s here; docs/objectstore.md).
    Starved like that, it may first run after the upload has been committed and
    its file renamed, which is why it reads through a descriptor it is handed
    rather than opening the file by name (issue 14: 5 of 200 uploads lost).
    """

    READ_SIZE = 4 * 1024 * 1024
    NICE = 19

    def __init__(self, fd: int, *, label: str) -> None:
        """Takes ownership of ``fd``, a readable descriptor of the file being
        written (closed when the hash ends); ``label`` names the file in errors."""
        self._fd = fd
        self._label = label
        self._hash = hashlib.sha256()
        self._written = 0
        self._closed = False
        self._cancelled = False
        self._error: BaseException | None = None
        self._ready = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="objectstore-hash", daemon=True)
        try:
            self._thread.start()
        except BaseException:
            os.close(fd)
            raise

    def advance(self, count: int) -> None:
        """``count`` more bytes are in the file (called by the writer)."""
        with self._ready:
            self._written += count
            self._ready.notify()

    def _stop(self, *, cancel: bool) -> None:
        with self._ready:
            self._closed = True
            self._cancelled = self._cancelled or cancel
            self._ready.notify()

    def _run(self) -> None:
        offset = 0
        with contextlib.suppress(OSError, AttributeError):  # Linux: the nice value of this thread alone
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), self.NICE)
        buffer = bytearray(self.READ_SIZE)  # one buffer reused: no allocation per read
        view = memoryview(buffer)
        try:
            while True:
                with self._ready:
                    while offset >= self._written and not self._closed:
                        self._ready.wait()
                    if self._cancelled or (offset >= self._written and self._closed):
                        return
                    end = self._written
                while offset < end:
                    count = os.preadv(self._fd, [view[: min(self.READ_SIZE, end - offset)]], offset)
                    if not count:
                        raise OSError(f"{self._label} is shorter than the {end} bytes written")
                    self._hash.update(view[:count])
                    offset += count
        except BaseException as exc:  # noqa: BLE001 - reported by digest()
            self._error = exc
        finally:
            os.close(self._fd)

    async def digest(self) -> str:
        """After the last write: wait for the hash to catch up."""
        self._stop(cancel=False)
        await asyncio.to_thread(self._thread.join)
        if self._error is not None:
            raise self._error
        return self._hash.hexdigest()

    async def cancel(self) -> None:
        self._stop(cancel=True)
        await asyncio.to_thread(self._thread.join)


class EarlyWriteback:
    """Starts disk writeback of each written range right away (sync_file_range(2)).

    Why: left to the kernel, a fresh object's pages stay dirty until the final
    fsync, which then writes the whole object while the client waits (0.68 s
    per GiB here). Started as the bytes arrive, the disk works during the
    receive and the final fsync has only the tail (and the device flush) left.
    A no-op where the call does not exist.
    """

    SYNC_FILE_RANGE_WRITE = 2

    def __init__(self) -> None:
        try:
            call = ctypes.CDLL(None, use_errno=True).sync_file_range
            call.argtypes = (ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint)
            self._call: Callable[[int, int, int, int], int] | None = call
        except (AttributeError, OSError):
            self._call = None
        self._offset = 0

    def written(self, fd: int, count: int) -> None:
        if self._call is not None and count:
            self._call(fd, self._offset, count, self.SYNC_FILE_RANGE_WRITE)  # advisory: errors are fsync's to report
        self._offset += count


class FileUpload:
    """One object being written: to ``tmp`` until commit renames it to ``final``.

    ``final`` is the path of a fresh key that nothing else writes, so abort may
    remove whatever is there: a commit that failed after its rename (a hash
    error, a failed directory fsync) leaves the bytes at ``final``, not ``tmp``.
    """

    def __init__(self, tmp: Path, final: Path, *, direct: bool = False) -> None:
        """``direct``: write with O_DIRECT where the file system takes it, and hash
        the received bytes on the pipeline's thread (nothing to read back from
        the page cache). Otherwise the page cache and a ReadBackHasher."""
        self._tmp = tmp
        self._final = final
        self._direct = direct
        self._writer: direct_write.DiskWriter | None = None
        self._fd: int | None = None
        self._hasher: ReadBackHasher | None = None
        self._writeback = EarlyWriteback()
        self._pipeline = (
            HashingPipeline(None, positional_sink=self._write_at, hash_bytes=True)
            if direct
            else HashingPipeline(self._sink, hash_bytes=False)
        )
        self._create_lock = threading.Lock()
        self._done = False

    def _create(self) -> int:
        writer = self._writer = direct_write.DiskWriter(str(self._tmp), direct=self._direct, create_mode=FILE_MODE)
        fd = self._fd = writer.fd
        if not self._direct:
            # A descriptor of its own for the hasher: the file's name changes at commit, the inode does not.
            self._hasher = ReadBackHasher(os.dup(fd), label=str(self._tmp))
        return fd

    def _write_at(self, batch: list[bytes], offset: int) -> None:
        """Direct mode, on one of several writer threads: whole aligned buffers go
        around the page cache, the rest through it."""
        with self._create_lock:
            if self._writer is None:
                self._create()
        assert self._writer is not None
        for piece in batch:
            self._writer.write(memoryview(piece), offset)
            offset += len(piece)

    def _sink(self, batch: list[bytes]) -> None:
        fd = self._fd if self._fd is not None else self._create()
        written = os.writev(fd, batch)
        total = sum(len(piece) for piece in batch)
        if written < total:  # a short write: finish it piece by piece
            rest = memoryview(b"".join(batch))[written:]
            while rest:
                rest = rest[os.write(fd, rest) :]
        assert self._hasher is not None
        self._hasher.advance(total)
        self._writeback.written(fd, total)

    async def write(self, chunk: bytes) -> None:
        await self._pipeline.write(chunk)

    def _close_fds(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        self._fd = None

    def _commit_sync(self) -> None:
        assert self._fd is not None
        os.fsync(self._fd)
        self._close_fds()
        self._final.parent.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
        os.rename(self._tmp, self._final)
        _fsync_dir(self._final.parent)

    def _write_whole(self, pieces: list[bytes]) -> str:
        """A small object at once, on one worker thread: create, write, hash,
        then the same fsync, rename and directory fsync as any commit."""
        digest = hashlib.sha256()
        writer = self._writer = direct_write.DiskWriter(str(self._tmp), direct=False, create_mode=FILE_MODE)
        self._fd = writer.fd
        offset = 0
        for piece in pieces:
            digest.update(piece)
            direct_write.pwrite_all(writer.fd, memoryview(piece), offset)
            offset += len(piece)
        self._commit_sync()
        return digest.hexdigest()

    async def commit(self) -> tuple[int, str]:
        pieces = self._pipeline.take_whole()
        if pieces is not None:
            # Under one batch (most config drives): one thread hop instead of a
            # writer thread, a read-back hasher thread and four more hops (issue 22:
            # starting those threads blocked the event loop about 1.4 ms each).
            whole_digest = await asyncio.to_thread(self._write_whole, pieces)
            self._done = True
            return self._pipeline.size, whole_digest
        received_digest = await self._pipeline.finish()
        if self._fd is None:  # an empty object: no batch created the file
            await asyncio.to_thread(self._create)
        if self._hasher is None:  # direct: the pipeline hashed the bytes as they were written
            await asyncio.to_thread(self._commit_sync)
            self._done = True
            return self._pipeline.size, received_digest
        # fsync (disk) and the hash catching up (CPU) overlap. Both finish before
        # commit returns or raises, so abort() never races a rename still running.
        synced, digest = await asyncio.gather(
            asyncio.to_thread(self._commit_sync), self._hasher.digest(), return_exceptions=True
        )
        for outcome in (synced, digest):
            if isinstance(outcome, BaseException):
                raise outcome
        assert isinstance(digest, str)
        self._done = True
        return self._pipeline.size, digest

    def _abort_sync(self) -> None:
        self._close_fds()
        for path in (self._tmp, self._final):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)

    async def abort(self) -> None:
        if self._done:
            return
        await self._pipeline.drain()
        if self._hasher is not None:
            await self._hasher.cancel()
        await asyncio.to_thread(self._abort_sync)
        self._done = True


class FilesystemBackend:
    name = "filesystem"

    def __init__(self, root: Path, *, direct_io: bool = False) -> None:
        self.root = root
        self.direct_io = direct_io
        self._data = root / "data"
        self._tmp = root / "tmp"

    async def start(self) -> None:
        def prepare() -> None:
            # The root's own parents (a state directory, say) keep the default mode: they are not ours.
            self.root.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
            for folder in (self._data, self._tmp):
                folder.mkdir(mode=DIR_MODE, exist_ok=True)
                _make_private(folder)

        await asyncio.to_thread(prepare)

    async def close(self) -> None:
        return None

    def path(self, key: str) -> Path:
        if not key or "/" in key or key.startswith("."):
            raise errors.InvalidParameterValue(f"bad backend key {key!r}")
        return self._data / key[:2] / key

    def begin_upload(self, key: str) -> FileUpload:
        return FileUpload(self._tmp / f"{key}.part", self.path(key), direct=self.direct_io)

    async def read(self, key: str, *, offset: int, length: int, chunk_size: int) -> AsyncIterator[bytes]:
        try:
            handle = await asyncio.to_thread(open, self.path(key), "rb")
        except FileNotFoundError:
            raise errors.ObjectNotFound("object bytes are gone (deleted or replaced meanwhile)") from None
        try:
            await asyncio.to_thread(handle.seek, offset)
            remaining = length
            while remaining > 0:
                data = await asyncio.to_thread(handle.read, min(chunk_size, remaining))
                if not data:
                    break
                remaining -= len(data)
                yield data
        finally:
            await asyncio.to_thread(handle.close)

    async def delete(self, key: str) -> None:
        def remove() -> None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path(key))

        await asyncio.to_thread(remove)

    async def stale_keys(self, older_than: float) -> list[str]:
        def scan() -> list[str]:
            for entry in os.scandir(self._tmp):
                with contextlib.suppress(FileNotFoundError):
                    if entry.stat().st_mtime < older_than:
                        os.unlink(entry.path)
                        LOG.info("removed abandoned partial upload path=%s", entry.path)
            found = []
            for folder in os.scandir(self._data):
                if not folder.is_dir():
                    continue
                for entry in os.scandir(folder.path):
                    with contextlib.suppress(FileNotFoundError):
                        if entry.is_file() and entry.stat().st_mtime < older_than:
                            found.append(entry.name)
            return found

        return await asyncio.to_thread(scan)

    async def serve(self, request: web.Request, obj: ObjectRecord, *, expires: int) -> web.StreamResponse:
        try:
            handle = await asyncio.to_thread(open, self.path(obj["backend_key"]), "rb")
        except FileNotFoundError:  # deleted or replaced since the row was read
            return web.Response(status=404, text="not found\n", headers={"Cache-Control": "no-store"})

        async def send_span(response: web.StreamResponse, offset: int, count: int) -> None:
            transport = request.transport
            if transport is None:
                raise ConnectionResetError("the client went away")
            # sendfile(2): the kernel moves the pages (docs/objectstore.md, figures). asyncio waits
            # for what the response wrote before (headers, a multipart head) to leave first.
            await asyncio.get_running_loop().sendfile(transport, handle, offset, count)

        try:
            return await answer_download(request, ObjectVersion.from_row(obj), send_span)
        finally:
            await asyncio.to_thread(handle.close)
