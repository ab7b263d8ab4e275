"""Signed upload (PUT) URLs: build, parse and verify, and what they refuse."""

from __future__ import annotations

import time
from urllib.parse import unquote

import pytest

from services.objectstore import tempurl

SECRET = b"s3cret"


def test_round_trip_with_unicode_and_folders() -> None:
    expires = int(time.time()) + 60
    path = tempurl.build_upload_path(SECRET, "ïmages", "deploy/boot ïso.iso", expires)
    assert path.startswith("/u/") and " " not in path
    target = tempurl.parse_upload_path(unquote(path))
    assert target is not None
    assert target == tempurl.UploadTarget(expires, target.signature, "ïmages", "deploy/boot ïso.iso")
    assert tempurl.verify_upload(SECRET, target)
    assert not tempurl.verify_upload(b"other secret", target)


@pytest.mark.parametrize("change", ["container", "name", "expires"])
def test_any_change_breaks_the_signature(change: str) -> None:
    target = tempurl.parse_upload_path(unquote(tempurl.build_upload_path(SECRET, "c", "n.img", 2_000_000_000)))
    assert target is not None
    changed = tempurl.UploadTarget(
        target.expires + (change == "expires"),
        target.signature,
        target.container + ("x" if change == "container" else ""),
        target.name + ("x" if change == "name" else ""),
    )
    assert not tempurl.verify_upload(SECRET, changed)


def test_a_download_signature_is_not_an_upload_signature() -> None:
    """Same secret, same expiry: the PUT message differs, so no URL serves both ways."""
    download = tempurl.signature(SECRET, "PUT", 1, "c/n.img", 2_000_000_000)
    assert download != tempurl.upload_signature(SECRET, "c", "n.img", 2_000_000_000)


@pytest.mark.parametrize(
    "path",
    [
        "/t/1.2.AAAAAAAAAAAAAAAAAAAAAA/c/n",
        "/u/",
        "/u/zz/c/n",
        "/u/1.short/c/n",
        "/u/1.AAAAAAAAAAAAAAAAAAAAAA/c",
        "/u/1.AAAAAAAAAAAAAAAAAAAAAA/c/",
        "/u/!!.AAAAAAAAAAAAAAAAAAAAAA/c/n",
        "/u/zzzzzzzzzz.AAAAAAAAAAAAAAAAAAAAAA/c/n",
    ],
)
def test_malformed_paths_are_not_upload_targets(path: str) -> None:
    assert tempurl.parse_upload_path(path) is None
