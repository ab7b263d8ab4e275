"""A read-only view of a byte range of a file, so a volume inside a partition opens like a file of its own."""

from __future__ import annotations

import io
import os
from typing import Any, BinaryIO


class Window(io.RawIOBase):
    """``length`` bytes of ``fp`` starting at ``offset``; reads never go past the range.

    pycdlib (and anything else taking a file object) sees a file that starts
    at the partition's first byte and ends at its last, so a volume that
    claims to be bigger than its partition reads short instead of reading
    its neighbour.
    """

    def __init__(self, fp: BinaryIO, offset: int, length: int) -> None:
        super().__init__()
        self._fp, self._offset, self._length, self._pos = fp, offset, max(0, length), 0
        self.mode = "rb"

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, pos: int, whence: int = os.SEEK_SET) -> int:
        base = {os.SEEK_SET: 0, os.SEEK_CUR: self._pos, os.SEEK_END: self._length}[whence]
        self._pos = max(0, base + pos)
        return self._pos

    def read(self, size: int | None = -1) -> bytes:
        remaining = max(0, self._length - self._pos)
        size = remaining if size is None or size < 0 else min(size, remaining)
        self._fp.seek(self._offset + self._pos)
        data = self._fp.read(size)
        self._pos += len(data)
        return data

    def readinto(self, buffer: Any) -> int:
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)
