"""The virtual-media builders: the parameters floppy and the boot ISO (seed 002).

Each image is checked with the tools its consumers use: blkid (what udev's
by-label links and IPA's lsblk see), mtools and fsck.fat for the floppy;
pycdlib, xorriso's El Torito report (a test-time reference only) and the
simulator's firmware reader for the ISO. QEMU boots the ISO in
tests/e2e/test_vmedia_qemu.py.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pycdlib
import pytest

from services.common import errors
from services.common.images import boot_iso, efi, fat, floppy
from services.simulator.vmedia import iso_kernel_cmdline

BZIMAGE = bytearray(4096)
BZIMAGE[0x1FE:0x200] = b"\x55\xaa"
BZIMAGE[0x202:0x206] = b"HdrS"


@pytest.fixture(scope="module")
def esp(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    grub = efi.build_grub_efi(tmp_path_factory.mktemp("grub") / "BOOTX64.EFI")
    return efi.build_esp({"EFI/BOOT/BOOTX64.EFI": grub})


@pytest.fixture
def kernel_and_ramdisk(tmp_path: Path) -> tuple[Path, Path]:
    kernel, ramdisk = tmp_path / "vmlinuz", tmp_path / "initrd"
    kernel.write_bytes(bytes(BZIMAGE))
    ramdisk.write_bytes(b"\x1f\x8b\x08\x00" + b"\0" * 2000)
    return kernel, ramdisk


def blkid(path: Path) -> dict[str, str]:
    out = subprocess.run(["blkid", "-o", "export", str(path)], capture_output=True, text=True, check=True).stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


# ---- the floppy ----------------------------------------------------------------------------


def test_floppy_is_what_ipa_reads(tmp_path: Path) -> None:
    params = {
        "ipa-api-url": "http://10.0.0.1:6385",
        "ipa-node-uuid": "1be26c0b-03f2-4d2e-ae87-c02d7f33c123",
        "ipa-agent-token": "s3cr3t-Token_value",
        "BOOTIF": "52:54:00:12:34:56",
        "boot_method": "vmedia",
    }
    image = tmp_path / "floppy.img"
    image.write_bytes(floppy.create_vfat_image(params))
    assert image.stat().st_size == 1440 * 1024
    found = blkid(image)
    # The root-directory label, lower case as IPA looks it up (mformat would upper-case it).
    assert (found["TYPE"], found["LABEL"]) == ("vfat", "ir-vfd-dev")
    text = fat.read_file(image, "parameters.txt").decode()
    assert text == "\n".join(f"{k}={v}" for k, v in params.items())  # Ironic's format: no trailing newline
    assert floppy.parse_parameters(text) == params
    fsck = subprocess.run(["fsck.fat", "-n", str(image)], capture_output=True, text=True, check=False)
    assert fsck.returncode == 0, fsck.stdout + fsck.stderr
    with open(image, "rb") as fp:
        assert fat.volume_labels(fp) == ["ir-vfd-dev", "ir-vfd-dev"]


@pytest.mark.parametrize(
    ("params", "problem"),
    [
        ({"ipa-api-url": "http://x\nipa-agent-token=stolen"}, "non-printable"),
        ({"bad key": "x"}, "invalid virtual floppy parameter name"),
        ({"": "x"}, "invalid virtual floppy parameter name"),
        ({"k": "x" * 70_000}, "exceed"),
    ],
)
def test_floppy_refuses_parameters_that_change_the_file(params: dict[str, str], problem: str) -> None:
    with pytest.raises(errors.InvalidParameterValue, match=problem):
        floppy.create_vfat_image(params)


def test_parse_skips_what_is_not_a_pair() -> None:
    assert floppy.parse_parameters("a=1\n\nnot a pair\n=x\nb = 2 \na=3") == {"a": "3", "b": "2"}


# ---- the boot ISO --------------------------------------------------------------------------


def test_hybrid_iso_layout_and_boot_entries(tmp_path: Path, esp: bytes, kernel_and_ramdisk: tuple[Path, Path]) -> None:
    kernel, ramdisk = kernel_and_ramdisk
    out = boot_iso.create_iso_image(
        tmp_path / "boot.iso",
        kernel=kernel,
        ramdisk=ramdisk,
        kernel_params="nofb  vga=normal boot_method=vmedia",
        bios=boot_iso.BiosLoader(),
        esp=esp,
        publisher="ir-pub-id",
    )
    iso = pycdlib.PyCdlib()
    iso.open(str(out))
    try:
        names = {
            path for root, _, files in iso.walk(rr_path="/") for path in (f"{root.rstrip('/')}/{f}" for f in files)
        }
        assert {
            "/vmlinuz",
            "/initrd",
            "/isolinux/isolinux.bin",
            "/isolinux/ldlinux.c32",
            "/isolinux/isolinux.cfg",
            "/isolinux/boot.cat",
            "/EFI/BOOT/grub.cfg",
            "/boot/grub/efiboot.img",
        } <= names
        assert iso.pvd.volume_identifier.decode().strip() == "VMEDIA_BOOT_ISO"
        assert iso.pvd.publisher_identifier.text.decode().strip() == "ir-pub-id"
    finally:
        iso.close()
    report = subprocess.run(
        ["xorriso", "-indev", str(out), "-report_el_torito", "plain"], capture_output=True, text=True, check=True
    ).stdout
    entries = [line.split() for line in report.splitlines() if line.startswith("El Torito boot img :")]
    assert [(e[6], e[7], e[8]) for e in entries] == [("BIOS", "y", "none"), ("UEFI", "y", "none")]
    assert "boot-info-table" in report
    # What a machine's firmware reads: isolinux first, the words normalised.
    assert iso_kernel_cmdline(out) == ("text nofb vga=normal boot_method=vmedia --", "isolinux/isolinux.cfg")
    assert not list(tmp_path.glob("*.part"))


def test_uefi_only_iso_with_a_config_drive_is_labelled_config_2(
    tmp_path: Path, esp: bytes, kernel_and_ramdisk: tuple[Path, Path]
) -> None:
    kernel, ramdisk = kernel_and_ramdisk
    out = boot_iso.create_iso_image(
        tmp_path / "combined.iso",
        kernel=kernel,
        ramdisk=ramdisk,
        kernel_params="root=/dev/ram0",
        bios=None,
        esp=esp,
        inject={"openstack/latest/meta_data.json": b'{"uuid": "u"}'},
    )
    assert blkid(out)["LABEL"] == "config-2"
    assert iso_kernel_cmdline(out) == ("root=/dev/ram0 --", "efi/boot/grub.cfg")


@pytest.mark.parametrize(
    ("params", "problem"),
    [
        ("a=b; reboot", "';'"),
        ("a=$root", "'\\$'"),
        ('x="y"', "'\"'"),
        ("a=b\nlabel evil", "printable ASCII"),
        ("x" * 3000, "over 2048"),
    ],
)
def test_command_lines_the_boot_loader_would_interpret_are_refused(
    tmp_path: Path, esp: bytes, kernel_and_ramdisk: tuple[Path, Path], params: str, problem: str
) -> None:
    kernel, ramdisk = kernel_and_ramdisk
    with pytest.raises(errors.InvalidParameterValue, match=problem):
        boot_iso.create_iso_image(
            tmp_path / "x.iso", kernel=kernel, ramdisk=ramdisk, kernel_params=params, bios=None, esp=esp
        )
    assert list(tmp_path.glob("x.iso*")) == []


def test_bad_kernel_or_ramdisk_is_refused_and_nothing_is_left(
    tmp_path: Path, esp: bytes, kernel_and_ramdisk: tuple[Path, Path]
) -> None:
    kernel, ramdisk = kernel_and_ramdisk
    junk = tmp_path / "junk"
    junk.write_bytes(b"<html>404 Not Found</html>")
    with pytest.raises(errors.ImageError, match="not an x86 Linux kernel"):
        boot_iso.create_iso_image(
            tmp_path / "x.iso", kernel=junk, ramdisk=ramdisk, kernel_params="", bios=None, esp=esp
        )
    with pytest.raises(errors.ImageError, match="not an initramfs"):
        boot_iso.create_iso_image(tmp_path / "x.iso", kernel=kernel, ramdisk=junk, kernel_params="", bios=None, esp=esp)
    with pytest.raises(errors.ImageError, match="needs a BIOS loader, an EFI system partition, or both"):
        boot_iso.create_iso_image(
            tmp_path / "x.iso", kernel=kernel, ramdisk=ramdisk, kernel_params="", bios=None, esp=None
        )
    assert list(tmp_path.glob("x.iso*")) == []


def test_a_full_disk_fails_with_a_clear_message_and_leaves_nothing(
    tmp_path: Path, esp: bytes, kernel_and_ramdisk: tuple[Path, Path]
) -> None:
    """The partial file is /dev/full: every write fails with ENOSPC, as on a full file system."""
    kernel, ramdisk = kernel_and_ramdisk
    (tmp_path / "full.iso.part").symlink_to("/dev/full")
    with pytest.raises(errors.ImageError, match="out of space writing the boot ISO"):
        boot_iso.create_iso_image(
            tmp_path / "full.iso", kernel=kernel, ramdisk=ramdisk, kernel_params="", bios=boot_iso.BiosLoader(), esp=esp
        )
    assert list(tmp_path.glob("full.iso*")) == []


def test_missing_bios_loader_names_the_package(tmp_path: Path, kernel_and_ramdisk: tuple[Path, Path]) -> None:
    kernel, ramdisk = kernel_and_ramdisk
    loader = boot_iso.BiosLoader(isolinux_bin=tmp_path / "nope.bin")
    with pytest.raises(errors.ImageError, match="Debian package isolinux"):
        boot_iso.create_iso_image(
            tmp_path / "x.iso", kernel=kernel, ramdisk=ramdisk, kernel_params="", bios=loader, esp=None
        )
    assert list(tmp_path.glob("x.iso*")) == []


def test_esp_is_sized_from_its_payload() -> None:
    assert efi.esp_size(600_000) == 4 * 1024 * 1024
    assert efi.esp_size(10 * 1024 * 1024) == 12 * 1024 * 1024
    with pytest.raises(errors.ImageError, match="do not fit an El Torito image"):
        efi.esp_size(40 * 1024 * 1024)
