"""The agent's ``get_partition_uuids`` facts, from the shared pure-Python reader, against ``sfdisk --json``.

The agent used to read the table with ``sfdisk --json``; it now uses the same
reader as the config-drive placement. ``sfdisk_describe`` below is the old
sfdisk-based code kept as the reference: on real tables made by sgdisk and
sfdisk both must give IPA's caller the very same dict.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from services.agent import partitions
from services.agent.hardware import partition_device_name

ESP_TYPES = partitions.ESP_TYPES
PREP_TYPES = partitions.PREP_TYPES


def sfdisk_describe(path: Path, device_name: str) -> dict[str, Any]:
    """What the agent reported when it read the table with ``sfdisk --json`` (the reference)."""
    done = subprocess.run(["sfdisk", "--json", str(path)], capture_output=True, text=True, check=False)
    table = json.loads(done.stdout).get("partitiontable") if done.returncode == 0 else None
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
        result["partitions"][partition_device_name(device_name, number)] = {
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


def blank(path: Path, size: int = 256 * 1024 * 1024) -> Path:
    with open(path, "wb") as fp:
        fp.truncate(size)
    return path


def run(*argv: str, stdin: str | None = None) -> None:
    subprocess.run(argv, input=stdin, text=True, capture_output=True, check=True)


LAYOUTS = {
    "gpt, ESP + named root + unnamed swap + PReP": lambda d: run(
        "sgdisk",
        "-n1:2048:+8M",
        "-t1:ef00",
        "-c1:EFI System",
        "-n2:0:+64M",
        "-c2:root",
        "-n3:0:+8M",
        "-t3:8200",
        "-n4:0:+1M",
        "-t4:4100",
        str(d),
    ),
    "gpt, entries out of order with a gap": lambda d: run(
        "sgdisk", "-n7:2048:+4M", "-n2:0:+4M", "-t2:ef00", "-c2:esp", str(d)
    ),
    "dos, primaries + extended with logicals, ESP": lambda d: run(
        "sfdisk",
        "-q",
        str(d),
        stdin="label: dos\nlabel-id: 0x1234abcd\n,8M,83\n,8M,c\n,,5\n,4M,83\n,4M,ef\n,4M,41\n",
    ),
    "dos, zero disk id, one partition in slot 3": lambda d: run(
        "sfdisk", "-q", str(d), stdin="label: dos\nlabel-id: 0x00000000\nstart=4096, size=8192, type=83\n"
    ),
    "no table": lambda d: None,
}


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_same_facts_as_sfdisk(tmp_path: Path, layout: str) -> None:
    disk = blank(tmp_path / "disk.img")
    LAYOUTS[layout](disk)
    ours = partitions.describe(partitions.read_table(str(disk)), "/dev/sda")
    assert ours == sfdisk_describe(disk, "/dev/sda")
    if layout != "no table":
        assert ours["root uuid"] and ours["partitions"]
    if "ESP" in layout:
        assert ours["efi system partition uuid"]


async def test_partition_uuids_on_nvme_names(tmp_path: Path) -> None:
    disk = blank(tmp_path / "disk.img")
    LAYOUTS["gpt, ESP + named root + unnamed swap + PReP"](disk)
    got = await partitions.partition_uuids(str(disk), "/dev/nvme0n1")
    assert sorted(got["partitions"]) == ["/dev/nvme0n1p1", "/dev/nvme0n1p2", "/dev/nvme0n1p3", "/dev/nvme0n1p4"]
    assert got["partitions"]["/dev/nvme0n1p2"]["name"] == "root"
    assert got["partitions"]["/dev/nvme0n1p3"]["name"] is None
    assert got["PReP Boot partition uuid"] == got["partitions"]["/dev/nvme0n1p4"]["uuid"]


def test_corrupt_gpt_is_no_table(tmp_path: Path) -> None:
    disk = blank(tmp_path / "disk.img", 16 * 1024 * 1024)
    run("sgdisk", "-n1:2048:+1M", str(disk))
    with open(disk, "r+b") as fp:
        fp.seek(512 + 40)
        fp.write(b"\xff\xff")  # inside the CRC-covered header
    assert partitions.read_table(str(disk)) is None
    assert partitions.describe(None, "/dev/sda")["root uuid"] is None
