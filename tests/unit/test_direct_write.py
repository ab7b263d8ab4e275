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
        writer.write(memoryview(b"tail"), len(data) + 10)  # read-only memory: never sent the direct way
        writer.sync()
    finally:
        writer.close()
    content = disk.read_bytes()
    assert content[: len(data)] == data
    assert content[len(data) : len(data) + 10] == b"\xee" * 10
    assert content[len(data) + 10 : len(data) + 14] == b"tail"
    assert len(content) == 3 * MiB


def test_unaligned_memory_or_offset_goes_through_the_page_cache(tmp_path: Path) -> None:
    disk = tmp_path / "disk"
    disk.write_bytes(bytes(3 * MiB))
    data = os.urandom(MiB)
    shifted = bytearray(MiB + 1)
    shifted[1:] = data
    aligned = direct_write.aligned_buffer(MiB)
    aligned[:] = data
    assert direct_write.address(aligned) % direct_write.ALIGN == 0
    assert direct_write.address(memoryview(shifted)[1:]) % direct_write.ALIGN != 0
    writer = direct_write.DiskWriter(str(disk), direct=True)
    try:
        writer.write(memoryview(shifted)[1:], 0)  # memory off the boundary
        writer.write(aligned[: MiB - 512], MiB + 512)  # offset off the boundary
        writer.write(aligned, 2 * MiB)
        assert writer.direct  # neither refusal dropped O_DIRECT
        writer.sync()
    finally:
        writer.close()
    content = disk.read_bytes()
    assert content[:MiB] == data and content[MiB : MiB + 512] == bytes(512)
    assert content[MiB + 512 : 2 * MiB] == data[: MiB - 512] and content[2 * MiB :] == data
