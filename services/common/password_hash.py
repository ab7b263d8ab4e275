"""crypt(3) password hashes, the form a Linux login checks (``/etc/shadow``).

A rescue password travels from the operator to the conductor, which keeps
only its hash (Ironic's ``hashed_rescue_password``) and hands that to the
agent; the rescue ramdisk writes it where its login reads it. So the hash
must be one the machine's libc verifies: SHA-256 (``$5$``) or SHA-512
(``$6$``) crypt, as Ironic's ``rescue_password_hash_algorithm`` allows.

Python's ``crypt`` module is deprecated (gone in 3.13), so this calls
libcrypt through ctypes, as oslo.utils' ``secretutils`` does. ``crypt()``
keeps its result in a static buffer, hence the lock.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import hmac
import secrets
import string
import threading
from typing import Any

from services.common import errors

METHODS = {"sha256": "$5$", "sha512": "$6$"}
SALT_CHARACTERS = string.ascii_letters + string.digits + "./"
SALT_LENGTH = 16


def _load_crypt() -> Any:
    name = ctypes.util.find_library("crypt")
    if name is None:
        return None
    function = ctypes.CDLL(name, use_errno=True).crypt
    function.argtypes = (ctypes.c_char_p, ctypes.c_char_p)
    function.restype = ctypes.c_char_p
    return function


_CRYPT = _load_crypt()
_LOCK = threading.Lock()


def _crypt(password: str, setting: str) -> str:
    if _CRYPT is None:
        raise errors.FerrumError("libcrypt is not available on this host: rescue passwords cannot be hashed")
    with _LOCK:
        result = _CRYPT(password.encode(), setting.encode())
    if not result or result.startswith(b"*"):
        raise errors.FerrumError(f"crypt(3) refused the hash setting {setting[:3]!r}")
    return str(result.decode())


def hash_password(password: str, algorithm: str = "sha256") -> str:
    """A salted crypt(3) hash of ``password`` with ``algorithm`` (sha256 or sha512)."""
    if algorithm not in METHODS:
        raise errors.InvalidParameterValue(f"unknown password hash algorithm {algorithm!r}; use sha256 or sha512")
    salt = "".join(secrets.choice(SALT_CHARACTERS) for _ in range(SALT_LENGTH))
    return _crypt(password, f"{METHODS[algorithm]}{salt}")


def is_hashed(value: str) -> bool:
    """Whether ``value`` looks like a SHA-crypt hash (never a clear-text password we would store)."""
    return any(value.startswith(prefix) for prefix in METHODS.values()) and value.count("$") >= 3


def verify_password(password: str, hashed: str) -> bool:
    """Whether ``password`` matches ``hashed``, checked as a login would."""
    if not is_hashed(hashed):
        return False
    return hmac.compare_digest(_crypt(password, hashed), hashed)
