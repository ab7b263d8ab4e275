"""The partition image layout shared by the ``direct`` and ``iscsi`` deploys:
Ironic's order and sizes, refusals that name the problem, and tables that
the shared reader (and sfdisk) read back as planned."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from services.common import errors
from services.common.images import partition_layout
from services.common.images.partition_layout import PartitionSizes, plan

MiB = 1024 * 1024
GiB = 1024 * MiB


def test_ironic_order_root_last_and_aligned() -> None:
    sizes = PartitionSizes.from_instance_info(
        {"root_gb": 2, "swap_mb": 512, "ephemeral_gb": 1, "configdrive": "H4sI..."}
    )
    layout = plan(sizes, 8 * GiB)
    assert [(p.role, p.number) for p in layout.partitions] == [
        ("ephemeral", 1),
        ("swap", 2),
        ("configdrive", 3),
        ("root", 4),
    ]
    assert [p.start % MiB for p in layout.partitions] == [0, 0, 0, 0]
    root = layout.role("root")
    assert root is not None and root.size == 2 * GiB and layout.label == "msdos"


def test_refusals_name_the_problem() -> None:
    with pytest.raises(errors.InvalidParameterValue, match="root_gb"):
        PartitionSizes.from_instance_info({"swap_mb": 64})
    with pytest.raises(errors.InvalidParameterValue, match="ephemeral_format"):
        PartitionSizes.from_instance_info({"root_gb": 1, "ephemeral_format": "ntfs"})
    with pytest.raises(errors.InvalidParameterValue, match="whole number"):
        PartitionSizes.from_instance_info({"root_gb": "lots"})
    with pytest.raises(errors.InvalidParameterValue, match="disk_label"):
        PartitionSizes.from_instance_info({"root_gb": 1, "capabilities": {"disk_label": "bsd"}})
    with pytest.raises(errors.InvalidParameterValue, match="need 3137 MiB"):
        plan(PartitionSizes.from_instance_info({"root_gb": 2, "ephemeral_gb": 1, "swap_mb": 64}), 2 * GiB)


@pytest.mark.parametrize("label", ["msdos", "gpt"])
def test_table_reads_back_as_planned(tmp_path: Path, label: str) -> None:
    disk = tmp_path / "disk.img"
    with open(disk, "wb") as f:
        f.truncate(3 * GiB)
    sizes = PartitionSizes.from_instance_info(
        {"root_gb": 1, "swap_mb": 64, "ephemeral_mb": 256, "configdrive": "x", "capabilities": {"disk_label": label}}
    )
    layout = plan(sizes, 3 * GiB)
    partition_layout.write_table(str(disk), layout)
    found = json.loads(subprocess.run(["sfdisk", "--json", str(disk)], capture_output=True, check=True).stdout)
    table = found["partitiontable"]
    assert table["label"] == ("gpt" if label == "gpt" else "dos")
    got = [(p["start"] * 512, p["size"] * 512) for p in table["partitions"]]
    assert got == [(p.start, p.size) for p in layout.partitions]
    if label == "gpt":
        assert [p.get("name") for p in table["partitions"]] == ["ephemeral", "swap", "config-2", "root"]


def test_filesystems_are_made_sparse_and_their_extents_found(tmp_path: Path) -> None:
    swap = tmp_path / "swap"
    partition_layout.make_filesystem(str(swap), 64 * MiB, "swap")
    extents = partition_layout.data_extents(str(swap))
    assert extents and extents[0][0] == 0 and sum(n for _, n in extents) < MiB
    ext4 = tmp_path / "ephemeral"
    partition_layout.make_filesystem(str(ext4), 256 * MiB, "ephemeral", "ext4")
    written = sum(n for _, n in partition_layout.data_extents(str(ext4)))
    assert 0 < written < 64 * MiB, written  # the extents mkfs wrote, not the whole partition
    blkid = subprocess.run(
        ["blkid", "-p", "-o", "export", str(ext4)], capture_output=True, text=True, check=True
    ).stdout
    assert "TYPE=ext4" in blkid and "LABEL=ephemeral0" in blkid
