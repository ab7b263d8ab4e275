"""Cleaning steps on the agent's disks (IPA's ``erase_devices*``).

``erase_devices_metadata`` zeroes the first and last MiB of every disk, which
removes MBR/GPT (primary and backup) and filesystem signatures so the next
deploy starts from a blank table. ``erase_devices`` zeroes whole disks; on a
file-backed disk it punches a hole instead, so a simulator's sparse disks
stay sparse.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import stat
from typing import Any

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


def erase_metadata(path: str) -> None:
    fd = os.open(path, os.O_RDWR)
    try:
        size = os.lseek(fd, 0, os.SEEK_END)
        zero_range(fd, 0, min(MiB, size))
        if size > MiB:
            tail = max(MiB, size - MiB)
            zero_range(fd, tail, size - tail)
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
