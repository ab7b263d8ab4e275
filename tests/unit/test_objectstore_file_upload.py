"""The filesystem backend's upload on a real disk: the sha256 read back from the
file matches the bytes sent, in any chunking; nothing is left after an abort;
a file cut short under the hasher is an error, never a wrong digest."""

from __future__ import annotations

import asyncio
import hashlib
import os
import threading
import uuid
from pathlib import Path

import pytest

from services.objectstore.backends.filesystem import FilesystemBackend, FileUpload, ReadBackHasher
from tests.thread_hold import threads_held_at_start


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
    hasher = ReadBackHasher(os.open(path, os.O_RDONLY), label=str(path))
    hasher.advance(10)  # claims more than the file holds
    with pytest.raises(OSError, match="shorter"):
        await asyncio.wait_for(hasher.digest(), 10)


async def started_backend(tmp_path: Path) -> FilesystemBackend:
    backend = FilesystemBackend(tmp_path / "objects")
    await backend.start()
    return backend


def files_under(path: Path) -> list[Path]:
    return [p for p in path.rglob("*") if p.is_file()]


async def test_commit_does_not_race_a_starved_hasher(tmp_path: Path) -> None:
    """Issue 14: the hasher thread (nice 19) may first run after commit has
    renamed the temp file. Held until then, it must still hash the object."""
    backend = await started_backend(tmp_path)
    key = uuid.uuid4().hex
    part = tmp_path / "objects" / "tmp" / f"{key}.part"
    data = os.urandom(395_264)
    upload = backend.begin_upload(key)
    with threads_held_at_start("objectstore-hash", until=lambda: not part.exists()) as holds:
        await upload.write(data)
        size, digest = await asyncio.wait_for(upload.commit(), 60)
    assert holds.outcomes == [True]  # the hasher did wait for the rename
    assert (size, digest) == (len(data), hashlib.sha256(data).hexdigest())
    assert backend.path(key).read_bytes() == data and not part.exists()


async def test_abort_after_a_failed_commit_removes_the_renamed_bytes(tmp_path: Path) -> None:
    """A commit that fails after its rename (here the file is cut short under
    the hasher) leaves the bytes at their final path; abort removes them there."""
    backend = await started_backend(tmp_path)
    key = uuid.uuid4().hex
    part, final = tmp_path / "objects" / "tmp" / f"{key}.part", backend.path(key)

    def renamed_then_cut_short() -> bool:
        if part.exists() or not final.exists():
            return False
        os.truncate(final, 10)
        return True

    upload = backend.begin_upload(key)
    with threads_held_at_start("objectstore-hash", until=renamed_then_cut_short) as holds:
        await upload.write(os.urandom(395_264))
        with pytest.raises(OSError) as failed:
            await asyncio.wait_for(upload.commit(), 60)
    assert holds.outcomes == [True]
    await upload.abort()
    assert files_under(tmp_path / "objects") == [] and hasher_threads() == 0
    assert "shorter" in str(failed.value)  # the cut, not some other failure
