"""The keys that encrypt secrets at rest (docs/security.md, "Secrets at rest").

A keyring is an ordered list of 256-bit AES keys, each with an id. The first
is the *current* key: everything encrypted from now on uses it. All of them
decrypt, so values written under an older key stay readable until
``ferrum db rotate-key`` has re-encrypted them, after which the old key can
be dropped. An empty keyring means encryption at rest is off, Ferrum's
behaviour before keys existed.

Where the keys come from (``[security]``):

- ``secret_key`` (``FERRUM_SECURITY_SECRET_KEY``): one key, base64. Its id is
  derived from the key itself, so nothing else needs choosing.
- ``secret_key_file``: one key per line, ``<id>:<base64>`` or just
  ``<base64>`` (id derived, as above); blank lines and ``#`` comments are
  skipped; the first key is the current one. This is the form that rotates.

Why ids are in the ciphertext: a value names the key that sealed it, so
decryption never guesses, a missing key is reported by name, and rotation
knows what is left to do.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
import re
import stat
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

if TYPE_CHECKING:
    from services.common.config import SecurityConfig

KEY_BYTES = 32
MAX_KEY_FILE_BYTES = 64 * 1024
_KEY_ID = re.compile(r"[A-Za-z0-9_.-]{1,64}")


class KeyringError(Exception):
    """The configured key or key file cannot be used; the message says why and where."""


def derived_key_id(key: bytes) -> str:
    """The id of a key given without one: a short hash of it (says nothing about the key)."""
    return "k" + hashlib.sha256(b"ferrum key id\x00" + key).hexdigest()[:12]


def decode_key(text: str, *, where: str) -> bytes:
    """A base64 (standard or URL-safe, padded or not) 256-bit key."""
    cleaned = text.strip()
    padded = cleaned + "=" * (-len(cleaned) % 4)
    try:
        raw = base64.b64decode(padded.replace("-", "+").replace("_", "/"), validate=True)
    except (binascii.Error, ValueError):
        raise KeyringError(f"{where} is not base64 (make one with: openssl rand -base64 32)") from None
    if len(raw) != KEY_BYTES:
        raise KeyringError(f"{where} is {len(raw)} bytes, not {KEY_BYTES} (make one with: openssl rand -base64 32)")
    return raw


def parse_key_lines(text: str, *, source: str) -> list[tuple[str, bytes]]:
    """(id, key) pairs of a key file's text, in order; errors name the line."""
    keys: list[tuple[str, bytes]] = []
    for number, line in enumerate(text.splitlines(), start=1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        where = f"{source} line {number}"
        key_id, colon, encoded = line.rpartition(":")
        if colon:
            if not _KEY_ID.fullmatch(key_id):
                raise KeyringError(f"{where}: key id {key_id[:70]!r} must be 1-64 of A-Z a-z 0-9 _ . -")
            key = decode_key(encoded, where=where)
        else:
            key = decode_key(line, where=where)
            key_id = derived_key_id(key)
        if any(existing == key_id for existing, _ in keys):
            raise KeyringError(f"{where}: key id {key_id!r} appears twice")
        keys.append((key_id, key))
    if not keys:
        raise KeyringError(f"{source} holds no key")
    return keys


def read_key_file(path: str) -> str:
    """The key file's text, refusing one that other users may read or anyone but its owner may change.

    Symlinks are followed (Kubernetes mounts secrets through them); what is
    checked is the file they lead to. Group read is allowed for the same
    reason (``fsGroup`` mounts are 0440).
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError as exc:
        raise KeyringError(f"cannot open the secret key file {path}: {exc.strerror}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise KeyringError(f"secret key file {path} is not a regular file")
        mode = stat.S_IMODE(info.st_mode)
        if mode & 0o027:
            raise KeyringError(
                f"secret key file {path} has mode {mode:04o}: other users may read it or its group may change it "
                "(chmod 600 or 640)"
            )
        data = os.read(fd, MAX_KEY_FILE_BYTES + 1)
    finally:
        os.close(fd)
    if len(data) > MAX_KEY_FILE_BYTES:
        raise KeyringError(f"secret key file {path} is larger than {MAX_KEY_FILE_BYTES} bytes")
    try:
        return data.decode("ascii")
    except UnicodeDecodeError:
        raise KeyringError(f"secret key file {path} is not ASCII text") from None


class Keyring:
    """Keys by id, the first one current. Immutable once built."""

    __slots__ = ("_ciphers", "_ids", "_keys")

    def __init__(self, keys: Sequence[tuple[str, bytes]] = ()) -> None:
        self._ids: tuple[str, ...] = tuple(key_id for key_id, _ in keys)
        if len(set(self._ids)) != len(self._ids):
            raise KeyringError("a key id appears twice in the keyring")
        for key_id, key in keys:
            if not _KEY_ID.fullmatch(key_id) or len(key) != KEY_BYTES:
                raise KeyringError(f"key {key_id[:70]!r}: ids are 1-64 of A-Z a-z 0-9 _ . -, keys {KEY_BYTES} bytes")
        self._keys: Mapping[str, bytes] = dict(keys)
        self._ciphers: Mapping[str, AESGCM] = {key_id: AESGCM(key) for key_id, key in keys}

    @classmethod
    def from_config(cls, config: SecurityConfig) -> Keyring:
        """The keyring ``[security]`` configures (empty when neither option is set)."""
        return load_keyring(secret_key=config.secret_key, secret_key_file=config.secret_key_file)

    @property
    def enabled(self) -> bool:
        return bool(self._ids)

    @property
    def current_id(self) -> str:
        if not self._ids:
            raise KeyringError("no secret key is configured")
        return self._ids[0]

    @property
    def ids(self) -> tuple[str, ...]:
        return self._ids

    def cipher(self, key_id: str) -> AESGCM | None:
        """AES-GCM with that key, or None when the keyring does not hold it."""
        return self._ciphers.get(key_id)

    def derived_cipher(self, key_id: str, *, salt: bytes, info: bytes) -> AESGCM | None:
        """AES-GCM with a key derived (HKDF-SHA256) from that key for one purpose,
        or None when the keyring does not hold it. Each stored object gets its
        own, so its records can number their nonces from zero."""
        key = self._keys.get(key_id)
        if key is None:
            return None
        return AESGCM(HKDF(algorithm=hashes.SHA256(), length=KEY_BYTES, salt=salt, info=info).derive(key))


def load_keyring(*, secret_key: str, secret_key_file: str) -> Keyring:
    """Build the keyring from the two options (at most one may be set)."""
    if secret_key and secret_key_file:
        raise KeyringError(
            "set FERRUM_SECURITY_SECRET_KEY or FERRUM_SECURITY_SECRET_KEY_FILE, not both "
            "(to rotate, put both keys in the file, the new one first)"
        )
    if secret_key:
        key = decode_key(secret_key, where="FERRUM_SECURITY_SECRET_KEY")
        return Keyring([(derived_key_id(key), key)])
    if secret_key_file:
        return Keyring(parse_key_lines(read_key_file(secret_key_file), source=f"secret key file {secret_key_file}"))
    return Keyring()
