"""What a simulated machine "sees" on its disk when it boots the OS.

Pure Python readers for GPT and MBR (with logical partitions) on a plain
file, a sniff of each partition's filesystem, and ``read_config_drive``,
which extracts a ``config-2`` partition the way cloud-init's ConfigDrive
datasource would (openstack/<version>/meta_data.json and friends). Blocking
file I/O: call these in ``asyncio.to_thread``.
"""

from __future__ import annotations

import base64
import io
import json
import os
import struct
import uuid
from typing import Any, BinaryIO, cast

SECTOR = 512
GPT_SIGNATURE = b"EFI PART"
CONFIG_DRIVE_LABEL = "config-2"
EXTENDED_TYPES = (0x05, 0x0F, 0x85)
MAX_CONFIG_FILE = 16 * 1024 * 1024  # a config drive is at most 64 MiB; no single file near that

GPT_TYPES = {
    "c12a7328-f81f-11d2-ba4b-00a0c93ec93b": "efi",
    "21686148-6449-6e6f-744e-656564454649": "bios_boot",
    "0fc63daf-8483-4772-8e79-3d69d8477de4": "linux",
    "0657fd6d-a4ab-43c4-84e5-0933c84b4f4f": "linux_swap",
    "ebd0a0a2-b9e5-4433-87c0-68b6b72699c7": "basic_data",
    "9e1a2d38-c612-4316-aa26-8b49521e5a8b": "prep",
}


def _guid(raw: bytes) -> str:
    return str(uuid.UUID(bytes_le=raw))


class _Window(io.RawIOBase):
    """A read-only view of ``length`` bytes of a file starting at ``offset``,
    so pycdlib can open an ISO that lives inside a partition."""

    def __init__(self, fp: BinaryIO, offset: int, length: int) -> None:
        self._fp, self._offset, self._length, self._pos = fp, offset, length, 0
        self.mode = "rb"

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, pos: int, whence: int = os.SEEK_SET) -> int:
        base = {os.SEEK_SET: 0, os.SEEK_CUR: self._pos, os.SEEK_END: self._length}[whence]
        self._pos = max(0, base + pos)
        return self._pos

    def read(self, size: int = -1) -> bytes:
        remaining = max(0, self._length - self._pos)
        size = remaining if size is None or size < 0 else min(size, remaining)
        self._fp.seek(self._offset + self._pos)
        data = self._fp.read(size)
        self._pos += len(data)
        return data

    def readinto(self, buffer: Any) -> int:
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)


def _read_at(fp: BinaryIO, offset: int, size: int) -> bytes:
    fp.seek(offset)
    return fp.read(size)


def _gpt(fp: BinaryIO, disk_size: int) -> dict[str, Any] | None:
    header = _read_at(fp, SECTOR, 92)
    if len(header) < 92 or header[:8] != GPT_SIGNATURE:
        return None
    disk_guid = _guid(header[56:72])
    entries_lba, count, entry_size = struct.unpack_from("<QII", header, 72)
    if entry_size < 128 or count > 1024:
        return {"table": "gpt", "disk_guid": disk_guid, "partitions": [], "error": "corrupt GPT header"}
    table = _read_at(fp, entries_lba * SECTOR, count * entry_size)
    partitions = []
    for number in range(count):
        entry = table[number * entry_size : (number + 1) * entry_size]
        if len(entry) < 128 or entry[:16] == b"\0" * 16:
            continue
        type_guid = _guid(entry[:16])
        first, last = struct.unpack_from("<QQ", entry, 32)
        name = entry[56:128].decode("utf-16-le", "replace").rstrip("\0")
        partitions.append(
            {
                "number": number + 1,
                "start": first * SECTOR,
                "size": (last - first + 1) * SECTOR,
                "type": GPT_TYPES.get(type_guid, type_guid),
                "uuid": _guid(entry[16:32]),
                "name": name,
            }
        )
    return {"table": "gpt", "disk_guid": disk_guid, "partitions": partitions}


def _mbr(fp: BinaryIO, disk_size: int) -> dict[str, Any] | None:
    mbr = _read_at(fp, 0, SECTOR)
    if len(mbr) < SECTOR or mbr[510:512] != b"\x55\xaa":
        return None
    signature = struct.unpack_from("<I", mbr, 440)[0]
    partitions: list[dict[str, Any]] = []
    for index in range(4):
        kind, start, sectors = _mbr_entry(mbr, index)
        if kind == 0 or sectors == 0:
            continue
        if kind in EXTENDED_TYPES:
            partitions.extend(_logical(fp, start, disk_size))
            continue
        partitions.append(
            {
                "number": index + 1,
                "start": start * SECTOR,
                "size": sectors * SECTOR,
                "type": f"0x{kind:02x}",
                "name": "",
            }
        )
    # Ironic/IPA name MBR partitions by disk signature: "<signature>-<number>".
    for part in partitions:
        part["uuid"] = f"{signature:08x}-{part['number']:02d}"
    return {"table": "mbr", "disk_guid": f"0x{signature:08x}", "partitions": partitions}


def _mbr_entry(sector: bytes, index: int) -> tuple[int, int, int]:
    entry = sector[446 + 16 * index : 446 + 16 * (index + 1)]
    return entry[4], struct.unpack_from("<I", entry, 8)[0], struct.unpack_from("<I", entry, 12)[0]


def _logical(fp: BinaryIO, extended_start: int, disk_size: int) -> list[dict[str, Any]]:
    """Walk the EBR chain of an extended partition (bounded, loops rejected)."""
    found: list[dict[str, Any]] = []
    ebr_lba, seen = extended_start, set()
    while ebr_lba and ebr_lba not in seen and len(found) < 128 and ebr_lba * SECTOR < disk_size:
        seen.add(ebr_lba)
        ebr = _read_at(fp, ebr_lba * SECTOR, SECTOR)
        if len(ebr) < SECTOR or ebr[510:512] != b"\x55\xaa":
            break
        kind, start, sectors = _mbr_entry(ebr, 0)
        if kind and sectors:
            found.append(
                {
                    "number": 5 + len(found),
                    "start": (ebr_lba + start) * SECTOR,
                    "size": sectors * SECTOR,
                    "type": f"0x{kind:02x}",
                    "name": "",
                }
            )
        _, next_start, _ = _mbr_entry(ebr, 1)
        ebr_lba = extended_start + next_start if next_start else 0
    return found


def _sniff(fp: BinaryIO, offset: int) -> dict[str, str]:
    """Filesystem type and label from the superblock magic numbers."""
    head = _read_at(fp, offset, 4096)
    if len(head) >= 1024 + 136 and head[1024 + 56 : 1024 + 58] == b"\x53\xef":
        label = head[1024 + 120 : 1024 + 136].split(b"\0")[0].decode("utf-8", "replace")
        return {"filesystem": "ext", "label": label}
    if head[:4] == b"XFSB":
        return {"filesystem": "xfs", "label": head[108:120].split(b"\0")[0].decode("utf-8", "replace")}
    if head[510:512] == b"\x55\xaa" and head[82:87] == b"FAT32":
        return {"filesystem": "vfat", "label": head[71:82].decode("ascii", "replace").strip()}
    if head[510:512] == b"\x55\xaa" and head[54:57] == b"FAT":
        return {"filesystem": "vfat", "label": head[43:54].decode("ascii", "replace").strip()}
    if head[4086:4096] in (b"SWAPSPACE2", b"SWAP-SPACE"):
        return {"filesystem": "swap", "label": ""}
    pvd = _read_at(fp, offset + 16 * 2048, 72)
    if pvd[1:6] == b"CD001":
        return {"filesystem": "iso9660", "label": pvd[40:72].decode("ascii", "replace").strip()}
    return {"filesystem": "", "label": ""}


def read_partitions(disk_path: str | os.PathLike[str]) -> dict[str, Any]:
    """The disk's partition table: ``{"table": "gpt"|"mbr"|None, "disk_guid",
    "partitions": [{number, start, size, type, uuid, name, filesystem, label}]}``."""
    size = os.path.getsize(disk_path)
    with open(disk_path, "rb") as fp:
        found = _gpt(fp, size) or _mbr(fp, size)
        if found is None:
            whole = _sniff(fp, 0)
            return {
                "table": None,
                "disk_guid": None,
                "partitions": [],
                "size": size,
                **({"whole_disk": whole} if whole["filesystem"] else {}),
            }
        for part in found["partitions"]:
            if part["start"] < size:
                part.update(_sniff(fp, part["start"]))
            else:
                part.update({"filesystem": "", "label": "", "error": "beyond the end of the disk"})
    found["size"] = size
    return found


def iso_files(iso: Any) -> tuple[str, dict[str, str]]:
    """Map of lower-case path -> pycdlib path, preferring Rock Ridge, then Joliet."""
    for facade_name, kwarg in (("rr", "rr_path"), ("joliet", "joliet_path"), ("iso9660", "iso_path")):
        if facade_name == "rr" and not iso.has_rock_ridge():
            continue
        if facade_name == "joliet" and not iso.has_joliet():
            continue
        files: dict[str, str] = {}
        for root, _dirs, names in iso.walk(**{kwarg: "/"}):
            for name in names:
                shown = name.split(";")[0] if facade_name == "iso9660" else name
                full = f"{root.rstrip('/')}/{name}"
                files[f"{root.rstrip('/')}/{shown}".lower().lstrip("/")] = full
        return kwarg, files
    return "iso_path", {}


def read_iso_file(iso: Any, kwarg: str, path: str) -> bytes:
    out = io.BytesIO()
    iso.get_file_from_iso_fp(out, **{kwarg: path})
    return out.getvalue()[:MAX_CONFIG_FILE]


def _choose_version(files: dict[str, str]) -> str | None:
    versions = {p.split("/")[1] for p in files if p.startswith("openstack/") and p.count("/") >= 2}
    if "latest" in versions:
        return "latest"
    dated = sorted(v for v in versions if v[:4].isdigit())
    return dated[-1] if dated else None


def _text(data: bytes) -> str | dict[str, str]:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return {"base64": base64.b64encode(data).decode()}


def _read_config_iso(window: _Window) -> dict[str, Any]:
    import pycdlib

    iso = pycdlib.PyCdlib()
    iso.open_fp(cast(BinaryIO, window))  # pycdlib only seeks, tells and reads
    try:
        kwarg, files = iso_files(iso)
        version = _choose_version(files)
        result: dict[str, Any] = {"files": sorted(files), "version": version}
        if version is None:
            result["error"] = "no openstack/<version>/ directory"
            return result

        def get(name: str) -> bytes | None:
            key = f"openstack/{version}/{name}"
            return read_iso_file(iso, kwarg, files[key]) if key in files else None

        meta_raw = get("meta_data.json")
        meta: dict[str, Any] = {}
        if meta_raw is not None:
            try:
                meta = json.loads(meta_raw)
            except ValueError:
                result["error"] = "meta_data.json is not valid JSON"
        result["meta_data"] = meta
        result["uuid"] = meta.get("uuid")
        result["hostname"] = meta.get("hostname") or meta.get("name")
        keys = meta.get("public_keys") or {}
        result["public_keys"] = list(keys.values()) if isinstance(keys, dict) else list(keys)
        for name, key in (("network_data.json", "network_data"), ("vendor_data.json", "vendor_data")):
            raw = get(name)
            try:
                result[key] = json.loads(raw) if raw is not None else None
            except ValueError:
                result[key] = None
                result.setdefault("warnings", []).append(f"{name} is not valid JSON")
        user = get("user_data")
        result["user_data"] = _text(user) if user is not None else None
        return result
    finally:
        iso.close()


def read_config_drive(disk_path: str | os.PathLike[str], table: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """Find a ``config-2`` partition and read it as cloud-init would; None when absent.

    A partition counts when its GPT name or its filesystem label is config-2.
    Only ISO9660 config drives are read (what Nova and Ironic build); a vfat
    one is reported as found but unread. ``table`` saves re-reading the
    partition table when the caller already has it.
    """
    table = table if table is not None else read_partitions(disk_path)
    candidates = [
        p for p in table["partitions"] if p.get("name") == CONFIG_DRIVE_LABEL or p.get("label") == CONFIG_DRIVE_LABEL
    ]
    if not candidates:
        return None
    part = candidates[-1]
    base = {
        "partition": part["number"],
        "partition_uuid": part.get("uuid"),
        "filesystem": part.get("filesystem"),
        "count": len(candidates),
    }
    if part.get("filesystem") != "iso9660":
        return {
            **base,
            "error": f"config-2 partition holds {part.get('filesystem') or 'no known'} filesystem, not ISO9660",
        }
    with open(disk_path, "rb") as fp:
        try:
            return {**base, **_read_config_iso(_Window(fp, part["start"], part["size"]))}
        except Exception as exc:  # noqa: BLE001 - a corrupt ISO is a finding, not a simulator crash
            return {**base, "error": f"cannot read the ISO: {exc}"}


def inspect_disk(disk_path: str | os.PathLike[str]) -> dict[str, Any]:
    """Everything "booting the OS" finds: partition table, filesystems, config drive."""
    table = read_partitions(disk_path)
    table["config_drive"] = read_config_drive(disk_path, table) if table["partitions"] else None
    return table
