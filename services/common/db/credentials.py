"""Database passwords: kept in private files, sent only as SCRAM verifiers,
never shown.

Why a file per password: the embedded PostgreSQL's passwords are generated
by Ferrum, so they have to live somewhere the next start finds them. A 0600
file owned by the user running Ferrum is readable by that user (and root)
only. When Ferrum runs as root, the file sits in a directory owned by the
unprivileged server account, so it is opened without following symlinks,
created with ``O_EXCL`` under a temporary name and renamed into place, and
refused when its owner or mode is wrong: root never writes through, or reads
from, a file planted by that account.

Why verifiers: ``ALTER ROLE ... PASSWORD 'SCRAM-SHA-256$...'`` stores the
verifier as is, so the plaintext never reaches the server, its log or its
statement statistics (what ``psql``'s ``\\password`` does too).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import re
import secrets
import stat
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

MASK = "******"
"""What a password is replaced with wherever it would be shown (as driver_info secrets are)."""

SCRAM_ITERATIONS = 4096
"""PostgreSQL's default ``scram_iterations``."""

_PASSWORD_BYTES = 32


class CredentialError(RuntimeError):
    """A password file exists but cannot be trusted (wrong owner, mode or type)."""


def generate_password() -> str:
    """A new random password: 256 bits, URL-safe so it needs no quoting in a libpq URL."""
    return secrets.token_urlsafe(_PASSWORD_BYTES)


def read_or_create_password(path: Path) -> str:
    """The password kept in ``path``, creating the file with a new one if absent.

    A missing file is how passwords are rotated: delete it, and the next
    start generates and sets a new one.
    """
    try:
        return read_password(path)
    except FileNotFoundError:
        pass
    password = generate_password()
    write_password_file(path, password)
    return password


def read_password(path: Path) -> str:
    """Read a password file, refusing one that others could have read or written."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError as exc:
        if isinstance(exc, FileNotFoundError):
            raise
        raise CredentialError(f"cannot open password file {path}: {exc.strerror} (a symlink is refused)") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise CredentialError(f"password file {path} is not a regular file")
        if info.st_uid != os.geteuid():
            raise CredentialError(
                f"password file {path} belongs to uid {info.st_uid}, not to uid {os.geteuid()} running Ferrum; "
                "delete it to generate a new password at the next start"
            )
        if stat.S_IMODE(info.st_mode) & 0o077:
            raise CredentialError(
                f"password file {path} has mode {stat.S_IMODE(info.st_mode):04o}, so others may have read it; "
                "delete it to generate a new password at the next start"
            )
        password = os.read(fd, 4096).decode("ascii", "replace").strip()
    finally:
        os.close(fd)
    if not password:
        raise CredentialError(f"password file {path} is empty; delete it to generate a new password")
    return password


def write_password_file(path: Path, password: str) -> None:
    """Create ``path`` with mode 0600 atomically, never through an existing name."""
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(8)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(password + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def scram_sha256_verifier(password: str, *, salt: bytes | None = None, iterations: int = SCRAM_ITERATIONS) -> str:
    """The SCRAM-SHA-256 verifier PostgreSQL stores for ``password`` (RFC 5802/7677).

    ``password`` must be ASCII (generated ones are), so SASLprep is the identity.
    """
    if not password.isascii():
        raise ValueError("only ASCII passwords are supported (SASLprep is not implemented)")
    salt = salt if salt is not None else secrets.token_bytes(16)
    salted = hashlib.pbkdf2_hmac("sha256", password.encode(), salt, iterations)
    client_key = hmac.new(salted, b"Client Key", hashlib.sha256).digest()
    stored_key = hashlib.sha256(client_key).digest()
    server_key = hmac.new(salted, b"Server Key", hashlib.sha256).digest()

    def b64(raw: bytes) -> str:
        return base64.b64encode(raw).decode("ascii")

    return f"SCRAM-SHA-256${iterations}:{b64(salt)}${b64(stored_key)}:{b64(server_key)}"


def url_with_password(url: str, password: str) -> str:
    """``url`` (``postgresql://user@host:port/db``) with ``password`` set in its authority."""
    parts = urlsplit(url)
    userinfo, _, hostport = parts.netloc.rpartition("@")
    user = userinfo.partition(":")[0]
    return urlunsplit(parts._replace(netloc=f"{user}:{password}@{hostport}"))


def mask_password(url: str) -> str:
    """``url`` with any password (``user:password@`` or ``?password=``) replaced by :data:`MASK`.

    For everything that prints or logs a database URL. A URL too malformed to
    split is masked from the scheme's ``//`` up to the last ``@``.
    """
    try:
        parts = urlsplit(url)
    except ValueError:
        return _USERINFO_PASSWORD.sub(rf"\g<user>:{MASK}@", url)
    shown = url
    userinfo, at, hostport = parts.netloc.rpartition("@")
    if at and ":" in userinfo:
        shown = shown.replace(parts.netloc, f"{userinfo.partition(':')[0]}:{MASK}@{hostport}", 1)
    if parts.query:
        query = "&".join(
            f"{item.partition('=')[0]}={MASK}" if item.partition("=")[0].lower() == "password" else item
            for item in parts.query.split("&")
        )
        shown = shown.replace(f"?{parts.query}", f"?{query}", 1)
    return shown


_USERINFO_PASSWORD = re.compile(r"(?P<user>//[^:/@]*):[^@]*@")
