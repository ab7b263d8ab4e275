"""The http_basic verifier on its own: which htpasswd entries it accepts,
passwords bcrypt would truncate, the success cache and the bounded queue.
Loop responsiveness and timing over HTTP are in tests/integration/test_auth.py."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import bcrypt
import pytest

from services.common import errors
from services.common.basic_auth import BasicAuthVerifier, HtpasswdError, load_htpasswd


def hashed(password: bytes, rounds: int = 4) -> str:
    return bcrypt.hashpw(password, bcrypt.gensalt(rounds=rounds)).decode()


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "htpasswd"
    path.write_text(text)
    return str(path)


def test_bcrypt_entries_load_in_every_prefix(tmp_path: Path) -> None:
    two_b = hashed(b"b")
    text = (
        f"# operators\n\nyankee:{two_b.replace('$2b$', '$2y$', 1)}\n"
        f"bravo:{two_b}\nalpha:{two_b.replace('$2b$', '$2a$', 1)}\n"
    )
    users = load_htpasswd(write(tmp_path, text))
    assert sorted(users) == ["alpha", "bravo", "yankee"]
    assert users["yankee"] == two_b.encode()  # $2y$ is read as $2b$, the same algorithm


@pytest.mark.parametrize(
    ("entry", "named"),
    [
        ("{SHA}W6ph5Mm5Pz8GgiULbPgzG37mj9g=", "SHA-1 ({SHA})"),
        ("$apr1$r31.....$HqJZimcKQFAMYayBlzkrA/", "Apache MD5 ($apr1$)"),
        ("$1$saltsalt$2vnaRpHa6Jxjz5n83ok8Z0", "MD5-crypt ($1$)"),
        ("$6$salt$IxDD3jeSOb5eB1CX5LBsqZFVkJdido3OUILO5Ifz5iwMuTS4XMS130MTSuDDl3aCI6WouIL9AjRbLCelDCy.g.", "SHA-512"),
        ("password", "plain text"),
        ("rl0GVZVVu/gDQ", "plain text or DES crypt"),
        ("$2b$12$tooshort", "malformed bcrypt"),
        ("$2x$04$" + "a" * 53, "$2x$"),
        ("$2b$03$" + "a" * 53, "malformed bcrypt"),
    ],
)
def test_entries_that_are_not_bcrypt_are_refused_with_the_line(tmp_path: Path, entry: str, named: str) -> None:
    path = write(tmp_path, f"good:{hashed(b'x')}\nbad:{entry}\n")
    with pytest.raises(HtpasswdError) as caught:
        load_htpasswd(path)
    message = str(caught.value)
    assert f"{path} line 2" in message and "'bad'" in message and named in message
    assert "htpasswd -B" in message
    assert entry not in message or entry == "password"  # hashes are not echoed (plain text is the word itself)


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("", "lists no users"),
        ("# only a comment\n", "lists no users"),
        ("no-colon-here\n", "line 1 is not 'user:hash'"),
        (":$2b$04$" + "a" * 53 + "\n", "line 1 is not 'user:hash'"),
        ("a:$2b$04$" + "a" * 53 + "\na:$2b$04$" + "b" * 53 + "\n", "user 'a' is listed twice"),
    ],
)
def test_unusable_files_are_refused(tmp_path: Path, text: str, said: str) -> None:
    with pytest.raises(HtpasswdError, match=said):
        load_htpasswd(write(tmp_path, text))


def test_a_missing_file_is_refused_clearly(tmp_path: Path) -> None:
    with pytest.raises(HtpasswdError, match="cannot be read"):
        load_htpasswd(str(tmp_path / "absent"))


async def test_right_wrong_unknown_and_too_long() -> None:
    verifier = BasicAuthVerifier({"admin": hashed(b"s3cret").encode()})
    try:
        assert await verifier.verify("admin", "s3cret")
        assert not await verifier.verify("admin", "wrong")
        assert not await verifier.verify("nobody", "s3cret")
        assert not await verifier.verify("", "")
        # bcrypt reads 72 bytes: a password that matches on them is still refused.
        long_one = "p" * 72
        verifier72 = BasicAuthVerifier({"long": hashed(long_one.encode()).encode()})
        try:
            assert await verifier72.verify("long", long_one)
            assert not await verifier72.verify("long", long_one + "extra")
            assert not await verifier72.verify("long", "é" * 37)  # 74 bytes in UTF-8
        finally:
            verifier72.close()
    finally:
        verifier.close()


class CountingVerifier(BasicAuthVerifier):
    """Counts the bcrypt checks it runs, so the cache is judged by the work it
    saves rather than by a timing that a busy machine can upset."""

    checks = 0

    async def _check(self, secret: bytes, hashed: bytes) -> bool:
        self.checks += 1
        return await super()._check(secret, hashed)


async def test_successes_are_cached_briefly_and_keyed_by_the_entry() -> None:
    entry = hashed(b"pw", rounds=8).encode()
    verifier = CountingVerifier({"admin": entry}, cache_ttl=30.0, cache_size=2)
    try:
        assert await verifier.verify("admin", "pw")
        assert verifier.checks == 1
        for _ in range(20):
            assert await verifier.verify("admin", "pw")
        assert verifier.checks == 1  # all twenty answered from the cache
        assert not await verifier.verify("admin", "other")  # a failure is never served from the cache
        assert not await verifier.verify("admin", "other")
        assert verifier.checks == 3  # and never cached itself: each failure costs a check
        # A changed entry for the same user: the old success no longer counts.
        verifier._users["admin"] = hashed(b"new").encode()
        assert not await verifier.verify("admin", "pw")
        assert await verifier.verify("admin", "new")
        # The cache is bounded: it never holds more than cache_size keys.
        verifier._users.update(u1=hashed(b"a").encode(), u2=hashed(b"b").encode())
        assert await verifier.verify("u1", "a") and await verifier.verify("u2", "b")
        assert len(verifier._cache) == 2
        assert all(b"pw" not in key and b"admin" not in key for key in verifier._cache)
    finally:
        verifier.close()


async def test_an_expired_success_is_checked_again() -> None:
    verifier = BasicAuthVerifier({"admin": hashed(b"pw").encode()}, cache_ttl=0.05)
    try:
        assert await verifier.verify("admin", "pw")
        key = next(iter(verifier._cache))
        deadline = time.monotonic() + 5
        while verifier._cache[key] >= time.monotonic():
            assert time.monotonic() < deadline
            await asyncio.sleep(0.01)
        assert await verifier.verify("admin", "pw")  # checked again, then cached again
        assert verifier._cache[key] > time.monotonic()
    finally:
        verifier.close()


async def test_the_queue_is_bounded() -> None:
    """With max_pending checks admitted, the next one is refused at once (503/UNAVAILABLE)
    instead of waiting; once they finish, checks are admitted again."""
    verifier = BasicAuthVerifier({"admin": hashed(b"pw", rounds=10).encode()}, workers=1, max_pending=3)
    try:
        running = [asyncio.create_task(verifier.verify("admin", f"wrong{i}")) for i in range(3)]
        await asyncio.sleep(0)  # let them be admitted
        assert verifier.pending == 3
        refused = verifier.verify("nobody", "x")
        with pytest.raises(errors.AuthenticationBusy) as caught:
            refused.send(None)  # refused on its first step, without waiting for anything
        assert caught.value.http_status == 503 and caught.value.retry_after >= 1
        assert await asyncio.gather(*running) == [False, False, False]
        deadline = time.monotonic() + 5
        while verifier.pending:  # released from the worker thread via the loop
            assert time.monotonic() < deadline
            await asyncio.sleep(0.01)
        assert await verifier.verify("admin", "pw")
    finally:
        verifier.close()


async def test_a_caller_that_gives_up_still_counts_until_its_check_ends() -> None:
    verifier = BasicAuthVerifier({"admin": hashed(b"pw", rounds=10).encode()}, workers=1, max_pending=2)
    try:
        first = asyncio.create_task(verifier.verify("admin", "a"))
        await asyncio.sleep(0)
        deadline = time.monotonic() + 5
        while not verifier._pool._work_queue.empty():  # until the one thread has taken the first check
            assert time.monotonic() < deadline
            await asyncio.sleep(0.001)
        second = asyncio.create_task(verifier.verify("admin", "b"))
        await asyncio.sleep(0)
        first.cancel()
        with pytest.raises(asyncio.CancelledError):
            await first
        assert verifier.pending >= 1  # the first check is still running on its thread
        with pytest.raises(errors.AuthenticationBusy):
            await verifier.verify("admin", "c")
        assert not await second
    finally:
        verifier.close()
