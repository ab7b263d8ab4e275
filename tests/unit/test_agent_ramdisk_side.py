"""What the agent does differently in a real ramdisk: parameters from one
reader, disks from sysfs, a forwarded callback port."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.agent.agent import Agent, Disk, options_from_kernel_cmdline
from services.agent.blockdevices import discover_disks
from services.agent.parameters import MAX_SOURCE_BYTES, read_parameters
from services.common import errors


def test_parameters_come_from_the_kernel_command_line(tmp_path: Path) -> None:
    cmdline = tmp_path / "cmdline"
    cmdline.write_bytes(b"console=ttyS0 ipa-api-url=http://10.0.2.2:6385 BOOTIF=01-52-54-00-12-34-56\n")
    text = read_parameters(kernel_cmdline=cmdline)
    options = options_from_kernel_cmdline(text, disks=(Disk(path="/dev/vda"),))
    assert options.api_url == "http://10.0.2.2:6385" and options.macs == ("52:54:00:12:34:56",)
    assert read_parameters(kernel_cmdline=None) == ""
    with pytest.raises(errors.InvalidParameterValue, match="cannot read agent parameters"):
        read_parameters(kernel_cmdline=tmp_path / "absent")
    huge = tmp_path / "huge"
    huge.write_bytes(b"a" * (MAX_SOURCE_BYTES + 1))
    with pytest.raises(errors.InvalidParameterValue, match="exceed"):
        read_parameters(kernel_cmdline=huge)


def test_advertised_port_is_what_a_port_forward_exposes() -> None:
    options = options_from_kernel_cmdline(
        "ipa-api-url=http://10.0.2.2:6385 BOOTIF=52:54:00:12:34:56 ipa-advertise-host=127.0.0.1 "
        "ipa-advertise-port=45001",
        disks=(Disk(path="/dev/vda"),),
        listen_host="0.0.0.0",
        listen_port=9999,
    )
    assert options.advertise_port == 45001
    assert Agent(options).callback_url == "http://127.0.0.1:45001"
    with pytest.raises(errors.InvalidParameterValue, match="ipa-advertise-port"):
        options_from_kernel_cmdline(
            "ipa-api-url=http://x BOOTIF=52:54:00:12:34:56 ipa-advertise-port=lots", disks=(Disk(path="/d"),)
        )


def _block(root: Path, name: str, sectors: int, **files: str) -> None:
    entry = root / name
    (entry / "queue").mkdir(parents=True)
    (entry / "device").mkdir()
    (entry / "size").write_text(f"{sectors}\n")
    for relative, text in files.items():
        path = entry / relative.replace("__", "/")
        path.write_text(text + "\n")


def test_disks_are_found_in_sysfs(tmp_path: Path) -> None:
    sys_block = tmp_path / "block"
    _block(sys_block, "vda", 1048576, serial="FERRUMSIM000001", queue__rotational="0")
    _block(sys_block, "sda", 2048, device__model="QEMU HARDDISK", device__wwid="naa.5000", queue__rotational="1")
    _block(sys_block, "loop0", 2048)
    _block(sys_block, "sr0", 2048)
    _block(sys_block, "vdb", 0)  # an empty drive holds nothing to deploy to
    disks = discover_disks(sys_block)
    assert disks == [
        Disk(path="/dev/sda", name="/dev/sda", serial="", wwn="naa.5000", model="QEMU HARDDISK", rotational=True),
        Disk(path="/dev/vda", name="/dev/vda", serial="FERRUMSIM000001", wwn="", model="", rotational=False),
    ]
    assert discover_disks(tmp_path / "no-sysfs") == []


def test_grpc_status_travels_without_importing_grpc_at_module_load() -> None:
    import grpc

    assert errors.NodeLocked("busy").grpc_code is grpc.StatusCode.ABORTED
    assert errors.FerrumError("x").grpc_status == "INTERNAL"
