"""Hiding secrets in the values an API answers with, as Ironic does.

Ironic passes ``driver_info``, ``instance_info`` and ``driver_internal_info``
(and volume target properties, deploy template step arguments) through
oslo.utils' ``strutils.mask_dict_password``. That walks dicts and lists at any
depth; a key that contains one of oslo's ``_SANITIZE_KEYS`` (in any case)
has its value replaced, and every other string value has ``key=value``
secrets inside it replaced. Ferrum does the same, with two additions:

- which keys are secret is :func:`services.common.secret_keys.is_secret_key`,
  the rule that also encrypts them at rest: oslo's keys plus Ferrum's older,
  broader hints ``key`` and ``credential``, so nothing
  that used to be masked is shown now (``snmp_priv_key``, ``ssh_key``, which
  Ironic masks by name, are among them);
- credentials inside URLs are masked wherever a URL appears in a value
  (``http://user:******@proxy:3128``), which oslo does not do: proxy and
  image URLs carry them.

A secret key whose value is a dict is walked, not replaced, as oslo does
(its secrets are masked at their leaves); any other value of a secret key,
a list included, is replaced whole. Empty values (``None``, ``""``) stay as
they are, so a client can still tell "unset" from "set".
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from services.common.secret_keys import SECRET_KEY_PATTERNS, is_secret_key

MASK = "******"

# scheme://userinfo@ : the userinfo is everything up to an @ before the host part ends.
_URL_USERINFO = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.\-]*://)(?P<userinfo>[^/?#@\s]*)@")
# oslo's first format pattern, ``password = value`` / ``token=value`` inside text
# (a query string's ``&`` and ``;`` end the value, so the rest of a URL survives).
_KEY_VALUE = re.compile(
    r"(?P<key>(?:"
    + "|".join(re.escape(k) for k in sorted(SECRET_KEY_PATTERNS, key=len, reverse=True))
    + r")[0-9]*\s*=\s*)[^\s'\"&;,]+",
    re.IGNORECASE,
)


def _userinfo(match: re.Match[str]) -> str:
    user, colon, _ = match["userinfo"].partition(":")
    # ``user:password@`` keeps the user; a lone ``token@`` is all secret.
    return f"{match['scheme']}{user}:{MASK}@" if colon else f"{match['scheme']}{MASK}@"


def mask_text(text: str) -> str:
    """``text`` with URL credentials and ``secret=value`` pairs masked."""
    if "@" in text:
        text = _URL_USERINFO.sub(_userinfo, text)
    if "=" in text:
        text = _KEY_VALUE.sub(rf"\g<key>{MASK}", text)
    return text


def mask_value(value: Any) -> Any:
    """A copy of a JSON value with every secret masked, at any depth."""
    if isinstance(value, Mapping):
        return mask_dict(value)
    if isinstance(value, list | tuple):
        return [mask_value(item) for item in value]
    if isinstance(value, str):
        return mask_text(value)
    return value


def mask_dict(info: Mapping[str, Any]) -> dict[str, Any]:
    """``strutils.mask_dict_password(info, "******")`` plus URL credentials."""
    out: dict[str, Any] = {}
    for key, value in info.items():
        if isinstance(value, Mapping):
            out[key] = mask_dict(value)
        elif isinstance(key, str) and is_secret_key(key) and value not in (None, ""):
            out[key] = MASK
        else:
            out[key] = mask_value(value)
    return out
