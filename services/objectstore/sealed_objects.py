"""Objects encrypted at rest: config drives, and any object whose upload asks for it.

Which objects: every object of the config drive container
(``[conductor] configdrive_container``), and every object uploaded with the
metadata ``encrypt-at-rest: true``, as long as a key is configured
(``services/common/keyring.py``). Without a key they are stored as sent, as
before; ``ferrum db rotate-key`` seals them once a key exists.

The stored bytes::

    header   = b"FRMSEAL1" | len(key id) (1 byte) | key id | salt (32 random bytes)
    record i = AES-256-GCM(k, nonce_i, plaintext[i*64 KiB : (i+1)*64 KiB], aad=header)   (+16-byte tag)
    k        = HKDF-SHA256(the key, salt, "ferrum-object:v1" | container | name)
    nonce_i  = i (11 bytes, big-endian) | 1 if i is the last record else 0

Why records: a Range request (iPXE sanboot, a resumed agent download) is
answered by decrypting only the records that cover it, never the whole
object, and memory stays at one batch whatever the size. Why a key per
object: its records can number their nonces from zero with no chance of a
repeat, and bytes copied under another object's name do not decrypt. The
last-record flag makes a truncated object fail instead of reading short.
An empty object is one empty (tag-only) record.

The row keeps the plaintext's size and sha256 (what clients see and check),
and ``sealed_key_id``; the bytes are 16 bytes per 64 KiB plus the header
larger. Downloads of sealed objects are decrypted here, so they never take
the sendfile path or an S3 presigned redirect.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
from collections.abc import AsyncIterator, Iterable, Mapping
from typing import Any

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from services.common import errors
from services.common.config import Settings
from services.common.keyring import Keyring
from services.common.objectstore_client import ENCRYPT_AT_REST
from services.objectstore.backends import Backend, Upload

SEAL_METADATA_KEY = ENCRYPT_AT_REST
MAGIC = b"FRMSEAL1"
SALT_BYTES = 32
RECORD_BYTES = 64 * 1024
TAG_BYTES = 16
BATCH_BYTES = 1024 * 1024  # plaintext sealed or opened per thread hop
READ_CHUNK = 1024 * 1024


def header_length(key_id: str) -> int:
    return len(MAGIC) + 1 + len(key_id.encode()) + SALT_BYTES


def record_count(size: int) -> int:
    return max(1, -(-size // RECORD_BYTES))


def stored_length(size: int, key_id: str) -> int:
    """How many bytes the backend holds for a sealed object of ``size`` plaintext bytes."""
    return header_length(key_id) + size + TAG_BYTES * record_count(size)


def _nonce(index: int, *, last: bool) -> bytes:
    return index.to_bytes(11, "big") + (b"\x01" if last else b"\x00")


def _info(container: str, name: str) -> bytes:
    return b"ferrum-object:v1\x00" + container.encode() + b"\x00" + name.encode()


class SealingUpload:
    """An ``Upload`` that encrypts into another one; commit reports the plaintext's size and sha256."""

    def __init__(self, inner: Upload, cipher: AESGCM, header: bytes) -> None:
        self._inner = inner
        self._cipher = cipher
        self._header = header
        self._pending = bytearray()
        self._index = 0
        self._size = 0
        self._hash = hashlib.sha256()

    def _seal(self, data: bytes, *, final: bool) -> bytes:
        """Records for ``data``; with ``final`` the last of them is the object's last.
        Runs on a worker thread, one call at a time."""
        self._hash.update(data)
        parts = [self._header] if self._index == 0 else []
        stops = range(0, len(data), RECORD_BYTES) if data else range(1)
        for start in stops:
            piece = data[start : start + RECORD_BYTES]
            last = final and start + RECORD_BYTES >= len(data)
            parts.append(self._cipher.encrypt(_nonce(self._index, last=last), piece, self._header))
            self._index += 1
        return b"".join(parts)

    async def _flush(self, *, final: bool) -> None:
        # Without ``final`` the last record's worth stays pending: only commit knows it is the last.
        count = len(self._pending) if final else (len(self._pending) - 1) // RECORD_BYTES * RECORD_BYTES
        if count <= 0 and not final:
            return
        data = bytes(self._pending[:count])
        del self._pending[:count]
        await self._inner.write(await asyncio.to_thread(self._seal, data, final=final))

    async def write(self, chunk: bytes) -> None:
        self._pending += chunk
        self._size += len(chunk)
        if len(self._pending) > BATCH_BYTES:
            await self._flush(final=False)

    async def commit(self) -> tuple[int, str]:
        await self._flush(final=True)
        await self._inner.commit()
        return self._size, self._hash.hexdigest()

    async def abort(self) -> None:
        self._pending.clear()
        await self._inner.abort()


class ObjectSealing:
    """The keyring and the rule saying which objects are sealed."""

    def __init__(self, keyring: Keyring, *, containers: Iterable[str]) -> None:
        self.keyring = keyring
        self.containers = tuple(sorted(set(containers)))

    @classmethod
    def from_settings(cls, settings: Settings) -> ObjectSealing:
        return cls(Keyring.from_config(settings.security), containers=(settings.conductor.configdrive_container,))

    def wants(self, container: str, metadata: Mapping[str, str]) -> bool:
        """Whether a new object of that container and metadata is to be sealed."""
        if not self.keyring.enabled:
            return False
        return container in self.containers or metadata.get(SEAL_METADATA_KEY, "").lower() == "true"

    def begin(self, upload: Upload, *, container: str, name: str) -> tuple[SealingUpload, str]:
        """Wrap a backend upload; returns it and the id of the key it seals with."""
        key_id = self.keyring.current_id
        salt = os.urandom(SALT_BYTES)
        cipher = self.keyring.derived_cipher(key_id, salt=salt, info=_info(container, name))
        assert cipher is not None
        header = MAGIC + bytes([len(key_id.encode())]) + key_id.encode() + salt
        return SealingUpload(upload, cipher, header), key_id

    def check_readable(self, row: Mapping[str, Any]) -> None:
        """Raise SecretUnreadable now, before any byte is answered, when the row's key is missing."""
        key_id = row["sealed_key_id"]
        if self.keyring.cipher(key_id) is None:
            held = ", ".join(self.keyring.ids) or "none: no secret key is configured"
            raise errors.SecretUnreadable(
                f"object {row['container']}/{row['name']} is encrypted with key {key_id!r}, which is not "
                f"configured (keys held: {held})"
            )

    def _cipher(self, row: Mapping[str, Any], header: bytes) -> AESGCM:
        key_id = row["sealed_key_id"]
        where = f"object {row['container']}/{row['name']}"
        expected = MAGIC + bytes([len(key_id.encode())]) + key_id.encode()
        if len(header) != header_length(key_id) or not header.startswith(expected):
            raise errors.SecretUnreadable(f"{where}: the stored bytes do not start with the header of key {key_id!r}")
        cipher = self.keyring.derived_cipher(
            key_id, salt=header[-SALT_BYTES:], info=_info(row["container"], row["name"])
        )
        if cipher is None:
            self.check_readable(row)
        assert cipher is not None
        return cipher

    async def read(self, backend: Backend, row: Mapping[str, Any], *, offset: int, length: int) -> AsyncIterator[bytes]:
        """Plaintext bytes [offset, offset + length) of a sealed object, decrypting
        only the records that cover them. Raises SecretUnreadable for a missing
        key or bytes that do not authenticate (altered, truncated, moved)."""
        self.check_readable(row)
        size = int(row["size"])
        length = min(length, size - offset)
        if length <= 0:
            return
        key_id, key = row["sealed_key_id"], row["backend_key"]
        head = header_length(key_id)
        first, last = offset // RECORD_BYTES, (offset + length - 1) // RECORD_BYTES
        final = record_count(size) - 1
        start = head + first * (RECORD_BYTES + TAG_BYTES)
        end = head + last * (RECORD_BYTES + TAG_BYTES) + min(RECORD_BYTES, size - last * RECORD_BYTES) + TAG_BYTES
        pending = bytearray()
        if first == 0:
            stream = backend.read(key, offset=0, length=end, chunk_size=READ_CHUNK)
        else:
            async for data in backend.read(key, offset=0, length=head, chunk_size=head):
                pending += data
            stream = backend.read(key, offset=start, length=end - start, chunk_size=READ_CHUNK)
        header: bytes | None = None if first == 0 else bytes(pending)
        cipher = None if header is None else self._cipher(row, header)
        if header is not None:
            pending.clear()
        index = first

        def span_of(i: int) -> int:
            return min(RECORD_BYTES, size - i * RECORD_BYTES) + TAG_BYTES

        def open_records(data: bytes, first_index: int, aead: AESGCM, aad: bytes) -> bytes:
            """Decrypt whole records (on a worker thread) and cut them to the asked range."""
            plain = []
            position, i = 0, first_index
            while position < len(data):
                span = span_of(i)
                try:
                    piece = aead.decrypt(_nonce(i, last=i == final), data[position : position + span], aad)
                except InvalidTag:
                    raise errors.SecretUnreadable(
                        f"object {row['container']}/{row['name']} record {i} does not decrypt with key {key_id!r}: "
                        "the stored bytes were altered, truncated or moved from another object"
                    ) from None
                lo = max(offset - i * RECORD_BYTES, 0)
                hi = min(offset + length - i * RECORD_BYTES, len(piece))
                plain.append(piece[lo:hi])
                position += span
                i += 1
            return b"".join(plain)

        async for data in stream:
            pending += data
            if cipher is None:
                if len(pending) < head:
                    continue
                header = bytes(pending[:head])
                del pending[:head]
                cipher = self._cipher(row, header)
            assert header is not None
            while True:  # whole records only, at most a batch per worker-thread hop
                ready = count = 0
                while index + count <= last and ready < BATCH_BYTES:
                    span = span_of(index + count)
                    if ready + span > len(pending):
                        break
                    ready += span
                    count += 1
                if not count:
                    break
                batch = bytes(pending[:ready])
                del pending[:ready]
                yield await asyncio.to_thread(open_records, batch, index, cipher, header)
                index += count
        if index <= last:
            raise errors.SecretUnreadable(
                f"object {row['container']}/{row['name']}: the stored bytes end before record {index} (truncated)"
            )
