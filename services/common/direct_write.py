"""Writing large blocks to a disk or file, bypassing the page cache where it can.

A raw image (the agent) or an uploaded object (the object store) is written
once and not read back soon, so the page cache only costs: a copy of every
byte into it, the kernel's writeback threads, and writers stalling behind
that writeback when the final fsync comes. ``O_DIRECT`` sends the caller's
buffers to the device as they are: the writing thread copies nothing.

``O_DIRECT`` wants the buffer address, the offset and the length aligned to
the device's logical block size; ``ALIGN`` (4096) covers 512-byte and 4Kn
disks. ``aligned_buffer`` hands out such memory (a view into a slightly
larger ``bytearray``: the allocator reuses freed blocks, where a fresh
``mmap`` per buffer cost a page fault per 4 KiB, 1 CPU second per GiB here).
A write whose memory, offset or length is not aligned (an image's last
bytes, a gRPC message) goes through a second, ordinary descriptor. A file system that refuses ``O_DIRECT`` (tmpfs, some
FUSE) refuses it at ``open`` or at the first write with ``EINVAL``; the
writer then falls back to the page cache for good. Figures: ``docs/agent.md``.
"""

from __future__ import annotations

import ctypes
import errno
import os

ALIGN = 4096
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


def aligned_buffer(size: int) -> memoryview:
    """A zero-filled, writable buffer of ``size`` bytes starting on an ``ALIGN`` boundary."""
    raw = bytearray(size + ALIGN)
    skip = -address(memoryview(raw)) % ALIGN
    return memoryview(raw)[skip : skip + size]


def address(view: memoryview) -> int:
    """Where a writable, contiguous buffer's first byte is in memory; -1 when that
    cannot be known (read-only or empty memory: then it is never sent the direct way)."""
    if view.readonly or not view.c_contiguous or not view.nbytes:
        return -1
    return ctypes.addressof(ctypes.c_char.from_buffer(view))


def pwrite_all(fd: int, block: memoryview, offset: int) -> None:
    while block:
        written = os.pwrite(fd, block, offset)
        block = block[written:]
        offset += written


class DiskWriter:
    """Positional writes of whole blocks onto one disk (device or file);
    ``direct`` asks for ``O_DIRECT``, which is used where the file system
    takes it. Not thread-safe for overlapping ranges (the caller never has any)."""

    def __init__(self, path: str, *, direct: bool, create_mode: int | None = None) -> None:
        """Opens ``path`` for writing; with ``create_mode``, creates it (it must not exist)
        readable too, so a caller may read back what was written through ``fd``."""
        if create_mode is None:
            self.fd = os.open(path, os.O_WRONLY | _CLOEXEC)
        else:
            self.fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | _CLOEXEC, create_mode)
        self.direct_fd: int | None = None
        if direct and hasattr(os, "O_DIRECT"):
            try:
                self.direct_fd = os.open(path, os.O_WRONLY | _CLOEXEC | os.O_DIRECT)
            except OSError:
                self.direct_fd = None

    @property
    def direct(self) -> bool:
        return self.direct_fd is not None

    def write(self, block: memoryview, offset: int) -> None:
        """Write ``block`` at ``offset``: the aligned part the direct way when the memory
        and the offset are aligned, everything else through the page cache."""
        if self.direct_fd is not None and offset % ALIGN == 0 and address(block) % ALIGN == 0:
            head = len(block) - len(block) % ALIGN
            if head:
                try:
                    pwrite_all(self.direct_fd, block[:head], offset)
                except OSError as exc:
                    if exc.errno != errno.EINVAL:
                        raise
                    self._drop_direct()  # the file system takes no O_DIRECT: the page cache from here on
                    pwrite_all(self.fd, block, offset)
                    return
                block, offset = block[head:], offset + head
        if block:
            pwrite_all(self.fd, block, offset)

    def sync(self) -> None:
        """Flush everything to stable storage: the page-cache tail, the file's
        metadata and the device's volatile cache (fsync covers both descriptors)."""
        os.fsync(self.fd)

    def _drop_direct(self) -> None:
        if self.direct_fd is not None:
            os.close(self.direct_fd)
            self.direct_fd = None

    def close(self) -> None:
        self._drop_direct()
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
