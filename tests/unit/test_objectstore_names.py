"""Object store input rules and temp-URL signing, without servers."""

from __future__ import annotations

import pytest

from services.common import errors
from services.common.config import ConfigError, load_settings
from services.objectstore import names, tempurl

SECRET = b"0123456789abcdef0123456789abcdef"


@pytest.mark.parametrize("name", ["boot-1.iso", "a/b/c.img", "é" * 127 + "x", "x" * 255, "with space.iso"])
def test_good_names(name: str) -> None:
    assert names.check_name(name) == name


@pytest.mark.parametrize(
    "name", ["", "/etc", "a/../b", "..", "a..b", "nul\x00", "tab\tname", "x" * 256, "é" * 128, "trailing/", "a//b"]
)
def test_bad_names(name: str) -> None:
    with pytest.raises(errors.Invalid):
        names.check_name(name)


@pytest.mark.parametrize("container", ["", "a/b", "..", ".", "c\x00", "x" * 256])
def test_bad_containers(container: str) -> None:
    with pytest.raises(errors.Invalid):
        names.check_container(container)


def test_metadata_and_content_type_and_method() -> None:
    assert names.check_metadata({"k": "v"}) == {"k": "v"}
    with pytest.raises(errors.InvalidParameterValue):
        names.check_metadata({str(i): "v" for i in range(65)})
    with pytest.raises(errors.InvalidParameterValue):
        names.check_metadata({"k": "x" * 5000})
    assert names.check_content_type("") == "application/octet-stream"
    with pytest.raises(errors.InvalidParameterValue):
        names.check_content_type("text")
    assert names.check_method("head") == "HEAD"
    with pytest.raises(errors.InvalidParameterValue):
        names.check_method("DELETE")


def test_temp_url_path_round_trip() -> None:
    path = tempurl.build_path(SECRET, "GET", 4242, "boot 1.iso", 1_900_000_000)
    assert path.startswith("/t/") and path.endswith("/boot%201.iso")
    token = path.split("/")[2]
    parsed = tempurl.parse_token(token)
    assert parsed is not None and parsed.object_id == 4242 and parsed.expires == 1_900_000_000
    assert tempurl.verify(SECRET, ("GET",), parsed, "boot 1.iso")
    assert not tempurl.verify(SECRET, ("HEAD",), parsed, "boot 1.iso")
    assert not tempurl.verify(SECRET, ("GET",), parsed, "boot 2.iso")
    assert not tempurl.verify(b"another secret of enough length!", ("GET",), parsed, "boot 1.iso")
    moved = tempurl.ParsedToken(4243, parsed.expires, parsed.signature)
    assert not tempurl.verify(SECRET, ("GET",), moved, "boot 1.iso")
    later = tempurl.ParsedToken(4242, parsed.expires + 1, parsed.signature)
    assert not tempurl.verify(SECRET, ("GET",), later, "boot 1.iso")


@pytest.mark.parametrize(
    "token",
    [
        "",
        "a.b",
        "a.b.c",
        "!!.1.AAAAAAAAAAAAAAAAAAAAAA",
        "0.1.AAAAAAAAAAAAAAAAAAAAAA",
        "1.1.short",
        "1.1.AAAAAAAAAAAAAAAAAAAAAA.x",
    ],
)
def test_malformed_tokens(token: str) -> None:
    assert tempurl.parse_token(token) is None


def test_typical_url_is_short() -> None:
    path = tempurl.build_path(SECRET, "GET", 123456, "boot-6f1c5d1e-1111-4222-8333-444455556666.iso", 1_900_000_000)
    assert len("http://ferrum-objectstore.example.org:6391" + path) < 160
    assert tempurl.to_base36(0) == "0" and int(tempurl.to_base36(10**12), 36) == 10**12


@pytest.mark.parametrize(
    "env,message",
    [
        ({"FERRUM_OBJECTSTORE_DOWNLOAD_MODE": "sideways"}, "proxy or presigned"),
        ({"FERRUM_OBJECTSTORE_DOWNLOAD_MODE": "presigned"}, "BACKEND=s3"),
        ({"FERRUM_OBJECTSTORE_S3_PART_SIZE": "1024"}, "5 MiB"),
        ({"FERRUM_OBJECTSTORE_TEMP_URL_SECRET": "short"}, "16 characters"),
        ({"FERRUM_OBJECTSTORE_TEMP_URL_DEFAULT_LIFETIME": "0"}, "lifetimes"),
        ({"FERRUM_OBJECTSTORE_MAX_OBJECT_SIZE": "0"}, "positive"),
        ({"FERRUM_OBJECTSTORE_S3_PRESIGN_VERSION": "v9"}, "s3v4 or s3"),
    ],
)
def test_bad_objectstore_config(env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_settings(env)


def test_objectstore_config_from_env() -> None:
    settings = load_settings(
        {
            "FERRUM_OBJECTSTORE_BACKEND": "s3",
            "FERRUM_OBJECTSTORE_DOWNLOAD_MODE": "presigned",
            "FERRUM_OBJECTSTORE_S3_BUCKET": "b1",
            "FERRUM_OBJECTSTORE_SWEEP_INTERVAL": "5",
        }
    )
    assert settings.objectstore.download_mode == "presigned" and settings.objectstore.s3_bucket == "b1"
    assert settings.objectstore.sweep_interval == 5.0
