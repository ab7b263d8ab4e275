"""The partition facts ``standby.get_partition_uuids`` reports after a write.

For a whole-disk image IPA reports the disk identifier as ``root uuid`` (the
conductor only uses it to point the boot loader at the right disk) and the
EFI system partition if the image has one. The table is read by the shared
pure-Python reader (``services.common.images.partition_table``), the same one
the config-drive placement uses, on a plain file as well as on a block
device. The values are spelt the way IPA's ``sfdisk --json`` based code
spells them: GUIDs in lower case, MBR types as bare hex (``c``, ``ef``), an
MBR disk id as ``0x`` + 8 hex digits and its partitions' UUIDs as blkid's
``<disk id>-<number in hex>``.
"""

from __future__ import annotations

import asyncio
from typing import Any

from services.agent.hardware import partition_device_name
from services.common import errors
from services.common.images.partition_table import PartitionTable, read_partition_table, sector_size_of

ESP_TYPES = frozenset(("C12A7328-F81F-11D2-BA4B-00A0C93EC93B", "EF"))
PREP_TYPES = frozenset(("9E1A2D38-C612-4316-AA26-8B49521E5A8B", "41"))


def read_table(path: str) -> PartitionTable | None:
    """The disk's partition table, or None when it has none or it is corrupt (blocking)."""
    with open(path, "rb") as fp:
        try:
            return read_partition_table(fp, sector_size=sector_size_of(fp.fileno()))
        except errors.ImageFormatError:
            return None


def describe(table: PartitionTable | None, device_name: str) -> dict[str, Any]:
    """IPA's result dict from a parsed table (pure: unit-testable)."""
    result: dict[str, Any] = {
        "root uuid": None,
        "efi system partition uuid": None,
        "PReP Boot partition uuid": None,
        "partitions": {},
        "label": None,
    }
    if table is None:
        return result
    gpt = table.table == "gpt"
    result["label"] = "gpt" if gpt else "dos"
    result["root uuid"] = table.disk_id.lower() if gpt else f"0x{table.disk_id}"
    for part in table.partitions:
        ptype = part.type_id.upper() if gpt else f"{int(part.type_id, 16):X}"
        name = partition_device_name(device_name, part.number)
        result["partitions"][name] = {
            "uuid": part.uuid.lower() or None,
            "type": ptype.lower(),
            "start": part.start,
            "size": part.sectors,
            "name": (part.name or None) if gpt else None,
        }
        if ptype in ESP_TYPES and result["efi system partition uuid"] is None:
            result["efi system partition uuid"] = part.uuid.lower()
        if ptype in PREP_TYPES and result["PReP Boot partition uuid"] is None:
            result["PReP Boot partition uuid"] = part.uuid.lower()
    return result


async def partition_uuids(path: str, device_name: str) -> dict[str, Any]:
    return describe(await asyncio.to_thread(read_table, path), device_name)
