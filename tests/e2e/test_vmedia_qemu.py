"""The boot ISO Ferrum builds boots in QEMU from a virtual CD, under SeaBIOS and under OVMF.

The ISO is made by ``services.common.images.boot_iso`` (pycdlib, ISOLINUX,
a GRUB EFI binary from grub-mkimage in an ESP made with mtools) from the
Debian kernel and the busybox initramfs of ``tests/e2e/bootfiles.py``, whose
/init prints a marker and /proc/cmdline on the serial console and powers
off. Both machines must show the marker and exactly the command line asked
for. Everything is built before any VM starts; the two VMs run side by side.
"""

from __future__ import annotations

import asyncio
import shutil
import time
from pathlib import Path

import pytest

from services.common.images import boot_iso, efi
from tests.e2e.bootfiles import MARKER, ensure_initramfs, ensure_kernel, ensure_packages

OVMF_CODE, OVMF_VARS = Path("/usr/share/OVMF/OVMF_CODE_4M.fd"), Path("/usr/share/OVMF/OVMF_VARS_4M.fd")
PARAMS = "console=ttyS0 boot_method=vmedia ipa-api-url=http://10.0.2.2:6385 ferrum-proof=vmedia-cd"
BOOT_WAIT = 240.0

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def iso(tmp_path_factory: pytest.TempPathFactory) -> Path:
    ensure_packages("isolinux", "syslinux-common", "grub-efi-amd64-bin", "grub-common", "dosfstools", "mtools")
    kernel, initramfs = ensure_kernel(), ensure_initramfs(MARKER)
    work = tmp_path_factory.mktemp("vmedia-qemu")
    esp = efi.build_esp({"EFI/BOOT/BOOTX64.EFI": efi.build_grub_efi(work / "BOOTX64.EFI")})
    return boot_iso.create_iso_image(
        work / "boot.iso", kernel=kernel, ramdisk=initramfs, kernel_params=PARAMS, bios=boot_iso.BiosLoader(), esp=esp
    )


async def boot_cd(iso: Path, serial: Path, *, uefi_vars: Path | None) -> str:
    """Boot ``iso`` as a CD until the guest powers off (bounded); the serial log."""
    firmware = (
        [
            "-machine",
            "q35",
            "-drive",
            f"if=pflash,format=raw,readonly=on,file={OVMF_CODE}",
            "-drive",
            f"if=pflash,format=raw,file={uefi_vars}",
        ]
        if uefi_vars
        else ["-machine", "pc", "-boot", "d"]
    )
    process = await asyncio.create_subprocess_exec(
        "qemu-system-x86_64",
        *firmware,
        "-accel",
        "tcg",
        "-m",
        "512",
        "-no-reboot",
        "-nodefaults",
        "-display",
        "none",
        "-monitor",
        "none",
        "-serial",
        f"file:{serial}",
        "-cdrom",
        str(iso),
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        await asyncio.wait_for(process.wait(), BOOT_WAIT)
    except TimeoutError:
        pass
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    return serial.read_text(errors="replace") if serial.exists() else ""


async def test_the_boot_iso_boots_with_seabios_and_with_ovmf(iso: Path, tmp_path: Path) -> None:
    variables = tmp_path / "OVMF_VARS.fd"
    shutil.copyfile(OVMF_VARS, variables)
    started = time.monotonic()
    bios_log, uefi_log = await asyncio.gather(
        boot_cd(iso, tmp_path / "seabios.log", uefi_vars=None),
        boot_cd(iso, tmp_path / "ovmf.log", uefi_vars=variables),
    )
    print(f"both firmwares booted the ISO in {time.monotonic() - started:.1f} s")
    for name, log, loader in (("SeaBIOS", bios_log, "initrd=/initrd text "), ("OVMF", uefi_log, "")):
        assert MARKER in log, f"{name}: no marker on the serial console:\n{log[-3000:]}"
        # The init prints the command line right after the marker, but the kernel's own
        # late lines ("[    2.48] tsc: Refined TSC ...") may land in between: skip those.
        after = [line for line in log.split(MARKER, 1)[1].strip().splitlines() if not line.startswith("[")]
        cmdline = after[0] if after else ""
        # ISOLINUX names the initrd and adds Ironic's "text"; GRUB passes the line as it is.
        assert cmdline == f"BOOT_IMAGE=/vmlinuz {loader}{PARAMS} --", f"{name}: {cmdline!r}"
    assert "EFI stub" in uefi_log or "efi:" in uefi_log.lower()
