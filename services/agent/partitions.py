"""The partition facts ``standby.get_partition_uuids`` reports after a write.

For a whole-disk image IPA reports the disk identifier as ``root uuid`` (the
conductor only uses it to point the boot loader at the right disk) and the
EFI system partition if the image has one. ``sfdisk --json`` reads both GPT
and MBR tables from a plain file or a block device without needing the
kernel to re-read anything, which suits file-backed disks.
"""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

from services.agent.hardware import partition_device_name

ESP_TYPES = frozenset(("C12A7328-F81F-11D2-BA4B-00A0C93EC93B", "EF"))
PREP_TYPES = frozenset(("9E1A2D38-C612-4316-AA26-8B49521E5A8B", "41"))


async def read_partition_table(path: str) -> dict[str, Any] | None:
    """``sfdisk --json`` of the disk, or None when it has no partition table."""
    proc = await asyncio.create_subprocess_exec(
        "sfdisk", "--json", path, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, _ = await proc.communicate()
    if proc.returncode:
        return None
    try:
        return json.loads(out).get("partitiontable")
    except ValueError:
        return None


def describe(table: dict[str, Any] | None, device_name: str) -> dict[str, Any]:
    """IPA's result dict from a parsed table (pure: unit-testable)."""
    result: dict[str, Any] = {
        "root uuid": None,
        "efi system partition uuid": None,
        "PReP Boot partition uuid": None,
        "partitions": {},
        "label": None,
    }
    if not table:
        return result
    label = table.get("label")
    result["label"] = label
    disk_id = str(table.get("id") or "")
    result["root uuid"] = disk_id.lower() if label == "gpt" else (disk_id.lower() or None)
    for part in table.get("partitions") or []:
        match = re.search(r"(\d+)$", str(part.get("node", "")))
        number = int(match.group(1)) if match else 0
        ptype = str(part.get("type", "")).upper()
        if label == "dos":
            uuid = f"{disk_id.lower().removeprefix('0x')}-{number:02x}" if disk_id else None
        else:
            uuid = str(part.get("uuid", "")).lower() or None
        name = partition_device_name(device_name, number)
        result["partitions"][name] = {
            "uuid": uuid,
            "type": ptype.lower(),
            "start": part.get("start"),
            "size": part.get("size"),
            "name": part.get("name"),
        }
        if ptype in ESP_TYPES and result["efi system partition uuid"] is None:
            result["efi system partition uuid"] = uuid
        if ptype in PREP_TYPES and result["PReP Boot partition uuid"] is None:
            result["PReP Boot partition uuid"] = uuid
    return result


async def partition_uuids(path: str, device_name: str) -> dict[str, Any]:
    return describe(await read_partition_table(path), device_name)
