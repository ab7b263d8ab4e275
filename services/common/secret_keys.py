"""Which keys of a JSON object hold secrets: one definition for everything
that hides them.

The api masks these values in what it shows, and the node repository
encrypts them at rest (``services/common/db/node_secrets.py``). Both must
agree: a key that is masked but stored in the clear, or encrypted but shown,
is a leak one way or the other. So the rule lives here, and both ask
:func:`is_secret_key`.

The rule is oslo.utils' (``strutils._SANITIZE_KEYS``, what Ironic masks
with), plus the words Ferrum masked before: a key is secret when its lower-case
name *contains* one of the patterns, so ``redfish_password``,
``agent_secret_token`` and ``ssh_private_key`` all are. ``key`` is broad on
purpose: a false positive costs an encryption, a false negative a leak.
"""

from __future__ import annotations

import re

OSLO_SANITIZE_KEYS = (
    "adminpass",
    "admin_pass",
    "password",
    "admin_password",
    "auth_token",
    "new_pass",
    "auth_password",
    "secret_uuid",
    "secret",
    "sys_pswd",
    "token",
    "configdrive",
    "chappassword",
    "encrypted_key",
    "private_key",
    "fernetkey",
    "sslkey",
    "passphrase",
    "cephclusterfsid",
    "octaviaheartbeatkey",
    "rabbitcookie",
    "cephmanilaclientkey",
    "pacemakerremoteauthkey",
    "designaterndckey",
    "cephadminkey",
    "heatauthencryptionkey",
    "cephclientkey",
    "keystonecredential",
    "barbicansimplecryptokek",
    "cephrgwkey",
    "swifthashsuffix",
    "migrationsshkey",
    "cephmdskey",
    "cephmonkey",
    "chapsecret",
)
"""oslo.utils 10.x ``strutils._SANITIZE_KEYS``, copied: the original is private."""

FERRUM_SECRET_WORDS = ("password", "secret", "token", "key", "credential")
"""What the api masked before this module existed (``services/api/views.py``)."""

SECRET_KEY_PATTERNS: frozenset[str] = frozenset((*OSLO_SANITIZE_KEYS, *FERRUM_SECRET_WORDS))

_PATTERN = re.compile("|".join(re.escape(p) for p in sorted(SECRET_KEY_PATTERNS, key=len, reverse=True)))


def is_secret_key(name: str) -> bool:
    """Whether a value stored under ``name`` is a secret (case-insensitive substring match)."""
    return _PATTERN.search(name.lower()) is not None
