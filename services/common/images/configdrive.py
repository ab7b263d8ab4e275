"""The Ironic ``configdrive`` value: built from a dict, encoded, decoded and checked.

Nova (and openstacksdk) send ``base64(gzip(ISO9660))``; Nova with
``config_drive_format=vfat`` sends a VFAT image labelled ``config-2`` the same
way, which cloud-init reads as well and is accepted too (anything else is
refused). API 1.56+ clients may send a dict that the conductor turns into an
ISO (CONTRACT 3.3). All
end up here so that every service agrees on the format and on the 64 MiB
limit IPA enforces (``MAX_CONFIG_DRIVE_SIZE_MB``).

Decoding never trusts the declared sizes: gzip is inflated in bounded chunks
and stops as soon as the output passes the limit, so a 1 KiB gzip bomb costs
at most ``limit`` bytes of memory.
"""

from __future__ import annotations

import base64
import binascii
import gzip
import io
import json
import zlib
from collections.abc import Mapping, Sequence
from typing import Any

from services.common import errors
from services.common.images import fat, iso9660
from services.common.images.network_data import generate_network_data

MAX_CONFIGDRIVE_BYTES = 64 * 1024 * 1024
LABEL = "config-2"
VERSIONS = ("2012-08-10", "latest")
_GZIP_MAGIC = b"\x1f\x8b"
# base64 of the gzip magic and deflate method (1f 8b 08): every gzip+base64 string starts so.
_GZIP_BASE64_PREFIX = "H4sI"
_BASE64_SPACE = str.maketrans("", "", " \t\r\n")
_INFLATE_CHUNK = 1024 * 1024
NOT_A_DRIVE = "neither an ISO9660 image nor a VFAT image labelled config-2"


def drive_format(image: bytes) -> str | None:
    """``"iso9660"`` or ``"vfat"`` when ``image`` is a config drive cloud-init can read, else None.

    An ISO needs no label here (Ironic and IPA accept any ISO9660); a FAT
    image must carry the ``config-2`` label (any case, root directory or
    boot sector), since that label is how cloud-init finds a VFAT drive.
    """
    if iso9660.is_iso9660(image):
        return "iso9660"
    if any(label.lower() == LABEL for label in fat.volume_labels(io.BytesIO(image[: 4 * 1024 * 1024]))):
        return "vfat"
    return None


def _mib(limit: int) -> str:
    return f"{limit / (1024 * 1024):g}MiB"


def _json_bytes(value: Any) -> bytes:
    # json.dumps with its default separators: byte-identical to openstacksdk's json.dump.
    return json.dumps(value).encode("utf-8")


def _user_data_bytes(user_data: Any) -> bytes | None:
    """Ironic's encoding: dict/list -> JSON, str -> UTF-8, bytes as they are; empty -> no file."""
    if user_data is None or user_data == "" or user_data == b"":
        return None
    if isinstance(user_data, (dict, list)):
        return _json_bytes(user_data)
    if isinstance(user_data, str):
        return user_data.encode("utf-8")
    if isinstance(user_data, (bytes, bytearray)):
        return bytes(user_data)
    raise errors.InvalidParameterValue(
        f"Invalid configdrive format: user_data must be an object, array or string, not {type(user_data).__name__}"
    )


def configdrive_files(
    node: Mapping[str, Any], ports: Sequence[Mapping[str, Any]], contents: Mapping[str, Any]
) -> dict[str, bytes]:
    """The files of the drive (relative path -> bytes) for the API dict ``contents``.

    Separate from :func:`build_configdrive` so the benchmark (and anyone
    comparing with ``genisoimage``) can lay the very same tree on disk.
    """
    if not isinstance(contents, Mapping):
        raise errors.InvalidParameterValue("Invalid configdrive format: expected an object")
    unknown = set(contents) - {"meta_data", "network_data", "user_data", "vendor_data"}
    if unknown:
        raise errors.InvalidParameterValue(f"Invalid configdrive format: unexpected keys {', '.join(sorted(unknown))}")
    for key in ("meta_data", "network_data", "vendor_data"):
        value = contents.get(key)
        if value is not None and not isinstance(value, Mapping):
            raise errors.InvalidParameterValue(f"Invalid configdrive format: {key} must be an object")

    meta_data = dict(contents.get("meta_data") or {})
    meta_data.setdefault("uuid", str(node["uuid"]))
    if node.get("name"):
        meta_data.setdefault("name", node["name"])
    network_data = contents.get("network_data") or (generate_network_data(ports) if ports else None)
    vendor_data = contents.get("vendor_data")
    user_data = _user_data_bytes(contents.get("user_data"))

    files: dict[str, bytes] = {}
    for version in VERSIONS:
        base = f"openstack/{version}"
        files[f"{base}/meta_data.json"] = _json_bytes(meta_data)
        if network_data:
            files[f"{base}/network_data.json"] = _json_bytes(network_data)
        if vendor_data:
            files[f"{base}/vendor_data2.json"] = _json_bytes(vendor_data)
        if user_data is not None:
            files[f"{base}/user_data"] = user_data
    return files


def build_configdrive(
    node: Mapping[str, Any], ports: Sequence[Mapping[str, Any]], contents: Mapping[str, Any]
) -> bytes:
    """The config drive ISO for the API dict ``contents`` (``meta_data``, ``network_data``,
    ``user_data``, ``vendor_data``), as Ironic builds it (CONTRACT 3.3).

    Volume label ``config-2``; ``openstack/2012-08-10/`` and ``openstack/latest/``
    each hold ``meta_data.json`` (``uuid`` and ``name`` defaulted from the node),
    ``network_data.json`` (generated from ``ports`` when absent),
    ``vendor_data2.json`` and ``user_data`` when given. Built with pycdlib, so
    no external ISO tool is needed. Raises InvalidParameterValue when the
    result would exceed :data:`MAX_CONFIGDRIVE_BYTES`.
    """
    files = configdrive_files(node, ports, contents)
    iso = iso9660.write_iso(files, label=LABEL)
    if len(iso) > MAX_CONFIGDRIVE_BYTES:
        raise errors.InvalidParameterValue(
            f"Config drive size exceeds maximum limit of {_mib(MAX_CONFIGDRIVE_BYTES)} "
            f"(the built image is {len(iso)} bytes)"
        )
    return iso


def encode_configdrive(iso: bytes) -> str:
    """``base64(gzip(iso))`` as ASCII: the string Nova and openstacksdk send."""
    return base64.b64encode(gzip.compress(iso, compresslevel=6, mtime=0)).decode("ascii")


def is_gzip_base64(value: str) -> bool:
    """Whether a drive string is base64 of gzip data, the only inline form IPA
    decodes (it gunzips whatever it base64-decodes); plain base64 of an image,
    which Ferrum also accepts, is not. Looks at the first bytes only: the
    deploy verb has decoded the whole string already."""
    head = value[:64].translate(_BASE64_SPACE)
    return head.startswith(_GZIP_BASE64_PREFIX)


def looks_like_url(value: str) -> bool:
    """Whether the Ironic API treats the string as a URL: it contains ``://`` (CONTRACT 3.1).

    Only http(s) URLs can be downloaded by the agent; see :func:`is_http_url`.
    """
    return isinstance(value, str) and "://" in value


def is_http_url(value: str) -> bool:
    """An http:// or https:// URL, the kinds the agent downloads (CONTRACT 3.4)."""
    return isinstance(value, str) and value.strip().lower().startswith(("http://", "https://"))


def _inflate(data: bytes, limit: int) -> bytes:
    """gunzip ``data`` (one or more members) in bounded chunks, refusing output over ``limit``."""
    out = io.BytesIO()
    total = 0
    pending = data
    while True:
        inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
        while not inflater.eof:
            try:
                piece = inflater.decompress(pending, _INFLATE_CHUNK)
            except zlib.error as exc:
                raise errors.InvalidParameterValue(f"Invalid configdrive: not valid gzip data ({exc})") from exc
            total += len(piece)
            if total > limit:
                raise errors.InvalidParameterValue(
                    f"Config drive size exceeds maximum limit of {_mib(limit)} "
                    f"(more than {limit} bytes after decompression)"
                )
            out.write(piece)
            pending = inflater.unconsumed_tail
            if not piece and not pending and not inflater.eof:
                raise errors.InvalidParameterValue("Invalid configdrive: truncated gzip data")
        pending = inflater.unused_data
        if not pending.startswith(_GZIP_MAGIC):
            break  # trailing zero padding is tolerated, as by gzip(1)
    if pending.strip(b"\x00"):
        raise errors.InvalidParameterValue("Invalid configdrive: trailing garbage after the gzip data")
    return out.getvalue()


def decode_configdrive(value: str, *, limit: int = MAX_CONFIGDRIVE_BYTES) -> bytes:
    """The drive image in a ``base64(gzip(image))`` (or plain ``base64(image)``) string:
    an ISO9660 image, or a VFAT image labelled ``config-2``.

    Raises InvalidParameterValue naming the problem: not base64, not gzip,
    neither kind of image, or larger than ``limit`` once decompressed (the
    message gives the limit in MiB, like IPA's).
    """
    if not isinstance(value, (str, bytes, bytearray)):
        raise errors.InvalidParameterValue(f"Invalid configdrive: expected a base64 string, not {type(value).__name__}")
    raw = value.encode("ascii", "replace") if isinstance(value, str) else bytes(value)
    compact = raw.translate(None, b" \t\r\n")
    if not compact:
        raise errors.InvalidParameterValue("Invalid configdrive: the value is empty")
    # gzip of incompressible data is slightly larger than the data: anything
    # decoding to much more than the limit cannot be a valid drive.
    if len(compact) // 4 * 3 > limit + limit // 100 + 64 * 1024:
        raise errors.InvalidParameterValue(
            f"Config drive size exceeds maximum limit of {_mib(limit)} "
            f"(the encoded value alone is {len(compact)} bytes)"
        )
    try:
        payload = base64.b64decode(compact, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise errors.InvalidParameterValue(f"Invalid configdrive: not a valid base64 string ({exc})") from exc
    if payload.startswith(_GZIP_MAGIC):
        iso = _inflate(payload, limit)
    else:
        iso = payload
        if len(iso) > limit:
            raise errors.InvalidParameterValue(
                f"Config drive size exceeds maximum limit of {_mib(limit)} ({len(iso)} bytes)"
            )
    if drive_format(iso) is None:
        raise errors.InvalidParameterValue(
            f"Invalid configdrive: the decoded data is {NOT_A_DRIVE} "
            "(expected base64 of a gzip-compressed ISO9660 or VFAT image)"
        )
    return iso
