"""The filesystem backend's upload on a real disk: the sha256 read back from the
file matches the bytes sent, in any chunking; nothing is left after an abort;
a file cut short under the hasher is an error, never a wrong digest."""

from __future__ import annotations

import asyncio
import hashlib
import os
import stat
import threading
import uuid
from pathlib import Path

import pytest

from services.common import direct_write
from services.objectstore.backends.base import COALESCE_BYTES
from services.objectstore.backends.filesystem import FilesystemBackend, FileUpload, ReadBackHasher
from services.objectstore.testing import wait_until
from tests.thread_hold import threads_held_at_start


def hasher_threads() -> int:
    return sum(1 for t in threading.enumerate() if t.name == "objectstore-hash")


@pytest.mark.parametrize("direct", [False, True], ids=["page-cache", "o-direct"])
@pytest.mark.parametrize("sizes", [[], [1], [7, 4 * 1024 * 1024 + 3, 1], [1024 * 1024] * 12])
async def test_digest_matches_the_bytes_in_any_chunking(tmp_path: Path, sizes: list[int], direct: bool) -> None:
    chunks = [os.urandom(n) for n in sizes]
    upload = FileUpload(tmp_path / "x.part", tmp_path / "data" / "x", direct=direct)
    for chunk in chunks:
        await upload.write(chunk)
    size, digest = await upload.commit()
    expected = hashlib.sha256(b"".join(chunks)).hexdigest()
    assert size == sum(sizes) and digest == expected
    assert (tmp_path / "data" / "x").read_bytes() == b"".join(chunks)
    assert not (tmp_path / "x.part").exists() and hasher_threads() == 0


async def test_direct_upload_of_aligned_buffers_with_an_odd_tail(tmp_path: Path) -> None:
    """The front door's buffers (4 KiB aligned, 4 MiB) go around the page cache, a
    short last one and a misaligned chunk through it; the file and digest are exact."""
    pieces = [os.urandom(4 * 1024 * 1024), os.urandom(4 * 1024 * 1024), os.urandom(12_345)]
    upload = FileUpload(tmp_path / "d.part", tmp_path / "data" / "d", direct=True)
    for piece in pieces:
        buffer = direct_write.aligned_buffer(len(piece))
        buffer[:] = piece
        await upload.write(buffer)  # type: ignore[arg-type]  # the front door hands memoryviews
    await upload.write(b"after the odd tail")
    size, digest = await upload.commit()
    expected = b"".join(pieces) + b"after the odd tail"
    assert size == len(expected) and digest == hashlib.sha256(expected).hexdigest()
    assert (tmp_path / "data" / "d").read_bytes() == expected
    assert stat.S_IMODE((tmp_path / "data" / "d").stat().st_mode) == 0o600


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
    renamed the temp file. Held until then, it must still hash the object.
    (Over one batch: a smaller object is written whole at commit, with no hasher thread.)"""
    backend = await started_backend(tmp_path)
    key = uuid.uuid4().hex
    part = tmp_path / "objects" / "tmp" / f"{key}.part"
    data = os.urandom(COALESCE_BYTES + 395_264)
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
        await upload.write(os.urandom(COALESCE_BYTES + 395_264))  # over one batch: the hasher thread runs
        with pytest.raises(OSError) as failed:
            await asyncio.wait_for(upload.commit(), 60)
    assert holds.outcomes == [True]
    await upload.abort()
    assert files_under(tmp_path / "objects") == [] and hasher_threads() == 0
    assert "shorter" in str(failed.value)  # the cut, not some other failure


async def test_an_object_under_one_batch_is_written_at_commit_without_threads(tmp_path: Path) -> None:
    """Issue 22: a config drive-sized object starts no writer or hasher thread
    (each start blocked the event loop); commit writes, hashes and publishes it
    with the same modes, and nothing is left in tmp/."""
    backend = await started_backend(tmp_path)
    key = uuid.uuid4().hex
    data = os.urandom(395_264)
    upload = backend.begin_upload(key)
    before = {t.name for t in threading.enumerate()}
    for start in range(0, len(data), 100_000):
        await upload.write(data[start : start + 100_000])
    assert files_under(tmp_path / "objects") == []  # nothing written before commit
    size, digest = await upload.commit()
    started = {t.name for t in threading.enumerate()} - before
    assert not [name for name in started if name.startswith("objectstore-")]
    assert (size, digest) == (len(data), hashlib.sha256(data).hexdigest())
    final = backend.path(key)
    assert final.read_bytes() == data and mode(final) == 0o600
    assert files_under(tmp_path / "objects") == [final]
    await upload.abort()  # after a commit: nothing to undo
    assert final.exists()


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


async def test_objects_are_readable_by_the_service_user_alone(tmp_path: Path) -> None:
    """Issue 16: config drives were 0644 in 0755 directories."""
    backend = await started_backend(tmp_path)
    root, key = tmp_path / "objects", uuid.uuid4().hex
    upload = backend.begin_upload(key)
    await upload.write(os.urandom(COALESCE_BYTES + 1))  # a full batch: the temp file is made now
    part = root / "tmp" / f"{key}.part"
    await wait_until(part.exists)
    assert mode(part) == 0o600
    await upload.commit()
    final = backend.path(key)
    assert mode(final) == 0o600
    assert {folder.name: mode(folder) for folder in (root, root / "data", root / "tmp", final.parent)} == {
        "objects": 0o700,
        "data": 0o700,
        "tmp": 0o700,
        key[:2]: 0o700,
    }


async def test_start_closes_directories_an_older_version_left_open(tmp_path: Path) -> None:
    root = tmp_path / "objects"
    old_file = root / "data" / "ab" / ("ab" + "0" * 30)
    old_file.parent.mkdir(parents=True)
    (root / "tmp").mkdir()
    old_file.write_bytes(b"old config drive")
    for path in (root, root / "data", root / "data" / "ab", root / "tmp"):
        os.chmod(path, 0o755)
    await FilesystemBackend(root).start()
    assert mode(root / "data") == 0o700 and mode(root / "tmp") == 0o700
    assert mode(root) == 0o755  # the root may be the operator's; data/ and tmp/ are enough
    assert old_file.read_bytes() == b"old config drive"
