"""Cleaning steps on the agent's disks (IPA's ``erase_devices*``).

``erase_devices_metadata`` does what IPA's ``wipefs --all`` on every
partition and then the disk achieves: it zeroes the first and last MiB of
every partition the table lists (filesystem signatures, a config-2 ISO's
volume descriptors, RAID superblocks at the end), then the first and last
MiB of the disk (MBR/GPT, primary and backup), so the next deploy starts
from a blank disk and no tenant's config drive survives. ``erase_devices`` zeroes whole disks; on a
file-backed disk it punches a hole instead, so a simulator's sparse disks
stay sparse.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import stat
from typing import Any

from services.agent.partitions import read_table

MiB = 1024 * 1024
FALLOC_FL_KEEP_SIZE = 0x01
FALLOC_FL_PUNCH_HOLE = 0x02


def _load_fallocate() -> Any:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        func = libc.fallocate
    except (OSError, AttributeError):
        return None
    func.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
    func.restype = ctypes.c_int
    return func


_FALLOCATE = _load_fallocate()


def _write_zeros(fd: int, offset: int, length: int) -> None:
    zeros = bytes(min(length, 8 * MiB))
    end = offset + length
    while offset < end:
        chunk = memoryview(zeros)[: min(len(zeros), end - offset)]
        offset += os.pwrite(fd, chunk, offset)


def zero_range(fd: int, offset: int, length: int) -> None:
    """Make [offset, offset+length) read as zeros: a hole in a regular file, written zeros otherwise."""
    if length <= 0:
        return
    if (
        stat.S_ISREG(os.fstat(fd).st_mode)
        and _FALLOCATE is not None
        and _FALLOCATE(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, offset, length) == 0
    ):
        return
    _write_zeros(fd, offset, length)


def _zero_ends(fd: int, start: int, length: int) -> None:
    """Zero the first and last MiB of [start, start+length)."""
    zero_range(fd, start, min(MiB, length))
    if length > MiB:
        tail = max(MiB, length - MiB)
        zero_range(fd, start + tail, length - tail)


def erase_metadata(path: str) -> None:
    table = read_table(path)
    fd = os.open(path, os.O_RDWR)
    try:
        size = os.lseek(fd, 0, os.SEEK_END)
        sector = table.sector_size if table is not None else 512
        for part in table.partitions if table is not None else ():
            start = part.start * sector
            if start >= size:
                continue
            _zero_ends(fd, start, min(part.sectors * sector, size - start))
        _zero_ends(fd, 0, size)
        os.fsync(fd)
    finally:
        os.close(fd)


def erase_all(path: str) -> None:
    fd = os.open(path, os.O_RDWR)
    try:
        zero_range(fd, 0, os.lseek(fd, 0, os.SEEK_END))
        os.fsync(fd)
    finally:
        os.close(fd)
