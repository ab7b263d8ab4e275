"""What the object store accepts as container names, object names, content
types and user metadata. Everything is checked before a byte is stored, so
bad input changes nothing."""

from __future__ import annotations

from collections.abc import Mapping

from services.common import errors

MAX_NAME_BYTES = 255
MAX_METADATA_ITEMS = 64
MAX_METADATA_KEY = 128
MAX_METADATA_VALUE = 4096
MAX_CONTENT_TYPE = 255
TEMP_URL_METHODS = ("GET", "HEAD", "PUT")


def _has_control(text: str) -> bool:
    return any(ord(ch) < 0x20 or ord(ch) == 0x7F for ch in text)


def check_container(container: str) -> str:
    """A container is one path segment: no '/', '..', NUL or control characters."""
    if not container:
        raise errors.MissingParameter("container name is required")
    if len(container.encode()) > MAX_NAME_BYTES:
        raise errors.InvalidParameterValue(f"container name is longer than {MAX_NAME_BYTES} bytes")
    if "/" in container or ".." in container or container == "." or _has_control(container):
        raise errors.InvalidParameterValue(
            f"container name {container!r} may not contain '/', '..', NUL or control characters"
        )
    return container


def check_name(name: str) -> str:
    """Object names may hold '/' (pseudo folders) but never start with one,
    never contain '..' (a path trick on a filesystem or in a URL), NUL or
    other control characters, and fit in 255 UTF-8 bytes."""
    if not name:
        raise errors.MissingParameter("object name is required")
    if len(name.encode()) > MAX_NAME_BYTES:
        raise errors.InvalidParameterValue(f"object name is longer than {MAX_NAME_BYTES} bytes")
    if name.startswith("/") or name.endswith("/") or ".." in name or "//" in name or _has_control(name):
        raise errors.InvalidParameterValue(
            f"object name {name!r} may not start or end with '/', contain '//', '..', NUL or control characters"
        )
    return name


def check_content_type(content_type: str) -> str:
    content_type = content_type or "application/octet-stream"
    if len(content_type) > MAX_CONTENT_TYPE or _has_control(content_type) or "/" not in content_type:
        raise errors.InvalidParameterValue(f"content type {content_type[:64]!r} is not a MIME type")
    return content_type


def check_metadata(metadata: Mapping[str, str]) -> dict[str, str]:
    if len(metadata) > MAX_METADATA_ITEMS:
        raise errors.InvalidParameterValue(f"at most {MAX_METADATA_ITEMS} metadata items are allowed")
    for key, value in metadata.items():
        if not key or len(key) > MAX_METADATA_KEY or _has_control(key):
            raise errors.InvalidParameterValue(
                f"metadata key {key[:64]!r} is empty, too long or has control characters"
            )
        if len(value) > MAX_METADATA_VALUE or "\x00" in value:
            raise errors.InvalidParameterValue(f"metadata value of {key!r} is too long or holds NUL")
    return dict(metadata)


def check_method(method: str) -> str:
    method = (method or "GET").upper()
    if method not in TEMP_URL_METHODS:
        raise errors.InvalidParameterValue(f"temp URLs allow only {', '.join(TEMP_URL_METHODS)}, not {method!r}")
    return method
