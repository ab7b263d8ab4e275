"""Checking HTTP Basic credentials against a bcrypt htpasswd file without
stalling the event loop.

bcrypt is slow on purpose: one check at cost 12 costs about 260 ms of CPU.
Run on the event loop, 40 wrong-password requests stalled every service of a
``ferrum stack`` (``/boot.ipxe`` answered after 9.65 s instead of 4 ms). So:

- **A bounded pool.** Checks run on ``workers`` threads (bcrypt releases the
  GIL). At most ``max_pending`` checks are admitted at once, running or
  waiting; one more is refused at once with :class:`errors.AuthenticationBusy`
  (503 with ``Retry-After`` on REST, UNAVAILABLE on gRPC), so a flood of bad
  passwords queues nowhere without bound.
- **A short cache of successes.** A client that sends the same good
  credentials with every request (openstacksdk, the ``baremetal`` CLI) pays
  for one bcrypt check per ``cache_ttl`` seconds (30 by default: short
  enough that a removed user or a changed password is refused half a minute
  after a restart reloads the file, long enough to spare a CLI session
  hundreds of checks). The key is an HMAC-SHA256, under a random key made
  per process, of the user, the password and the user's htpasswd entry: a
  changed entry never matches an old key, and the cache holds neither a
  password nor a fast unkeyed hash of one that could be guessed offline. It
  holds at most ``cache_size`` entries, the oldest leaving first. Failures
  are not cached: they always cost a full check.
- **No user enumeration.** An unknown user is checked against a dummy hash
  of the cost most entries use, so the answer takes as long as for a known
  user with a wrong password.
- **No silent truncation.** bcrypt reads only 72 bytes; a longer password is
  refused (``False``) rather than matched on its first 72 bytes.

Entries that are not bcrypt (``{SHA}``, MD5 ``$apr1$``, crypt, plain text)
are refused when the file is loaded, with the file, line and user named, so
an unusable file stops the service at start instead of refusing every
request later.

:meth:`BasicAuthVerifier.verify` is the whole interface, so the REST
middleware and a gRPC interceptor can share one verifier (one pool, one
cache).
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import hashlib
import hmac
import logging
import re
import secrets
import time
from collections.abc import Mapping
from typing import Any

import bcrypt

from services.common import errors
from services.common.config import ApiConfig, ConfigError

LOG = logging.getLogger(__name__)

BCRYPT_MAX_PASSWORD = 72
_BCRYPT = re.compile(rb"\$2[aby]\$(\d\d)\$[./A-Za-z0-9]{53}")
_OTHER_FORMATS = (
    ("{SHA}", "SHA-1 ({SHA})"),
    ("$apr1$", "Apache MD5 ($apr1$)"),
    ("$1$", "MD5-crypt ($1$)"),
    ("$5$", "SHA-256-crypt ($5$)"),
    ("$6$", "SHA-512-crypt ($6$)"),
    ("$2x$", "bcrypt with the $2x$ bug marker"),
)


class HtpasswdError(ConfigError):
    """The htpasswd file cannot be used as it is; the message names the line."""


def _describe(hashed: str) -> str:
    for prefix, name in _OTHER_FORMATS:
        if hashed.startswith(prefix):
            return name
    if hashed.startswith("$2"):
        return "a malformed bcrypt hash"
    return "plain text or DES crypt"


def load_htpasswd(path: str) -> dict[str, bytes]:
    """The users and their bcrypt hashes (``$2y$`` read as ``$2b$``, the same
    algorithm). Blank lines and ``#`` comments are skipped; anything else that
    is not ``user:bcrypt-hash`` raises :class:`HtpasswdError`."""
    users: dict[str, bytes] = {}
    try:
        with open(path, encoding="utf-8") as handle:
            lines = handle.read().splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise HtpasswdError(f"htpasswd file {path} cannot be read: {exc}") from None
    for number, raw in enumerate(lines, start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        user, colon, hashed = line.partition(":")
        where = f"htpasswd file {path} line {number}"
        if not colon or not user:
            raise HtpasswdError(f"{where} is not 'user:hash'")
        if user in users:
            raise HtpasswdError(f"{where}: user {user!r} is listed twice")
        encoded = hashed.encode()
        match = _BCRYPT.fullmatch(encoded)
        if match is None or not 4 <= int(match.group(1)) <= 31:
            raise HtpasswdError(
                f"{where}: the entry of user {user!r} is {_describe(hashed)}, not a bcrypt hash; "
                "http_basic accepts only bcrypt entries ($2y$, $2b$ or $2a$; made with `htpasswd -B`)"
            )
        users[user] = encoded.replace(b"$2y$", b"$2b$", 1)
    if not users:
        raise HtpasswdError(f"htpasswd file {path} lists no users, so no request could ever be authenticated")
    return users


def _dummy_hash(users: Mapping[str, bytes]) -> bytes:
    """A well-formed hash nobody's password matches, at the cost most entries use
    (the highest of those tied), so checking it takes as long as a real check."""
    costs = collections.Counter(int(h[4:6]) for h in users.values())
    top = max(costs.values())
    cost = max(c for c, n in costs.items() if n == top)
    return bcrypt.gensalt(rounds=cost) + b"." * 31


class BasicAuthVerifier:
    """``await verify(user, password)``: True when the htpasswd file lets them in."""

    def __init__(
        self,
        users: Mapping[str, bytes],
        *,
        workers: int = 2,
        max_pending: int = 64,
        cache_ttl: float = 30.0,
        cache_size: int = 1024,
    ) -> None:
        if not users:
            raise ValueError("a verifier needs at least one user")
        self._users = dict(users)
        self._dummy = _dummy_hash(self._users)
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="bcrypt")
        self._max_pending = max_pending
        self._pending = 0
        self._cache_ttl = cache_ttl
        self._cache_size = cache_size
        self._cache: collections.OrderedDict[bytes, float] = collections.OrderedDict()
        self._cache_key = secrets.token_bytes(32)

    @classmethod
    def from_file(cls, path: str, **options: Any) -> BasicAuthVerifier:
        return cls(load_htpasswd(path), **options)

    @property
    def pending(self) -> int:
        """Checks admitted and not finished (running or waiting for a thread)."""
        return self._pending

    async def verify(self, user: str, password: str) -> bool:
        """True for a user of the file with the right password.

        Raises :class:`errors.AuthenticationBusy` when ``max_pending`` checks
        are already admitted; the caller answers 503/UNAVAILABLE."""
        secret = password.encode("utf-8", "surrogatepass")
        if len(secret) > BCRYPT_MAX_PASSWORD:
            return False
        hashed = self._users.get(user)
        key = self._key(user, secret, hashed) if hashed is not None else None
        if key is not None and self._cached(key):
            return True
        if self._pending >= self._max_pending:
            LOG.warning("authentication refused: %d bcrypt checks already pending", self._pending)
            raise errors.AuthenticationBusy(
                "Too many authentications in progress; retry shortly (credentials are checked with bcrypt)"
            )
        ok = await self._check(secret, hashed or self._dummy)
        if not ok or key is None:
            return False
        self._remember(key)
        return True

    async def _check(self, secret: bytes, hashed: bytes) -> bool:
        """One bcrypt check on the pool. It counts as pending until its thread is
        done, not until its caller stops waiting: a client that hangs up cannot
        leave work queued behind the admission count's back."""
        loop = asyncio.get_running_loop()
        self._pending += 1
        try:
            future = self._pool.submit(bcrypt.checkpw, secret, hashed)
        except RuntimeError:  # the pool was closed: the service is stopping
            self._pending -= 1
            raise errors.AuthenticationBusy("The service is stopping; retry shortly") from None

        def release(_: concurrent.futures.Future[bool]) -> None:
            with contextlib.suppress(RuntimeError):  # the loop is already closed
                loop.call_soon_threadsafe(self._release)

        future.add_done_callback(release)
        return await asyncio.wrap_future(future)

    def _release(self) -> None:
        self._pending -= 1

    def close(self) -> None:
        """Stop the threads; checks still queued are cancelled."""
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _key(self, user: str, secret: bytes, hashed: bytes) -> bytes:
        mac = hmac.new(self._cache_key, digestmod=hashlib.sha256)
        for part in (user.encode("utf-8", "surrogatepass"), secret, hashed):
            mac.update(len(part).to_bytes(4, "big") + part)  # length-prefixed: no two splits collide
        return mac.digest()

    def _cached(self, key: bytes) -> bool:
        expires = self._cache.get(key)
        if expires is None:
            return False
        if expires < time.monotonic():
            del self._cache[key]
            return False
        return True

    def _remember(self, key: bytes) -> None:
        if self._cache_ttl <= 0:
            return
        self._cache[key] = time.monotonic() + self._cache_ttl
        self._cache.move_to_end(key)
        while len(self._cache) > self._cache_size:
            self._cache.popitem(last=False)


def http_basic_verifier(config: ApiConfig) -> BasicAuthVerifier | None:
    """The verifier the api's settings ask for: None under ``noauth``. An
    unusable htpasswd file raises :class:`HtpasswdError` here, at start."""
    if config.auth_strategy != "http_basic":
        return None
    return BasicAuthVerifier.from_file(
        config.htpasswd_file,
        workers=config.auth_workers,
        max_pending=config.auth_max_pending,
        cache_ttl=config.auth_cache_ttl,
    )
