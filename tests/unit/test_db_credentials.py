"""Password files, SCRAM verifiers and URL masking (services/common/db/credentials.py)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from services.common.config import ConfigError, load_settings
from services.common.db import credentials


def test_password_file_is_created_private_and_read_back(tmp_path: Path) -> None:
    path = tmp_path / "ferrum.password"
    first = credentials.read_or_create_password(path)
    info = path.lstat()
    assert stat.S_ISREG(info.st_mode) and stat.S_IMODE(info.st_mode) == 0o600
    assert info.st_uid == os.geteuid()
    assert len(first) >= 40 and first.isascii()
    assert credentials.read_or_create_password(path) == first  # kept, not regenerated
    assert [p.name for p in tmp_path.iterdir()] == ["ferrum.password"]  # no temporary file left
    path.unlink()
    assert credentials.read_or_create_password(path) != first  # deleting the file rotates the password


def test_password_files_others_could_touch_are_refused(tmp_path: Path) -> None:
    readable = tmp_path / "readable.password"
    readable.write_text("secret\n")
    readable.chmod(0o640)
    with pytest.raises(credentials.CredentialError, match="mode 0640, so others may have read it"):
        credentials.read_or_create_password(readable)
    assert readable.read_text() == "secret\n"  # left for the operator to look at

    target = tmp_path / "target"
    target.write_text("not a password\n")
    target.chmod(0o600)
    link = tmp_path / "link.password"
    link.symlink_to(target)
    with pytest.raises(credentials.CredentialError, match="symlink"):
        credentials.read_password(link)
    # Writing never goes through a planted symlink either: the link is replaced, the target untouched.
    credentials.write_password_file(link, "fresh")
    assert not link.is_symlink() and credentials.read_password(link) == "fresh"
    assert target.read_text() == "not a password\n"

    empty = tmp_path / "empty.password"
    empty.touch(mode=0o600)
    with pytest.raises(credentials.CredentialError, match="empty"):
        credentials.read_password(empty)
    with pytest.raises(credentials.CredentialError, match="not a regular file"):
        credentials.read_password(tmp_path)


def test_scram_verifier_format() -> None:
    verifier = credentials.scram_sha256_verifier("pencil", salt=b"0123456789abcdef")
    method, iterations_salt, keys = verifier.split("$")
    assert method == "SCRAM-SHA-256"
    assert iterations_salt == "4096:MDEyMzQ1Njc4OWFiY2RlZg=="
    stored_key, server_key = keys.split(":")
    assert len(stored_key) == len(server_key) == 44  # base64 of 32 bytes
    assert credentials.scram_sha256_verifier("pencil") != credentials.scram_sha256_verifier("pencil")  # salted
    with pytest.raises(ValueError, match="ASCII"):
        credentials.scram_sha256_verifier("pässword")


@pytest.mark.parametrize(
    "url, shown",
    [
        ("postgresql://ferrum:s3cret@127.0.0.1:5432/ferrum", "postgresql://ferrum:******@127.0.0.1:5432/ferrum"),
        ("postgresql://ferrum@127.0.0.1/ferrum", "postgresql://ferrum@127.0.0.1/ferrum"),
        ("postgresql://u:p%40ss@h/db?sslmode=require", "postgresql://u:******@h/db?sslmode=require"),
        ("postgresql:///db?host=/run/pg&password=s3cret", "postgresql:///db?host=/run/pg&password=******"),
        ("postgresql://u:s3cret@[::1/db", "postgresql://u:******@[::1/db"),  # too malformed to split
        ("postgres//nope", "postgres//nope"),
    ],
)
def test_mask_password(url: str, shown: str) -> None:
    assert credentials.mask_password(url) == shown


def test_url_with_password() -> None:
    assert (
        credentials.url_with_password("postgresql://ferrum:old@127.0.0.1:5/db", "new")
        == "postgresql://ferrum:new@127.0.0.1:5/db"
    )


def test_config_errors_do_not_show_the_password() -> None:
    with pytest.raises(ConfigError) as info:
        load_settings({"FERRUM_DATABASE_URL": "postgresql://ferrum:s3cret@h:notaport/db"})
    assert "s3cret" not in str(info.value) and "ferrum:******@h:notaport" in str(info.value)
