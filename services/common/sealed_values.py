"""One secret value encrypted into a self-describing string, and back.

Format: ``ferrum-aead:v1:<key id>:<base64url(nonce | ciphertext | tag)>``,
AES-256-GCM with a random 96-bit nonce over the value's JSON (so strings,
numbers, booleans and whole objects all round-trip with their type).

The *context* is the associated data: where the value lives (for a node
field, the node's uuid and the path inside the field). A sealed value copied
to another node or another field does not decrypt there, so someone who can
write the database but not read the key cannot move one node's BMC password
to a node whose BMC they control.

Why a string: it fits in a JSONB value where the plaintext was, so the
schema, the SQL and every reader that never needs the secret stay as they
were.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
from typing import Any

from cryptography.exceptions import InvalidTag

from services.common import errors
from services.common.keyring import Keyring

PREFIX = "ferrum-aead:v1:"
NONCE_BYTES = 12
TAG_BYTES = 16


def looks_sealed(value: Any) -> bool:
    return isinstance(value, str) and value.startswith(PREFIX)


def sealed_key_id(value: str) -> str:
    """The id of the key a sealed value names (no decryption)."""
    return value[len(PREFIX) :].partition(":")[0]


def seal(keyring: Keyring, value: Any, *, context: str) -> str:
    """``value`` encrypted under the keyring's current key, bound to ``context``."""
    key_id = keyring.current_id
    cipher = keyring.cipher(key_id)
    assert cipher is not None
    nonce = os.urandom(NONCE_BYTES)
    plaintext = json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()
    sealed = nonce + cipher.encrypt(nonce, plaintext, context.encode())
    return f"{PREFIX}{key_id}:{base64.urlsafe_b64encode(sealed).rstrip(b'=').decode('ascii')}"


def open_sealed(keyring: Keyring, text: str, *, context: str, where: str) -> Any:
    """The value ``seal`` sealed; ``where`` names it in errors (never the value).

    Raises :class:`errors.SecretUnreadable` rather than returning anything
    wrong: an unknown key id, a key that does not match, a value altered or
    moved from another context, or a malformed string.
    """
    key_id, colon, encoded = text[len(PREFIX) :].partition(":")
    if not colon or not key_id:
        raise errors.SecretUnreadable(f"{where} looks encrypted but is malformed")
    cipher = keyring.cipher(key_id)
    if cipher is None:
        held = ", ".join(keyring.ids) or "none: no secret key is configured"
        raise errors.SecretUnreadable(
            f"{where} is encrypted with key {key_id!r}, which is not configured (keys held: {held}); "
            "configure that key (FERRUM_SECURITY_SECRET_KEY or _FILE) to read it"
        )
    try:
        sealed = base64.b64decode(encoded + "=" * (-len(encoded) % 4), altchars=b"-_", validate=True)
    except (binascii.Error, ValueError):
        raise errors.SecretUnreadable(f"{where} looks encrypted but is malformed") from None
    if len(sealed) < NONCE_BYTES + TAG_BYTES:
        raise errors.SecretUnreadable(f"{where} looks encrypted but is too short")
    try:
        plaintext = cipher.decrypt(sealed[:NONCE_BYTES], sealed[NONCE_BYTES:], context.encode())
    except InvalidTag:
        raise errors.SecretUnreadable(
            f"{where} does not decrypt with key {key_id!r}: that key is not the one it was encrypted with, "
            "or the stored value was altered or copied from another node or field"
        ) from None
    return json.loads(plaintext)
