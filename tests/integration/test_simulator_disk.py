"""The simulator's disk readers on partition tables made by the real tools
(sgdisk, sfdisk) and config drives made by genisoimage and pycdlib."""

from __future__ import annotations

import io
import json
import subprocess
from pathlib import Path
from typing import Any

import pycdlib

from services.common.images import fat, iso9660
from services.simulator.disk import inspect_disk, read_config_drive, read_partitions


def blank(path: Path, size: int = 32 * 1024**2) -> Path:
    with open(path, "wb") as fp:
        fp.truncate(size)
    return path


def pycdlib_config_drive(meta: dict[str, object], user_data: bytes | None) -> bytes:
    """A config-2 ISO as Ferrum's builder makes them: Rock Ridge + Joliet, openstack/<version>/."""
    iso = pycdlib.PyCdlib()
    iso.new(interchange_level=4, joliet=3, rock_ridge="1.09", vol_ident="config-2")
    iso.add_directory("/OPENSTAC", rr_name="openstack", joliet_path="/openstack")
    for version in ("2012-08-10", "2018-08-27"):
        short = "/OPENSTAC/" + version.replace("-", "")[:8]
        iso.add_directory(short, rr_name=version, joliet_path=f"/openstack/{version}")
        payload = json.dumps({**meta, "version": version}).encode()
        iso.add_fp(
            io.BytesIO(payload),
            len(payload),
            f"{short}/META_DAT.JSO;1",
            rr_name="meta_data.json",
            joliet_path=f"/openstack/{version}/meta_data.json",
        )
        if user_data is not None:
            iso.add_fp(
                io.BytesIO(user_data),
                len(user_data),
                f"{short}/USER_DAT.;1",
                rr_name="user_data",
                joliet_path=f"/openstack/{version}/user_data",
            )
    out = io.BytesIO()
    iso.write_fp(out)
    iso.close()
    return out.getvalue()


def sfdisk(disk: Path, script: str) -> list[dict[str, Any]]:
    subprocess.run(["sfdisk", "-q", str(disk)], input=script, text=True, check=True, capture_output=True)
    return json.loads(
        subprocess.run(["sfdisk", "--json", str(disk)], check=True, capture_output=True, text=True).stdout
    )["partitiontable"]["partitions"]


def test_empty_disk_has_no_table(tmp_path: Path) -> None:
    disk = blank(tmp_path / "d.img")
    assert read_partitions(disk)["table"] is None
    assert read_config_drive(disk) is None
    assert inspect_disk(disk)["partitions"] == []


def test_gpt_from_sgdisk(tmp_path: Path) -> None:
    disk = blank(tmp_path / "d.img")
    subprocess.run(
        [
            "sgdisk",
            "-n1:2048:+1M",
            "-t1:ef00",
            "-c1:EFI System",
            "-n2:0:+8M",
            "-t2:8300",
            "-c2:root",
            "-n3:0:+2M",
            "-t3:8200",
            str(disk),
        ],
        check=True,
        capture_output=True,
    )
    listed = json.loads(
        subprocess.run(["sfdisk", "--json", str(disk)], check=True, capture_output=True, text=True).stdout
    )["partitiontable"]
    table = read_partitions(disk)
    assert table["table"] == "gpt" and table["disk_guid"] == listed["id"].lower()
    assert [(p["number"], p["type"], p["name"]) for p in table["partitions"]] == [
        (1, "efi", "EFI System"),
        (2, "linux", "root"),
        (3, "linux_swap", ""),
    ]
    for ours, theirs in zip(table["partitions"], listed["partitions"], strict=True):
        assert ours["start"] == theirs["start"] * 512 and ours["size"] == theirs["size"] * 512
        assert ours["uuid"] == theirs["uuid"].lower()
    assert read_config_drive(disk) is None


def test_mbr_with_logical_partitions_and_a_labelled_config_drive(tmp_path: Path) -> None:
    """MBR has no partition names: the config drive is found by its ISO label, in a logical partition."""
    disk = blank(tmp_path / "d.img")
    parts = sfdisk(disk, "label: dos\nlabel-id: 0x1234abcd\n,4M,83\n,4M,83\n,,5\n,2M,83\n,4M,83\n")
    iso = pycdlib_config_drive(
        {"uuid": "node-uuid-1", "name": "fallback-name", "public_keys": {"a": "ssh-rsa K"}}, b"\xff\xfebinary"
    )
    config = parts[-1]
    assert config["size"] * 512 >= len(iso)
    with open(disk, "r+b") as fp:
        fp.seek(config["start"] * 512)
        fp.write(iso)
    table = read_partitions(disk)
    assert table["table"] == "mbr" and table["disk_guid"] == "0x1234abcd"
    assert [p["number"] for p in table["partitions"]] == [1, 2, 5, 6]
    assert [p["start"] // 512 for p in table["partitions"]] == [p["start"] for p in parts if p["type"] != "5"]
    assert table["partitions"][3]["uuid"] == "1234abcd-06"
    drive = read_config_drive(disk)
    assert drive is not None and drive["partition"] == 6 and drive["version"] == "2018-08-27"
    assert drive["uuid"] == "node-uuid-1"
    assert drive["hostname"] is None  # cloud-init's local-hostname comes from "hostname" only, never "name"
    assert drive["public_keys"] == ["ssh-rsa K"]
    assert drive["user_data"] == {"base64": "//5iaW5hcnk="}  # binary user data survives
    assert drive["network_data"] is None


def test_a_gpt_name_alone_is_not_a_config_drive(tmp_path: Path) -> None:
    """cloud-init looks for a file-system label; a partition merely named config-2 is not found."""
    disk = blank(tmp_path / "d.img")
    subprocess.run(["sgdisk", "-n1:2048:+2M", "-c1:config-2", str(disk)], check=True, capture_output=True)
    assert read_partitions(disk)["partitions"][0]["name"] == "config-2"
    assert read_config_drive(disk) is None


def test_a_labelled_file_system_cloud_init_would_mount_but_we_cannot_read(tmp_path: Path) -> None:
    disk = blank(tmp_path / "d.img")
    subprocess.run(["sgdisk", "-n1:2048:+4M", str(disk)], check=True, capture_output=True)
    fs = tmp_path / "fs.img"
    blank(fs, 4 * 1024**2)
    subprocess.run(["mkfs.ext4", "-q", "-F", "-L", "config-2", str(fs)], check=True, capture_output=True)
    write_at(disk, 2048 * 512, fs.read_bytes())
    drive = read_config_drive(disk)
    assert drive is not None and drive["partition"] == 1 and drive["filesystem"] == "ext"
    assert "holds ext file system" in drive["error"]


def write_at(disk: Path, offset: int, data: bytes) -> None:
    with open(disk, "r+b") as fp:
        fp.seek(offset)
        fp.write(data)


def test_cloud_init_order_and_the_first_readable_drive_wins(tmp_path: Path) -> None:
    """Two labelled partitions: cloud-init tries sda2 before sda10 (names sorted in reverse)
    and skips a broken drive; the newest dated version is read, not "latest"."""
    disk = blank(tmp_path / "d.img", 64 * 1024**2)
    script = [f"-n{n}:0:+3M" for n in range(1, 11)]
    subprocess.run(["sgdisk", *script, str(disk)], check=True, capture_output=True)
    parts = {p["number"]: p for p in read_partitions(disk)["partitions"]}
    broken = iso9660.write_iso({"openstack/latest/meta_data.json": b'{"hostname": "no uuid"}'}, label="config-2")
    good = iso9660.write_iso(
        {
            "openstack/2012-08-10/meta_data.json": json.dumps({"uuid": "u10", "hostname": "dated"}).encode(),
            "openstack/latest/meta_data.json": json.dumps({"uuid": "u10", "hostname": "latest"}).encode(),
            "openstack/2012-08-10/vendor_data.json": b'{"v": 1}',
        },
        label="config-2",
    )
    write_at(disk, parts[2]["start"], broken)
    write_at(disk, parts[10]["start"], good)
    drive = read_config_drive(disk)
    assert drive is not None and drive["partition"] == 10 and drive["count"] == 2
    assert drive["version"] == "2012-08-10" and drive["hostname"] == "dated"
    assert drive["vendor_data"] == {"v": 1} and drive["vendor_data2"] is None
    write_at(disk, parts[2]["start"], good)
    again = read_config_drive(disk)
    assert again is not None and again["partition"] == 2  # now sda2 reads, and it comes first
    write_at(disk, parts[2]["start"], broken)
    write_at(disk, parts[10]["start"], broken)
    drive = read_config_drive(disk)
    assert drive is not None and "No 'uuid'" in drive["error"] and "partition 10" in drive["error"]


def test_vfat_config_drive_is_read(tmp_path: Path) -> None:
    """cloud-init mounts vfat config drives too; names are matched without regard to case."""
    disk = blank(tmp_path / "d.img")
    subprocess.run(["sgdisk", "-n1:2048:+4M", str(disk)], check=True, capture_output=True)
    image = fat.write_image(
        {
            "OPENSTACK/LATEST/META_DATA.JSON": json.dumps({"uuid": "fat-uuid", "hostname": "fat-host"}).encode(),
            "openstack/latest/user_data": b"#cloud-config\n",
        },
        label="config-2",
        size=4 * 1024**2,
    )
    write_at(disk, 2048 * 512, image)
    drive = read_config_drive(disk)
    assert drive is not None and drive["filesystem"] == "vfat"
    assert drive["uuid"] == "fat-uuid" and drive["hostname"] == "fat-host" and drive["version"] == "latest"
    assert drive["user_data"] == "#cloud-config\n"


def test_corrupt_gpt_header_is_a_finding_not_a_crash(tmp_path: Path) -> None:
    disk = blank(tmp_path / "d.img")
    subprocess.run(["sgdisk", "-n1:2048:+1M", str(disk)], check=True, capture_output=True)
    write_at(disk, 512 + 80, (10**6).to_bytes(4, "little"))  # the entry count, under the header CRC
    table = read_partitions(disk)
    assert table["table"] == "gpt" and table["partitions"] == [] and "corrupt" in table["error"]
    assert read_config_drive(disk) is None


def test_partition_beyond_the_end_is_reported(tmp_path: Path) -> None:
    disk = blank(tmp_path / "d.img", 8 * 1024**2)
    sfdisk(disk, "label: dos\n,4M,83\n")
    with open(disk, "r+b") as fp:  # the disk shrank under its table (a smaller image written over it)
        fp.truncate(1024**2)  # the partition started at 1 MiB
    part = read_partitions(disk)["partitions"][0]
    assert part["number"] == 1 and part["filesystem"] == "" and "beyond" in part["error"]
