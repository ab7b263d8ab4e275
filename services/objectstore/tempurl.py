"""Short signed temp URLs.

A temp URL looks like ``<public_url>/t/<id>.<expires>.<sig>/<object name>``:

- ``id`` is the object's row id in base 36 (short, and a URL for a deleted
  object never serves a later object of the same name);
- ``expires`` is the Unix expiry time in base 36;
- ``sig`` is HMAC-SHA256 over ``METHOD\\n/t/<id>/<name>\\n<expires>`` with the
  temp-URL secret, truncated to 128 bits, base64url without padding (22 chars).

The URL ends in the object's name, which BMCs that insist on ``.iso`` or
``.img`` need, and stays under 160 characters for the usual
``boot-<uuid>.iso`` names on a normal host name.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import hmac
from urllib.parse import quote

SIG_BYTES = 16
PREFIX = "/t/"


@dataclasses.dataclass(frozen=True)
class ParsedToken:
    object_id: int
    expires: int
    signature: str


def to_base36(value: int) -> str:
    digits = "0123456789abcdefghijklmnopqrstuvwxyz"
    if value == 0:
        return "0"
    out = []
    while value:
        value, rem = divmod(value, 36)
        out.append(digits[rem])
    return "".join(reversed(out))


def _sign(secret: bytes, message: str) -> str:
    digest = hmac.new(secret, message.encode(), hashlib.sha256).digest()[:SIG_BYTES]
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def signature(secret: bytes, method: str, object_id: int, name: str, expires: int) -> str:
    return _sign(secret, f"{method}\n{PREFIX}{to_base36(object_id)}/{name}\n{expires}")


def build_path(secret: bytes, method: str, object_id: int, name: str, expires: int) -> str:
    """The URL path (percent-encoded) of a temp URL."""
    sig = signature(secret, method, object_id, name, expires)
    return f"{PREFIX}{to_base36(object_id)}.{to_base36(expires)}.{sig}/{quote(name, safe='/')}"


def parse_token(token: str) -> ParsedToken | None:
    """Split ``<id>.<expires>.<sig>``; None when it is not shaped like one."""
    parts = token.split(".")
    if len(parts) != 3 or not parts[0] or not parts[1] or len(parts[2]) != 22:
        return None
    try:
        object_id, expires = int(parts[0], 36), int(parts[1], 36)
    except ValueError:
        return None
    if object_id <= 0 or object_id >= 2**63 or expires >= 2**40:
        return None
    return ParsedToken(object_id, expires, parts[2])


def verify(secret: bytes, methods: tuple[str, ...], token: ParsedToken, name: str) -> bool:
    """True when the signature matches for one of ``methods`` (constant time)."""
    ok = False
    for method in methods:
        ok |= hmac.compare_digest(signature(secret, method, token.object_id, name, token.expires), token.signature)
    return ok


# -- upload URLs ----------------------------------------------------------------------------
#
# A PUT temp URL names an object that may not exist yet, so it carries the
# container and name instead of a row id:
# ``<public_url>/u/<expires>.<sig>/<container>/<object name>``, signed over
# ``PUT\n/u/<container>/<name>\n<expires>``. The distinct prefix keeps a
# download URL from ever being replayed as an upload, and the other way round.

UPLOAD_PREFIX = "/u/"


@dataclasses.dataclass(frozen=True)
class UploadTarget:
    expires: int
    signature: str
    container: str
    name: str


def upload_signature(secret: bytes, container: str, name: str, expires: int) -> str:
    return _sign(secret, f"PUT\n{UPLOAD_PREFIX}{container}/{name}\n{expires}")


def build_upload_path(secret: bytes, container: str, name: str, expires: int) -> str:
    """The URL path (percent-encoded) of a PUT temp URL."""
    sig = upload_signature(secret, container, name, expires)
    return f"{UPLOAD_PREFIX}{to_base36(expires)}.{sig}/{quote(container, safe='')}/{quote(name, safe='/')}"


def parse_upload_path(path: str) -> UploadTarget | None:
    """Split a decoded ``/u/<expires>.<sig>/<container>/<name>`` path; None when it is not shaped like one."""
    if not path.startswith(UPLOAD_PREFIX):
        return None
    parts = path[len(UPLOAD_PREFIX) :].split("/", 2)
    if len(parts) != 3 or not parts[1] or not parts[2]:
        return None
    token, container, name = parts
    expires_text, _, sig = token.partition(".")
    if not expires_text or len(sig) != 22:
        return None
    try:
        expires = int(expires_text, 36)
    except ValueError:
        return None
    if expires >= 2**40:
        return None
    return UploadTarget(expires, sig, container, name)


def verify_upload(secret: bytes, target: UploadTarget) -> bool:
    expected = upload_signature(secret, target.container, target.name, target.expires)
    return hmac.compare_digest(expected, target.signature)
