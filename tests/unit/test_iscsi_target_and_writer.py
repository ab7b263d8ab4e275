"""The two halves of the iSCSI deploy against each other, with the real tools:
the agent's ``IscsiTarget`` (tgtd) and the conductor's ``iscsi_writer``
(libiscsi inside qemu-img). No agent, api or database: just the wire.

- the image lands byte for byte, raw and qcow2, and the written size is checked
  against the LUN before anything is written;
- a wrong CHAP secret and a wrong initiator name are refused at login and the
  disk is unchanged;
- two targets run side by side; stop is idempotent and leaves no process;
- an image that names a backing file is refused before any login.
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
from pathlib import Path

import pytest

from services.agent.iscsi_target import IscsiTarget, TargetSpec
from services.common import errors
from services.common.images.configdrive import build_configdrive
from services.conductor import iscsi_configdrive, iscsi_writer
from services.conductor.iscsi_writer import IscsiLogin, chap_credentials
from services.demo_image import build_demo_image
from services.simulator.disk import inspect_disk

MiB = 1024 * 1024
UUID = "1be26c0b-03f2-4d2e-ae87-c02d7f33c123"
INITIATOR = "iqn.2026-11.io.ferrum:conductor.test"


def make_disk(path: Path, size: int = 64 * MiB) -> Path:
    with open(path, "wb") as f:
        f.truncate(size)
    return path


def spec_for(disk: Path, key: str = "deploy-key-1", initiator: str = INITIATOR) -> TargetSpec:
    user, password = chap_credentials(key, UUID)
    return TargetSpec(
        iqn=f"iqn.2008-10.org.openstack:{UUID}.{key[-1]}",
        backing_path=str(disk),
        chap_username=user,
        chap_password=password,
        initiator_iqn=initiator,
    )


def login_for(spec: TargetSpec, port: int, *, password: str = "", initiator_iqn: str = INITIATOR) -> IscsiLogin:
    return IscsiLogin(
        address="127.0.0.1",
        port=port,
        iqn=spec.iqn,
        username=spec.chap_username,
        password=password or spec.chap_password,
        initiator_iqn=initiator_iqn,
    )


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:
        return f.read().split()[2] != "Z"


def accepts(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex(("127.0.0.1", port)) == 0


async def test_raw_and_qcow2_land_byte_for_byte(tmp_path: Path) -> None:
    disk = make_disk(tmp_path / "disk.img")
    image = tmp_path / "image.raw"
    image.write_bytes(os.urandom(6 * MiB) + bytes(2 * MiB))
    target = IscsiTarget(spec_for(disk), work_dir=str(tmp_path))
    portal = await target.start()
    pid = target.pid
    assert pid is not None and alive(pid) and accepts(portal.port)
    try:
        with open(disk, "r+b") as f:  # a previous tenant's data where the image has zeroes
            f.seek(7 * MiB)
            f.write(b"OLD-TENANT" * 100)
        result = await iscsi_writer.write_image(image, login_for(target.spec, portal.port), declared_format="raw")
        assert (result.format, result.virtual_size, result.disk_size) == ("raw", 8 * MiB, 64 * MiB)
        assert disk.read_bytes()[: 8 * MiB] == image.read_bytes(), "the image's zeroes did not overwrite old data"

        qcow2 = tmp_path / "image.qcow2"
        other = tmp_path / "other.raw"
        other.write_bytes(os.urandom(3 * MiB))
        subprocess.run(["qemu-img", "convert", "-f", "raw", "-O", "qcow2", str(other), str(qcow2)], check=True)
        result = await iscsi_writer.write_image(qcow2, login_for(target.spec, portal.port))
        assert result.format == "qcow2"
        assert disk.read_bytes()[: 3 * MiB] == other.read_bytes()
    finally:
        await target.stop()
    assert not alive(pid) and not accepts(portal.port)
    await target.stop()  # twice is fine


async def test_wrong_secret_or_initiator_is_refused_and_changes_nothing(tmp_path: Path) -> None:
    disk = make_disk(tmp_path / "disk.img")
    image = tmp_path / "image.raw"
    image.write_bytes(os.urandom(MiB))
    target = IscsiTarget(spec_for(disk), work_dir=str(tmp_path))
    portal = await target.start()
    try:
        wrong_secret = login_for(target.spec, portal.port, password=chap_credentials("another-key", UUID)[1])
        with pytest.raises(errors.ImageError, match="Authentication failure"):
            await iscsi_writer.write_image(image, wrong_secret)
        wrong_initiator = login_for(target.spec, portal.port, initiator_iqn="iqn.2026-11.io.ferrum:intruder")
        with pytest.raises(errors.ImageError, match=r"Target not found|Logging in"):
            await iscsi_writer.write_image(image, wrong_initiator)
    finally:
        await target.stop()
    assert disk.read_bytes() == bytes(64 * MiB)


async def test_two_targets_side_by_side(tmp_path: Path) -> None:
    disks = [make_disk(tmp_path / f"disk{i}.img", 16 * MiB) for i in range(2)]
    targets = [IscsiTarget(spec_for(d, key=f"key-{i}"), work_dir=str(tmp_path)) for i, d in enumerate(disks)]
    portals = await asyncio.gather(*(t.start() for t in targets))
    try:
        assert portals[0].port != portals[1].port
        for i, (target, portal) in enumerate(zip(targets, portals, strict=True)):
            image = tmp_path / f"image{i}.raw"
            image.write_bytes(bytes([i + 1]) * MiB)
            await iscsi_writer.write_image(image, login_for(target.spec, portal.port))
            assert disks[i].read_bytes()[:MiB] == image.read_bytes()
    finally:
        await asyncio.gather(*(t.stop() for t in targets))


async def test_missing_disk_starts_nothing(tmp_path: Path) -> None:
    target = IscsiTarget(spec_for(tmp_path / "absent.img"), work_dir=str(tmp_path))
    with pytest.raises(errors.AgentError, match="No such file or directory"):
        await target.start()
    assert not target.running and target.pid is None


def test_chap_credentials_are_per_key_and_stable() -> None:
    assert chap_credentials("k1", UUID) == chap_credentials("k1", UUID)
    assert chap_credentials("k1", UUID)[1] != chap_credentials("k2", UUID)[1]
    user, secret = chap_credentials("k1", UUID)
    assert user == "ferrum-1be26c0b" and len(secret) == 16 and secret.replace("-", "").replace("_", "").isalnum()


async def test_an_image_with_a_backing_file_is_refused(tmp_path: Path) -> None:
    base = tmp_path / "conductor-secret.raw"
    base.write_bytes(b"secret" * 100)
    image = tmp_path / "evil.qcow2"
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", "-b", str(base), "-F", "raw", str(image)], check=True)
    with pytest.raises(errors.ImageFormatError, match="backing"):
        await iscsi_writer.image_facts(image)
    with pytest.raises(errors.ImageFormatError, match="says raw"):
        await iscsi_writer.image_facts(image, "raw")


async def test_config_drive_partition_written_over_iscsi(tmp_path: Path) -> None:
    """The conductor's shadow-file config drive: the LUN gets a config-2 GPT
    partition in its last 64 MiB holding the ISO, and the image's own
    partitions are kept."""
    disk = make_disk(tmp_path / "disk.img", 96 * MiB)
    image = build_demo_image(tmp_path / "img", size_mib=24, marker="shadow").path
    target = IscsiTarget(spec_for(disk), work_dir=str(tmp_path))
    portal = await target.start()
    try:
        login = login_for(target.spec, portal.port)
        written = await iscsi_writer.write_image(image, login)
        iso = build_configdrive(
            {"uuid": UUID, "name": "shadow"},
            [],
            {"meta_data": {"hostname": "shadow-host"}, "user_data": "#cloud-config\n"},
        )
        placement = await iscsi_configdrive.write_config_drive(login, iso, written.disk_size, work_dir=str(tmp_path))
    finally:
        await target.stop()
    assert placement.created and placement.table == "gpt"
    assert placement.start_byte >= 96 * MiB - 64 * MiB - MiB
    report = inspect_disk(disk)
    assert report["config_drive"]["hostname"] == "shadow-host", report
    assert len(report["partitions"]) == 2, report


@pytest.mark.parametrize("fmt", ["raw", "qcow2"])
async def test_a_large_image_is_written_by_several_sessions(tmp_path: Path, fmt: str) -> None:
    """Split into MiB-aligned ranges, one session each (forced here on a small
    image): the disk still equals the image, zeroes and an odd tail included."""
    disk = make_disk(tmp_path / "disk.img")
    with open(disk, "r+b") as f:  # old data everywhere the image has zeroes
        f.write(b"\xee" * (16 * MiB))
    raw = tmp_path / "image.raw"
    raw.write_bytes(os.urandom(3 * MiB) + bytes(4 * MiB) + os.urandom(MiB + 4096))
    image = raw
    if fmt == "qcow2":
        image = tmp_path / "image.qcow2"
        subprocess.run(["qemu-img", "convert", "-f", "raw", "-O", "qcow2", str(raw), str(image)], check=True)
    assert len(iscsi_writer.split_ranges(raw.stat().st_size, 4)) == 3  # 3 MiB steps: 3 + 3 + 2 MiB and 4 KiB
    target = IscsiTarget(spec_for(disk), work_dir=str(tmp_path))
    portal = await target.start()
    try:
        result = await iscsi_writer.write_image(
            image, login_for(target.spec, portal.port), sessions=4, split_min_bytes=1
        )
    finally:
        await target.stop()
    assert result.format == fmt
    assert disk.read_bytes()[: raw.stat().st_size] == raw.read_bytes()
