"""What a simulated machine "sees" on its disk when it boots the OS.

The reading itself is the shared disk-and-image package's: the partition
table reader the agent uses, and the config-drive reader that follows
cloud-init. This module only turns their records into the simulator's JSON
report and finds the config drive the way cloud-init's ConfigDrive
datasource does: partitions whose file-system label is ``config-2`` or
``CONFIG-2`` (a GPT partition *name* does not count), tried in cloud-init's
order (device names sorted in reverse), the first readable one wins. ISO9660
and vfat drives are read; a drive on another file system is reported as
unread. Blocking file I/O: call these in ``asyncio.to_thread``.
"""

from __future__ import annotations

import base64
import os
from collections.abc import Sequence
from typing import Any, BinaryIO, cast

from services.common import errors
from services.common.images import configdrive_reader, fat, filesystems, iso9660
from services.common.images.partition_table import GPT_TYPE_NAMES, Partition, read_partition_table, table_kind
from services.common.images.window import Window

CONFIG_DRIVE_LABELS = ("config-2", "CONFIG-2")  # cloud-init's LABEL_TYPES
READABLE = ("iso9660", "vfat")


def _partition_report(part: Partition, table: str, sector_size: int) -> dict[str, Any]:
    report: dict[str, Any] = {
        "number": part.number,
        "start": part.start * sector_size,
        "size": part.sectors * sector_size,
        "type": GPT_TYPE_NAMES.get(part.type_id, part.type_id.lower()) if table == "gpt" else f"0x{part.type_id}",
        "uuid": part.uuid,
        "name": part.name,
        "filesystem": part.filesystem,
        "label": part.labels[0] if part.labels else "",
    }
    if len(part.labels) > 1:
        report["labels"] = list(part.labels)
    if part.beyond_end:
        report["error"] = "beyond the end of the disk"
    return report


def read_partitions(disk_path: str | os.PathLike[str]) -> dict[str, Any]:
    """The disk's partition table: ``{"table": "gpt"|"mbr"|None, "disk_guid",
    "partitions": [{number, start, size, type, uuid, name, filesystem, label}]}``
    (bytes, not sectors; extended partitions are containers and not listed).
    A table that does not parse is a finding (``error``), not a crash."""
    size = os.path.getsize(disk_path)
    with open(disk_path, "rb") as fp:
        try:
            table = read_partition_table(fp)
        except errors.ImageFormatError as exc:
            kind = table_kind(fp)
            if kind is not None:
                return {"table": kind, "disk_guid": None, "partitions": [], "size": size, "error": exc.message}
            whole = filesystems.probe(fp, 0)
            report: dict[str, Any] = {"table": None, "disk_guid": None, "partitions": [], "size": size}
            if whole.kind:
                report["whole_disk"] = {"filesystem": whole.kind, "label": whole.label}
            return report
        partitions = [
            _partition_report(p, table.table, table.sector_size) for p in table.partitions if p.kind != "extended"
        ]
        for part in partitions:
            if "error" not in part:
                part["fs_uuid"] = filesystems.filesystem_uuid(fp, part["start"])
    return {
        "table": table.table,
        "disk_guid": table.disk_id if table.table == "gpt" else f"0x{table.disk_id}",
        "partitions": partitions,
        "size": size,
    }


def _text(data: bytes) -> str | dict[str, str]:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return {"base64": base64.b64encode(data).decode()}


def _drive_report(drive: configdrive_reader.ConfigDriveData, files: list[str]) -> dict[str, Any]:
    return {
        "files": files,
        "layout": drive.layout,
        "version": drive.version,
        "meta_data": drive.meta_data,
        "uuid": drive.instance_id,
        "hostname": drive.hostname,
        "public_keys": drive.public_keys,
        "network_data": drive.network_data,
        "vendor_data": drive.vendor_data,
        "vendor_data2": drive.vendor_data2,
        "user_data": _text(drive.user_data) if drive.user_data is not None else None,
    }


def _read_drive(disk_path: str | os.PathLike[str], part: dict[str, Any]) -> dict[str, Any]:
    """cloud-init's reading of one candidate partition; raises ConfigDriveInvalid when it would not use it."""
    if part["filesystem"] == "vfat":
        try:
            volume = fat.FatVolume(disk_path, offset=part["start"])
        except errors.ImageFormatError as exc:
            raise errors.ConfigDriveInvalid(f"cannot read the FAT file system: {exc.message}") from None
        return _drive_report(configdrive_reader.read_drive(volume), volume.files())
    with open(disk_path, "rb") as fp:
        try:
            with iso9660.IsoVolume(cast(BinaryIO, Window(fp, part["start"], part["size"]))) as iso:  # a RawIOBase
                return _drive_report(configdrive_reader.read_drive(iso), iso.files())
        except errors.ImageFormatError as exc:
            raise errors.ConfigDriveInvalid(f"cannot read the ISO: {exc.message}") from None


def read_config_drive(disk_path: str | os.PathLike[str], table: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """The config drive cloud-init would use, read as it reads it; None when no partition is labelled for one.

    When labelled partitions exist but none is readable (cloud-init then
    finds no datasource), the report names the first one and says why in
    ``error``. ``table`` saves re-reading the partition table when the
    caller already has it.
    """
    table = table if table is not None else read_partitions(disk_path)
    candidates = [
        p
        for p in table["partitions"]
        if "error" not in p and {p["label"], *p.get("labels", ())} & set(CONFIG_DRIVE_LABELS)
    ]
    if not candidates:
        return None
    candidates.sort(key=lambda p: str(p["number"]), reverse=True)  # cloud-init sorts /dev/sdaN names in reverse
    failures = []
    for part in candidates:
        base = {
            "partition": part["number"],
            "partition_uuid": part.get("uuid"),
            "filesystem": part.get("filesystem"),
            "count": len(candidates),
        }
        if part["filesystem"] not in READABLE:
            failures.append((base, f"partition {part['number']} holds {part['filesystem'] or 'no known'} file system"))
            continue
        try:
            return {**base, **_read_drive(disk_path, part)}
        except errors.ConfigDriveInvalid as exc:
            failures.append((base, f"partition {part['number']}: {exc.message}"))
    return {**failures[0][0], "error": "; ".join(reason for _, reason in failures)}


def inspect_disk(disk_path: str | os.PathLike[str]) -> dict[str, Any]:
    """Everything "booting the OS" finds: partition table, filesystems, config drive."""
    table = read_partitions(disk_path)
    table["config_drive"] = read_config_drive(disk_path, table) if table["partitions"] else None
    return table


def read_media_config_drive(media: Sequence[tuple[str, str | os.PathLike[str]]]) -> dict[str, Any] | None:
    """The config drive on attached whole devices (a virtual CD, USB stick or floppy), or None.

    cloud-init's ConfigDrive datasource looks for the ``config-2`` label on
    every block device, not only partitions: a drive handed over on virtual
    media is one. ``media`` is (device name, image file) in the order the
    machine lists its devices; the first labelled, readable one wins.
    """
    failures = []
    for device, path in media:
        with open(path, "rb") as fp:
            found = filesystems.probe(fp, 0)
        if not set(found.labels) & set(CONFIG_DRIVE_LABELS):
            continue
        base = {"device": device, "filesystem": found.kind}
        if found.kind not in READABLE:
            failures.append((base, f"{device} holds {found.kind or 'no known'} file system"))
            continue
        try:
            return {**base, **_read_drive(path, {"start": 0, "size": os.path.getsize(path), "filesystem": found.kind})}
        except errors.ConfigDriveInvalid as exc:
            failures.append((base, f"{device}: {exc.message}"))
    if not failures:
        return None
    return {**failures[0][0], "error": "; ".join(reason for _, reason in failures)}
