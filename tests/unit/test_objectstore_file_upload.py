"""The filesystem backend's upload on a real disk: the sha256 read back from the
file matches the bytes sent, in any chunking; nothing is left after an abort;
a file cut short under the hasher is an error, never a wrong digest."""

from __future__ import annotations

import asyncio
import hashlib
import os
import threading
from pathlib import Path

import pytest

from services.objectstore.backends.filesystem import FileUpload, ReadBackHasher


def hasher_threads() -> int:
    return sum(1 for t in threading.enumerate() if t.name == "objectstore-hash")


@pytest.mark.parametrize("sizes", [[], [1], [7, 4 * 1024 * 1024 + 3, 1], [1024 * 1024] * 12])
async def test_digest_matches_the_bytes_in_any_chunking(tmp_path: Path, sizes: list[int]) -> None:
    chunks = [os.urandom(n) for n in sizes]
    upload = FileUpload(tmp_path / "x.part", tmp_path / "data" / "x")
    for chunk in chunks:
        await upload.write(chunk)
    size, digest = await upload.commit()
    expected = hashlib.sha256(b"".join(chunks)).hexdigest()
    assert size == sum(sizes) and digest == expected
    assert (tmp_path / "data" / "x").read_bytes() == b"".join(chunks)
    assert not (tmp_path / "x.part").exists() and hasher_threads() == 0


async def test_abort_removes_the_file_and_stops_the_hasher(tmp_path: Path) -> None:
    upload = FileUpload(tmp_path / "y.part", tmp_path / "data" / "y")
    for _ in range(6):
        await upload.write(os.urandom(1024 * 1024))
    await upload.abort()
    await upload.abort()  # twice is fine
    assert not (tmp_path / "y.part").exists() and not (tmp_path / "data").exists()
    assert hasher_threads() == 0


async def test_a_file_shorter_than_written_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "z.part"
    path.write_bytes(b"abc")
    hasher = ReadBackHasher(path)
    hasher.advance(10)  # claims more than the file holds
    with pytest.raises(OSError, match="shorter"):
        await asyncio.wait_for(hasher.digest(), 10)
