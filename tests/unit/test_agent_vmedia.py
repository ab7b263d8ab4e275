"""The agent reads its parameters from the ir-vfd-dev floppy after a virtual-media boot (IPA's rules)."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.agent import vmedia
from services.agent.agent import Disk, options_from_kernel_cmdline
from services.common.images import fat, floppy

UUID = "3d2c8a52-70f5-4f7a-9d61-0c1b2a3f4e55"
PARAMS = {
    "ipa-api-url": "http://192.0.2.10:6385",
    "ipa-node-uuid": UUID,
    "ipa-agent-token": "tok-from-the-floppy",
    "BOOTIF": "52:54:00:aa:bb:02",
}


@pytest.fixture(scope="module")
def floppy_image() -> bytes:
    return floppy.create_vfat_image(PARAMS)


def test_options_come_from_the_floppy_when_booted_from_virtual_media(floppy_image: bytes) -> None:
    found = vmedia.image_parameters([b"\0" * 4096, floppy_image])  # the first medium is not it
    assert found == PARAMS
    line = "BOOT_IMAGE=/vmlinuz initrd=/initrd text nofb boot_method=vmedia ipa-agent-token=stale --"
    options = options_from_kernel_cmdline(line, floppy_parameters=found, disks=(Disk("/dev/null"),))
    assert options.api_url == "http://192.0.2.10:6385"
    assert options.node_uuid == UUID
    assert options.agent_token == "tok-from-the-floppy"  # the floppy wins over the command line
    assert options.macs == ("52:54:00:aa:bb:02",)


def test_without_boot_method_vmedia_the_floppy_is_ignored() -> None:
    line = "ipa-api-url=http://192.0.2.99:6385 BOOTIF=52:54:00:aa:bb:01"
    assert not vmedia.wants_floppy(line)
    options = options_from_kernel_cmdline(line, floppy_parameters=PARAMS, disks=(Disk("/dev/null"),))
    assert options.api_url == "http://192.0.2.99:6385" and options.agent_token == ""


def test_the_device_is_found_by_label_in_any_case(tmp_path: Path, floppy_image: bytes) -> None:
    upper = tmp_path / "sdb"
    upper.write_bytes(fat.write_image({"parameters.txt": b"ipa-agent-token=upper"}, label="IR-VFD-DEV"))
    other = tmp_path / "sda"
    other.write_bytes(fat.write_image({"parameters.txt": b"ipa-agent-token=wrong"}, label="config-2"))
    missing = tmp_path / "sr0"  # a device that cannot be read is skipped
    assert vmedia.find_floppy([missing, other, upper]) == upper
    assert vmedia.machine_parameters([missing, other, upper]) == {"ipa-agent-token": "upper"}
    assert vmedia.machine_parameters([other]) == {}


def test_block_devices_are_listed_from_sysfs(tmp_path: Path) -> None:
    sys_block = tmp_path / "block"
    for name in ("sda", "fd0", "sr0", "loop0", "ram0"):
        (sys_block / name).mkdir(parents=True)
    assert vmedia.block_devices(sys_block, Path("/dev")) == [Path("/dev/fd0"), Path("/dev/sda"), Path("/dev/sr0")]
