"""Sealed object bytes on a real filesystem backend: any range of any size
reads back exactly (property-based), the stored bytes hold no plaintext, and
altered, truncated or moved bytes fail clearly."""

from __future__ import annotations

import asyncio
import hashlib
import os
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.common import errors
from services.common.keyring import Keyring
from services.objectstore.backends.filesystem import FilesystemBackend
from services.objectstore.sealed_objects import RECORD_BYTES, ObjectSealing, stored_length

KEY = os.urandom(32)


def sealing(*keys: tuple[str, bytes]) -> ObjectSealing:
    return ObjectSealing(Keyring(list(keys) or [("k1", KEY)]), containers=("drives",))


async def store(backend: FilesystemBackend, seal: ObjectSealing, data: bytes, *, name: str = "obj") -> dict[str, Any]:
    """Write ``data`` sealed, in uneven chunks as a client would; the row the store would keep."""
    upload, key_id = seal.begin(backend.begin_upload(name.replace("/", "") + "0" * 8), container="drives", name=name)
    for start in range(0, len(data), 70_001):
        await upload.write(data[start : start + 70_001])
    size, digest = await upload.commit()
    assert (size, digest) == (len(data), hashlib.sha256(data).hexdigest())  # the plaintext's, not the file's
    return {
        "container": "drives",
        "name": name,
        "size": size,
        "sha256": digest,
        "backend_key": name.replace("/", "") + "0" * 8,
        "sealed_key_id": key_id,
    }


async def read(backend: FilesystemBackend, seal: ObjectSealing, row: dict[str, Any], offset: int, length: int) -> bytes:
    return b"".join([c async for c in seal.read(backend, row, offset=offset, length=length)])


@settings(max_examples=60, deadline=None)
@given(
    size=st.sampled_from([0, 1, RECORD_BYTES - 1, RECORD_BYTES, RECORD_BYTES + 1, 3 * RECORD_BYTES, 1_200_000]),
    start=st.floats(0, 1),
    span=st.floats(0, 1),
)
def test_any_range_reads_back_exactly(size: int, start: float, span: float) -> None:
    data = os.urandom(size)
    offset = int(start * size)
    length = int(span * (size - offset))

    async def scenario(root: Path) -> None:
        backend = FilesystemBackend(root)
        await backend.start()
        seal = sealing()
        row = await store(backend, seal, data)
        stored = (root / "data" / row["backend_key"][:2] / row["backend_key"]).read_bytes()
        assert len(stored) == stored_length(size, "k1")
        if size >= 64:
            assert data[:64] not in stored
        assert await read(backend, seal, row, offset, length) == data[offset : offset + length]
        assert await read(backend, seal, row, 0, size) == data

    with tempfile.TemporaryDirectory() as tmp:
        asyncio.run(scenario(Path(tmp)))


@pytest.fixture
async def backend(tmp_path: Path) -> FilesystemBackend:
    fs = FilesystemBackend(tmp_path)
    await fs.start()
    return fs


def stored_path(backend: FilesystemBackend, row: dict[str, Any]) -> Path:
    return backend.path(row["backend_key"])


async def test_an_altered_byte_fails_only_the_records_it_is_in(backend: FilesystemBackend) -> None:
    seal = sealing()
    data = os.urandom(3 * RECORD_BYTES)
    row = await store(backend, seal, data)
    path = stored_path(backend, row)
    raw = bytearray(path.read_bytes())
    raw[-5] ^= 1  # inside the last record
    path.write_bytes(bytes(raw))
    assert await read(backend, seal, row, 0, RECORD_BYTES) == data[:RECORD_BYTES]  # a range before it still reads
    with pytest.raises(errors.SecretUnreadable, match=r"record 2 does not decrypt .* altered, truncated or moved"):
        await read(backend, seal, row, 0, len(data))


async def test_truncated_bytes_fail_instead_of_reading_short(backend: FilesystemBackend) -> None:
    seal = sealing()
    data = os.urandom(2 * RECORD_BYTES)
    row = await store(backend, seal, data)
    path = stored_path(backend, row)
    path.write_bytes(path.read_bytes()[: -(RECORD_BYTES + 16)])  # the whole last record gone
    with pytest.raises(errors.SecretUnreadable, match="truncated"):
        await read(backend, seal, row, 0, len(data))
    # A row that claims one record fewer: record 0 is not marked last, so it does not decrypt as the end.
    with pytest.raises(errors.SecretUnreadable, match="record 0 does not decrypt"):
        await read(backend, seal, {**row, "size": RECORD_BYTES}, 0, RECORD_BYTES)


async def test_bytes_moved_under_another_name_do_not_decrypt(backend: FilesystemBackend) -> None:
    seal = sealing()
    row = await store(backend, seal, b"user data with a password")
    with pytest.raises(errors.SecretUnreadable, match="object drives/other record 0 does not decrypt"):
        await read(backend, seal, {**row, "name": "other"}, 0, row["size"])


async def test_a_missing_or_wrong_key_fails_clearly(backend: FilesystemBackend) -> None:
    row = await store(backend, sealing(), b"secret bytes")
    with pytest.raises(errors.SecretUnreadable, match=r"key 'k1', which is not configured .*keys held: k2"):
        await read(backend, sealing(("k2", KEY)), row, 0, row["size"])
    with pytest.raises(errors.SecretUnreadable, match="does not decrypt with key 'k1'"):
        await read(backend, sealing(("k1", os.urandom(32))), row, 0, row["size"])
    with pytest.raises(errors.SecretUnreadable, match="do not start with the header of key 'k3'"):
        await read(backend, sealing(("k3", KEY)), {**row, "sealed_key_id": "k3"}, 0, row["size"])


def test_which_objects_are_sealed() -> None:
    seal = sealing()
    assert seal.wants("drives", {})
    assert seal.wants("images", {"encrypt-at-rest": "TRUE"})
    assert not seal.wants("images", {}) and not seal.wants("images", {"encrypt-at-rest": "no"})
    assert not ObjectSealing(Keyring(), containers=("drives",)).wants("drives", {"encrypt-at-rest": "true"})
