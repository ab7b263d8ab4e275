"""config-2 placement on sparse disk files with the real tools (sgdisk, sfdisk, mtools,
genisoimage) and read back the way a booting machine would: find the partition,
extract the ISO, let Debian's cloud-init parse it."""

from __future__ import annotations

import hashlib
import io
import json
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from services.common import errors
from services.common.images import configdrive, iso9660
from services.common.images.configdrive_partition import (
    ConfigDrivePlacement,
    read_configdrive_partition,
    write_configdrive_partition,
)
from services.common.images.partition_table import PartitionTable, read_partition_table
from tests.unit.test_configdrive import KEY, NODE, PORTS, cloud_init_read

MiB = 1024 * 1024
TiB = 1024 * 1024 * MiB
BOOT_CODE = b"FERRUM-TEST-BOOTLOADER" * 20  # 440 bytes of "GRUB" in the MBR code area

CONTENTS = {
    "meta_data": {"hostname": "disk-host", "public_keys": {"0": KEY}},
    "user_data": "#cloud-config\nfinal_message: config-2 found\n",
}


@pytest.fixture
def work() -> Iterator[Path]:
    """A scratch directory removed right after the test (disk images are big, if sparse)."""
    with tempfile.TemporaryDirectory(prefix="ferrum-cd-") as tmp:
        yield Path(tmp)


def run(*argv: str, stdin: str | None = None) -> str:
    done = subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, f"{argv}: {done.stderr}"
    return done.stdout


def stamp_boot_code(path: Path) -> None:
    with open(path, "r+b") as fp:
        fp.write(BOOT_CODE[:440])


def gpt_image(path: Path, image_mib: int, extra: list[str] | None = None) -> None:
    """An OS image: ESP + root filling the image, GPT with its backup at the image's end."""
    path.unlink(missing_ok=True)
    run("truncate", "-s", f"{image_mib}M", str(path))
    run(
        "sgdisk",
        "-n",
        "1:2048:+8M",
        "-t",
        "1:ef00",
        "-c",
        "1:EFI",
        *(extra or ["-n", "2:0:0"]),
        "-c",
        "2:root",
        str(path),
    )
    stamp_boot_code(path)


def mbr_image(path: Path, image_mib: int, layout: str) -> None:
    path.unlink(missing_ok=True)
    run("truncate", "-s", f"{image_mib}M", str(path))
    run("sfdisk", "-q", "--no-reread", "--no-tell-kernel", str(path), stdin="label: dos\n" + layout)
    stamp_boot_code(path)


def table_of(disk: Path) -> PartitionTable:
    with open(disk, "rb") as fp:
        return read_partition_table(fp)


def grow(path: Path, size: int) -> None:
    """The image was written to a bigger disk."""
    run("truncate", "-s", str(size), str(path))


def the_drive() -> bytes:
    return configdrive.build_configdrive(NODE, PORTS, CONTENTS)


def assert_cloud_init_reads(disk: Path, tmp: Path) -> dict[str, Any]:
    """Find config-2 on the disk, extract its files, run cloud-init's reader on them."""
    part, iso = read_configdrive_partition(disk)
    # cloud-init finds the device with blkid's LABEL=config-2; probe the partition the same way
    probe = run("blkid", "-p", "-o", "export", "-O", str(part.start * 512), str(disk))
    assert "LABEL=config-2" in probe.splitlines() and "TYPE=iso9660" in probe.splitlines(), probe
    dest = tmp / "extracted"
    iso9660.extract_iso(io.BytesIO(iso), dest)
    v2 = cloud_init_read(dest)["v2"]
    assert v2["metadata"]["uuid"] == NODE["uuid"]
    assert v2["metadata"]["local-hostname"] == "disk-host"
    assert v2["metadata"]["public_keys"] == {"0": KEY}
    assert v2["userdata"] == CONTENTS["user_data"]
    assert {link["ethernet_mac_address"] for link in v2["networkdata"]["links"]} == {
        "52:54:00:aa:bb:01",
        "52:54:00:aa:bb:02",
    }
    return v2


def sgdisk_verify(disk: Path) -> str:
    out = run("sgdisk", "-v", str(disk))
    assert "No problems found" in out, out
    return out


def sfdisk_json(disk: Path) -> dict[str, Any]:
    return json.loads(run("sfdisk", "--json", str(disk)))["partitiontable"]


def fingerprint(disk: Path) -> str:
    """Hash of the places a refused plan must not touch: both ends and the size."""
    size = disk.stat().st_size
    with open(disk, "rb") as fp:
        head = fp.read(4 * MiB)
        fp.seek(max(0, size - 4 * MiB))
        tail = fp.read()
    return hashlib.sha256(head + tail + str(size).encode()).hexdigest()


def test_gpt_image_on_bigger_disk(work: Path) -> None:
    disk = work / "disk.img"
    gpt_image(disk, 100)
    grow(disk, 300 * MiB)
    iso = the_drive()
    placement = write_configdrive_partition(disk, iso)

    disk_sectors = 300 * MiB // 512
    assert placement == ConfigDrivePlacement(
        table="gpt",
        partition_number=3,
        start_byte=236 * MiB,
        size_bytes=(disk_sectors - 33) * 512 - 236 * MiB,
        created=True,
    )
    assert placement.start_byte >= 300 * MiB - 64 * MiB
    out = sgdisk_verify(disk)  # backup header moved: no complaint
    assert "secondary header" not in out
    info = run("sgdisk", "-i", "3", str(disk))
    assert "Partition name: 'config-2'" in info
    assert f"First sector: {placement.start_byte // 512} " in info
    table = table_of(disk)
    assert table.backup_lba == disk_sectors - 1 and table.last_usable == disk_sectors - 34
    with open(disk, "rb") as fp:
        fp.seek((disk_sectors - 1) * 512)
        assert fp.read(8) == b"EFI PART"
        assert fp.seek(0) == 0 and fp.read(440) == BOOT_CODE[:440]
        fp.seek(placement.start_byte)
        assert fp.read(len(iso)) == iso
    assert [(p.number, p.name) for p in table.partitions] == [(1, "EFI"), (2, "root"), (3, "config-2")]
    assert_cloud_init_reads(disk, work)


def test_mbr_image_gets_a_primary_at_the_end(work: Path) -> None:
    disk = work / "disk.img"
    mbr_image(disk, 100, "start=2048, size=16384, type=83, bootable\nstart=18432, type=83\n")
    grow(disk, 257 * MiB + 512 * 7)  # not a whole number of MiB
    placement = write_configdrive_partition(disk, the_drive())

    sectors = disk.stat().st_size // 512
    start = (sectors - 64 * 2048) // 2048 * 2048
    assert placement == ConfigDrivePlacement(
        table="mbr", partition_number=3, start_byte=start * 512, size_bytes=(sectors - start) * 512, created=True
    )
    parts = sfdisk_json(disk)["partitions"]
    assert [(p["start"], p["size"], p["type"]) for p in parts] == [
        (2048, 16384, "83"),
        (18432, 100 * 2048 - 18432, "83"),
        (start, sectors - start, "c"),
    ]
    assert parts[0].get("bootable") is True
    with open(disk, "rb") as fp:
        assert fp.read(440) == BOOT_CODE[:440]
    assert_cloud_init_reads(disk, work)


def test_existing_gpt_config2_partition_is_reused(work: Path) -> None:
    disk = work / "disk.img"
    gpt_image(disk, 100, ["-n", "2:0:+60M", "-n", "3:0:+4M", "-c", "3:config-2"])
    grow(disk, 200 * MiB)
    before = table_of(disk)
    placement = write_configdrive_partition(disk, the_drive())
    assert placement.created is False and placement.partition_number == 3
    assert placement.start_byte == before.partitions[2].start * 512 and placement.size_bytes == 4 * MiB
    after = table_of(disk)
    assert [(p.number, p.start, p.sectors) for p in after.partitions] == [
        (p.number, p.start, p.sectors) for p in before.partitions
    ]
    sgdisk_verify(disk)  # backup header moved anyway, as IPA does
    assert_cloud_init_reads(disk, work)
    again = write_configdrive_partition(disk, the_drive())  # a rebuild finds ours and reuses it
    assert again == placement


@pytest.mark.parametrize("fs", ["vfat", "iso9660"])
def test_existing_mbr_partition_labelled_by_filesystem_is_reused(work: Path, fs: str) -> None:
    disk = work / "disk.img"
    mbr_image(disk, 100, "start=2048, size=81920, type=83\nstart=83968, size=32768, type=c\n")
    offset = 83968 * 512
    if fs == "vfat":
        run("mformat", "-i", f"{disk}@@{offset}", "-T", "32768", "-h", "64", "-s", "32", "-v", "CONFIG-2", "::")
    else:
        src = work / "src"
        (src / "openstack/latest").mkdir(parents=True)
        (src / "openstack/latest/meta_data.json").write_text('{"uuid": "old"}')
        old = work / "old.iso"
        run("genisoimage", "-quiet", "-J", "-r", "-V", "config-2", "-o", str(old), str(src))
        with open(disk, "r+b") as fp:
            fp.seek(offset)
            fp.write(old.read_bytes())
    grow(disk, 400 * MiB)
    placement = write_configdrive_partition(disk, the_drive())
    assert placement == ConfigDrivePlacement(
        table="mbr", partition_number=2, start_byte=offset, size_bytes=16 * MiB, created=False
    )
    assert len(sfdisk_json(disk)["partitions"]) == 2
    assert_cloud_init_reads(disk, work)


def test_two_config2_partitions_refused_and_disk_untouched(work: Path) -> None:
    disk = work / "disk.img"
    gpt_image(disk, 100, ["-n", "2:0:+60M", "-n", "3:0:+4M", "-c", "3:config-2", "-n", "4:0:+4M", "-c", "4:CONFIG-2"])
    grow(disk, 300 * MiB)
    before = fingerprint(disk)
    with pytest.raises(errors.ConfigDriveError, match=r"more than one partition labelled config-2.*3.*4"):
        write_configdrive_partition(disk, the_drive())
    assert fingerprint(disk) == before


def test_mbr_with_four_primaries_refused_naming_the_cause(work: Path) -> None:
    disk = work / "disk.img"
    mbr_image(
        disk,
        100,
        "start=2048, size=20480, type=83\nstart=22528, size=20480, type=83\n"
        "start=43008, size=20480, type=82\nstart=63488, size=20480, type=83\n",
    )
    grow(disk, 300 * MiB)
    before = fingerprint(disk)
    with pytest.raises(errors.ConfigDriveError, match="all four primary partition slots") as caught:
        write_configdrive_partition(disk, the_drive())
    assert "1 (type 83)" in caught.value.message and "3 (type 82)" in caught.value.message
    assert fingerprint(disk) == before


def test_disk_barely_larger_than_the_image(work: Path) -> None:
    """The last 64 MiB overlap the image's root: the drive goes right after it instead."""
    disk = work / "disk.img"
    gpt_image(disk, 100)
    grow(disk, 102 * MiB)
    placement = write_configdrive_partition(disk, the_drive())
    root_end = table_of(disk).partitions[1].end
    assert placement.created and placement.partition_number == 3
    assert placement.start_byte == 100 * MiB > root_end * 512
    assert placement.start_byte + placement.size_bytes == (102 * MiB // 512 - 33) * 512
    sgdisk_verify(disk)
    assert_cloud_init_reads(disk, work)

    mbr = work / "mbr.img"
    mbr_image(mbr, 100, "start=2048, type=83\n")
    grow(mbr, 101 * MiB)
    placement = write_configdrive_partition(mbr, the_drive())
    assert (placement.start_byte, placement.size_bytes) == (100 * MiB, 1 * MiB)
    assert_cloud_init_reads(mbr, work / "mbr")


def test_no_room_at_all_is_refused(work: Path) -> None:
    disk = work / "disk.img"
    gpt_image(disk, 100)  # root fills the disk
    before = fingerprint(disk)
    with pytest.raises(errors.ConfigDriveError, match=r"no room for the config drive.*partition\(s\) 2"):
        write_configdrive_partition(disk, the_drive())
    assert fingerprint(disk) == before


def test_drive_larger_than_existing_partition_refused(work: Path) -> None:
    disk = work / "disk.img"
    gpt_image(disk, 100, ["-n", "2:0:+60M", "-n", "3:0:+1M", "-c", "3:config-2"])
    big = configdrive.build_configdrive(NODE, PORTS, {"user_data": "x" * (2 * MiB)})
    before = fingerprint(disk)
    with pytest.raises(errors.ConfigDriveError, match="larger than the existing config-2 partition 3"):
        write_configdrive_partition(disk, big)
    assert fingerprint(disk) == before


def test_mbr_disk_over_2_tib_places_it_below_the_limit(work: Path) -> None:
    disk = work / "huge.img"
    mbr_image(disk, 100, "start=2048, type=83\n")
    grow(disk, 3 * TiB)  # sparse: costs no space
    iso_path = work / "drive.iso"
    iso_path.write_bytes(the_drive())
    placement = write_configdrive_partition(disk, iso_path)  # a path works as well as bytes
    assert placement == ConfigDrivePlacement(
        table="mbr", partition_number=2, start_byte=2097087 * MiB, size_bytes=64 * MiB, created=True
    )
    assert placement.start_byte + placement.size_bytes <= 2 * TiB - MiB
    parts = sfdisk_json(disk)["partitions"]
    assert (parts[1]["start"], parts[1]["size"]) == (2097087 * 2048, 64 * 2048)
    assert_cloud_init_reads(disk, work)


def test_disk_without_partition_table_refused(work: Path) -> None:
    disk = work / "raw.img"
    run("truncate", "-s", "10M", str(disk))
    with pytest.raises(errors.ConfigDriveError, match="no partition table"):
        write_configdrive_partition(disk, the_drive())


def test_not_an_iso_refused(work: Path) -> None:
    disk = work / "disk.img"
    gpt_image(disk, 100)
    with pytest.raises(errors.ConfigDriveError, match="neither an ISO9660 image nor a VFAT image"):
        write_configdrive_partition(disk, b"\0" * 40_000)


def test_vfat_drive_is_written_and_read_back(work: Path) -> None:
    """Nova's config_drive_format=vfat: the FAT image goes into the config-2 partition as
    it is, and a booting machine finds and reads it there."""
    from services.common.images import configdrive_reader
    from tests.unit.test_configdrive import vfat_drive

    disk = work / "disk.img"
    gpt_image(disk, 100)
    run("truncate", "-s", "200M", str(disk))
    drive = vfat_drive(work)
    placement = write_configdrive_partition(disk, drive)
    assert placement.created
    part, found = read_configdrive_partition(disk)
    assert part.number == placement.partition_number and found == drive
    assert configdrive_reader.read_configdrive(found).hostname == "vfat-host"


def test_logical_partition_with_ext4_label_is_reused(work: Path) -> None:
    """An extended partition filling the image; the config-2 one is logical (number 5), ext4-labelled."""
    disk = work / "disk.img"
    mbr_image(
        disk,
        100,
        "start=2048, size=40960, type=83\nstart=43008, type=5\n"
        "start=45056, size=20480, type=83\nstart=67584, size=40960, type=83\n",
    )
    run("mke2fs", "-q", "-t", "ext4", "-L", "config-2", "-E", f"offset={45056 * 512}", str(disk), "10M")
    grow(disk, 200 * MiB)
    placement = write_configdrive_partition(disk, the_drive())
    assert placement == ConfigDrivePlacement(
        table="mbr", partition_number=5, start_byte=45056 * 512, size_bytes=10 * MiB, created=False
    )
    assert_cloud_init_reads(disk, work)


def test_fat32_label_and_no_label_partitions_probed(work: Path) -> None:
    disk = work / "disk.img"
    mbr_image(disk, 100, "start=2048, size=81920, type=c\nstart=83968, size=20480, type=83\n")
    run(
        "mformat",
        "-i",
        f"{disk}@@{2048 * 512}",
        "-F",
        "-c",
        "1",
        "-T",
        "81920",
        "-h",
        "64",
        "-s",
        "32",
        "-v",
        "config-2",
        "::",
    )
    table = table_of(disk)
    assert [p.labels for p in table.partitions] == [("CONFIG-2", "config-2"), ()]
    assert table.free_slots == (3, 4)
    placement = write_configdrive_partition(disk, the_drive())
    assert (placement.partition_number, placement.created) == (1, False)
    assert table_of(disk).partitions[0].labels == ("config-2",)  # now the ISO


def test_image_larger_than_disk_and_corrupt_gpt_refused(work: Path) -> None:
    disk = work / "disk.img"
    gpt_image(disk, 100)
    run("truncate", "-s", f"{90 * MiB}", str(disk))  # the disk is smaller than the image
    with pytest.raises(errors.ConfigDriveError, match="image is larger than the disk"):
        write_configdrive_partition(disk, the_drive())
    gpt_image(disk, 100)
    grow(disk, 200 * MiB)
    with open(disk, "r+b") as fp:  # flip a byte of the primary GPT header
        fp.seek(512 + 40)
        fp.write(b"\xff")
    before = fingerprint(disk)
    with pytest.raises(errors.ConfigDriveError, match="primary GPT header is corrupt"):
        write_configdrive_partition(disk, the_drive())
    assert fingerprint(disk) == before
