"""Which checksum an image must match, from IPA's ``image_info`` fields.

Resolved *before* the download starts so the bytes can be hashed as they
stream to the disk (no second read of the disk). Order as in IPA:
``os_hash_algo`` + ``os_hash_value`` first, then the legacy ``checksum``.
Either value may be a URL of a checksums file (``sha256sum`` output,
``HASH  name`` or ``HASH *name`` lines, BSD ``SHA256 (name) = HASH`` lines,
or one bare hash); the line for the image's file name is used. md5 is
refused unless the operator allowed it.
"""

from __future__ import annotations

import hashlib
import posixpath
import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlparse

from services.common import errors

ALGO_BY_LENGTH = {32: "md5", 64: "sha256", 96: "sha384", 128: "sha512"}
SUPPORTED_ALGOS = frozenset(("md5", "sha256", "sha384", "sha512"))
_HEX = re.compile(r"^[0-9a-fA-F]+$")
_BSD_LINE = re.compile(r"^(?P<algo>[A-Za-z0-9-]+) ?\((?P<name>.+)\) ?= ?(?P<hash>[0-9a-fA-F]+)$")

FetchText = Callable[[str], Awaitable[str]]


@dataclass(frozen=True)
class ExpectedChecksum:
    algo: str
    value: str
    source: str  # where it came from, for error messages

    def new_hasher(self) -> Any:
        return hashlib.new(self.algo)


def is_url(value: str) -> bool:
    return _scheme(value) in ("http", "https")


def _scheme(url: str) -> str:
    """The URL's scheme; "" for text no URL parser accepts (``http://[::1`` raises ValueError)."""
    if "://" not in url:
        return ""
    try:
        return urlparse(url).scheme
    except ValueError:
        return ""


def image_file_name(url: str) -> str:
    return posixpath.basename(unquote(urlparse(url).path))


def validate_image_info(image_info: Any, *, allow_md5: bool) -> None:
    """IPA's synchronous checks: refuse the command (400) before anything runs."""
    if not isinstance(image_info, Mapping):
        raise errors.InvalidParameterValue("image_info must be an object")
    image_id = image_info.get("id")
    if not image_id:
        raise errors.InvalidParameterValue("Image is missing the 'id' field.")
    if not isinstance(image_id, str):
        raise errors.InvalidParameterValue("Image 'id' must be a string.")
    urls = image_info.get("urls")
    if not isinstance(urls, list) or not urls or not all(isinstance(u, str) and u for u in urls):
        raise errors.InvalidParameterValue("Image 'urls' must be a non-empty list of URLs.")
    for url in urls:
        if _scheme(url) not in ("http", "https"):
            raise errors.InvalidParameterValue(f"Image URL {url!r} is not an http(s) URL.")
    algo, value = image_info.get("os_hash_algo"), image_info.get("os_hash_value")
    if algo and value:
        if not isinstance(algo, str) or not isinstance(value, str):
            raise errors.InvalidParameterValue("Image os_hash_algo and os_hash_value must be strings.")
        algo, value = algo.lower(), value.strip()
        if algo not in SUPPORTED_ALGOS:
            raise errors.InvalidParameterValue(
                f"Image hash algorithm {algo!r} is not supported (use one of {', '.join(sorted(SUPPORTED_ALGOS))})."
            )
        if algo == "md5" and not allow_md5:
            raise errors.InvalidParameterValue("MD5 image checksums are disabled on this agent.")
        if not is_url(value) and (not _HEX.match(value) or ALGO_BY_LENGTH.get(len(value)) != algo):
            raise errors.InvalidParameterValue(
                f"Image os_hash_value {value[:140]!r} is not a hex {algo} value or a URL of a checksums file."
            )
        return
    checksum = image_info.get("checksum")
    if not checksum or not isinstance(checksum, str):
        raise errors.InvalidParameterValue(
            "Image checksum is missing: give os_hash_algo and os_hash_value, or checksum."
        )
    if is_url(checksum):
        return
    if len(checksum) == 32 and not allow_md5:
        raise errors.InvalidParameterValue("MD5 image checksums are disabled on this agent.")
    if len(checksum) not in ALGO_BY_LENGTH or not _HEX.match(checksum):
        raise errors.InvalidParameterValue(
            f"Image checksum {checksum!r} is not a hex md5/sha256/sha384/sha512 value or a URL."
        )


def parse_checksum_file(text: str, file_name: str) -> str:
    """The hash for ``file_name`` in a checksums file (or its one bare hash)."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.strip().startswith("#")]
    if len(lines) == 1 and len(lines[0].split()) == 1 and _HEX.match(lines[0]):
        return lines[0]
    for line in lines:
        bsd = _BSD_LINE.match(line)
        if bsd:
            if posixpath.basename(bsd.group("name").strip()) == file_name:
                return bsd.group("hash")
            continue
        parts = line.split(None, 1)
        if len(parts) != 2 or not _HEX.match(parts[0]):
            continue
        name = parts[1].strip().lstrip("*")
        if name.startswith("./"):
            name = name[2:]
        if name == file_name or posixpath.basename(name) == file_name:
            return parts[0]
    raise errors.ImageError(f"No checksum for image file {file_name!r} was found in the checksum file")


async def resolve_expected(
    image_info: Mapping[str, Any], *, allow_md5: bool, fetch_text: FetchText
) -> ExpectedChecksum:
    """The algorithm and value the downloaded bytes must hash to."""
    validate_image_info(image_info, allow_md5=allow_md5)
    image_name = image_file_name(image_info["urls"][0])
    algo, value = image_info.get("os_hash_algo"), image_info.get("os_hash_value")
    if algo and value:
        algo, value = str(algo).lower(), str(value).strip()
        source = "os_hash_value"
        if is_url(value):
            source = value
            value = parse_checksum_file(await fetch_text(value), image_name)
        return _checked(algo, value, source, allow_md5)
    checksum = str(image_info["checksum"]).strip()
    source = "checksum"
    if is_url(checksum):
        source = checksum
        checksum = parse_checksum_file(await fetch_text(checksum), image_name)
    algo = ALGO_BY_LENGTH.get(len(checksum))
    if algo is None:
        raise errors.ImageError(f"Checksum {checksum!r} from {source} has no known algorithm (length {len(checksum)})")
    return _checked(algo, checksum, source, allow_md5)


def _checked(algo: str, value: str, source: str, allow_md5: bool) -> ExpectedChecksum:
    if algo == "md5" and not allow_md5:
        raise errors.ImageError("MD5 image checksums are disabled on this agent.")
    if not _HEX.match(value):
        raise errors.ImageError(f"Checksum {value!r} from {source} is not a hex string")
    return ExpectedChecksum(algo, value.lower(), source)
