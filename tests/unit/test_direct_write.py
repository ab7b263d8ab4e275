"""services/common/direct_write.py: O_DIRECT writes with an unaligned tail, and the fallback."""

from __future__ import annotations

import os
from pathlib import Path

from services.common import direct_write

MiB = 1024 * 1024


def test_direct_blocks_and_unaligned_tail_land_byte_exact(tmp_path: Path) -> None:
    disk = tmp_path / "disk"
    disk.write_bytes(b"\xee" * (3 * MiB))  # old content beyond the image must stay
    data = os.urandom(2 * MiB + 1234)
    writer = direct_write.DiskWriter(str(disk), direct=True)
    try:
        assert writer.direct  # the test directory's file system takes O_DIRECT (ext4 here)
        block = direct_write.aligned_buffer(MiB)
        for offset in range(0, len(data), MiB):
            piece = data[offset : offset + MiB]
            block[: len(piece)] = piece
            writer.write(memoryview(block)[: len(piece)], offset)
        writer.write(memoryview(b"tail"), len(data) + 10, aligned=False)  # never sent the direct way
        writer.sync()
    finally:
        writer.close()
    content = disk.read_bytes()
    assert content[: len(data)] == data
    assert content[len(data) : len(data) + 10] == b"\xee" * 10
    assert content[len(data) + 10 : len(data) + 14] == b"tail"
    assert len(content) == 3 * MiB


def test_misaligned_memory_falls_back_to_the_page_cache(tmp_path: Path) -> None:
    """EINVAL from the direct descriptor (here: a bytes object's memory, not page aligned)
    drops O_DIRECT for good and still writes every byte."""
    disk = tmp_path / "disk"
    disk.write_bytes(bytes(2 * MiB))
    data = b"\x01" + os.urandom(MiB)
    writer = direct_write.DiskWriter(str(disk), direct=True)
    try:
        writer.write(memoryview(data)[1:], 0)  # claims alignment it does not have
        assert not writer.direct
        writer.write(memoryview(data)[1:], MiB)
        writer.sync()
    finally:
        writer.close()
    assert disk.read_bytes() == data[1:] * 2
