"""Bootable ISOs from a kernel, a ramdisk and a kernel command line (seed 002: ``create_iso_image``).

The layout is Ironic's, for both boot modes in one image (Ironic builds
either a BIOS or a UEFI ISO, never both):

    /vmlinuz  /initrd
    /isolinux/isolinux.bin  ldlinux.c32  isolinux.cfg  boot.cat   BIOS: El Torito entry 1, platform 0
    /EFI/BOOT/grub.cfg  /boot/grub/efiboot.img (the ESP)          UEFI: section with platform 0xEF
    [/openstack/... : a config drive folded in; the label is then config-2]

Written with pycdlib (ISO9660 level 3, Rock Ridge, Joliet), so no
``genisoimage`` or ``xorriso`` runs; ISOLINUX comes from Debian's
``isolinux``/``syslinux-common``, the ESP from :mod:`.efi`. The image is
written to ``<out>.part`` and renamed: a build that fails (a full disk, a
file that is not a kernel) leaves nothing behind.

Every input is checked before anything is written: the kernel must be an
x86 Linux bzImage, the ramdisk an initramfs, and the command line must be
printable and free of what isolinux or GRUB would read as syntax.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import pycdlib

from services.common import errors
from services.common.images import efi
from services.common.images.iso9660 import IsoTree

ISOLINUX_BIN = Path("/usr/lib/ISOLINUX/isolinux.bin")  # Debian package isolinux
LDLINUX_C32 = Path("/usr/lib/syslinux/modules/bios/ldlinux.c32")  # Debian package syslinux-common
LABEL = "VMEDIA_BOOT_ISO"
CONFIG_DRIVE_LABEL = "config-2"
MAX_CMDLINE = 2048  # COMMAND_LINE_SIZE of x86 Linux
# What isolinux.cfg or grub.cfg would read as more than a word: GRUB expands $, runs ; and {,
# and quotes change word boundaries; a line break starts a new directive in both.
_UNSAFE = re.compile(r"[;&|$`'\"{}<>\\#]")
# Ironic's templates (ironic/common/isolinux_config.template, grub_conf.template);
# the GRUB timeout is 1 s rather than 5: nobody is at a virtual-media console to choose.
ISOLINUX_CFG = "default boot\n\nlabel boot\nkernel /vmlinuz\nappend initrd=/initrd text {params} --\n"
GRUB_CFG = (
    "set default=0\nset timeout=1\nset hidden_timeout_quiet=false\n\n"
    'menuentry "boot_partition" {{\nlinux /vmlinuz {params} --\ninitrd /initrd\n}}\n'
)
_RAMDISK_MAGIC = (
    b"\x1f\x8b",  # gzip
    b"\xfd7zXZ\x00",  # xz
    b"\x28\xb5\x2f\xfd",  # zstd
    b"\x02\x21\x4c\x18",  # lz4 (legacy, what the kernel reads)
    b"BZh",  # bzip2
    b"\x5d\x00\x00",  # lzma
    b"070701",  # cpio newc
    b"070702",  # cpio crc
    b"070707",  # old cpio
    b"\x89LZO",  # lzo
)


@dataclass(frozen=True)
class BiosLoader:
    """ISOLINUX: the El Torito boot file and the module it loads."""

    isolinux_bin: Path = ISOLINUX_BIN
    ldlinux_c32: Path = LDLINUX_C32

    def check(self) -> BiosLoader:
        for path, package in ((self.isolinux_bin, "isolinux"), (self.ldlinux_c32, "syslinux-common")):
            if not path.is_file():
                raise errors.ImageError(f"{path} is missing: BIOS boot needs Debian package {package}")
        return self


def check_kernel(path: Path) -> None:
    """An x86 Linux boot image: the boot sector signature and the ``HdrS`` setup header."""
    with open(path, "rb") as fp:
        head = fp.read(0x210)
    if len(head) < 0x206 or head[0x1FE:0x200] != b"\x55\xaa" or head[0x202:0x206] != b"HdrS":
        raise errors.ImageError(
            f"the kernel {path.name} ({path.stat().st_size} bytes) is not an x86 Linux kernel "
            "(no bzImage setup header); check deploy_kernel / instance_info kernel"
        )


def check_ramdisk(path: Path) -> None:
    """An initramfs: a cpio archive, plain or in one of the compressions the kernel reads."""
    with open(path, "rb") as fp:
        head = fp.read(8)
    if not any(head.startswith(magic) for magic in _RAMDISK_MAGIC):
        raise errors.ImageError(
            f"the ramdisk {path.name} ({path.stat().st_size} bytes) is not an initramfs "
            "(cpio, optionally gzip/xz/zstd/lz4/bzip2/lzma/lzo compressed)"
        )


def check_kernel_params(params: str) -> str:
    """The command line, refused when a boot loader would read it as more than kernel words."""
    if len(params) > MAX_CMDLINE:
        raise errors.InvalidParameterValue(f"the kernel command line is {len(params)} characters, over {MAX_CMDLINE}")
    if not params.isascii() or not params.isprintable():
        raise errors.InvalidParameterValue("the kernel command line must be printable ASCII on one line")
    found = _UNSAFE.search(params)
    if found:
        raise errors.InvalidParameterValue(
            f"the kernel command line may not contain {found.group()!r}: the boot loader would interpret it"
        )
    return " ".join(params.split())


def create_iso_image(
    out: Path,
    *,
    kernel: Path,
    ramdisk: Path,
    kernel_params: str,
    bios: BiosLoader | None,
    esp: bytes | None,
    publisher: str = "",
    inject: Mapping[str, bytes] | None = None,
) -> Path:
    """Write a bootable ISO to ``out`` (see the module docstring); returns ``out``.

    ``bios`` adds the ISOLINUX entry, ``esp`` (an ESP image, :func:`efi.build_esp`)
    the UEFI one; at least one is needed. ``inject`` adds files (a config
    drive's ``openstack/...``, which makes the label ``config-2``, as Ironic does).
    Raises ImageError for a bad input or a failed write (nothing is left at ``out``).
    """
    if bios is None and esp is None:
        raise errors.ImageError("a boot ISO needs a BIOS loader, an EFI system partition, or both")
    params = check_kernel_params(kernel_params)
    check_kernel(kernel)
    check_ramdisk(ramdisk)
    files = dict(inject or {})
    label = CONFIG_DRIVE_LABEL if any(p.startswith("openstack/") for p in files) else LABEL
    part = out.with_name(out.name + ".part")
    iso = pycdlib.PyCdlib()
    iso.new(interchange_level=3, vol_ident=label, joliet=3, rock_ridge="1.09", pub_ident_str=publisher[:128])
    try:
        tree = IsoTree(iso, share_identical=False)
        tree.add("vmlinuz", kernel)
        tree.add("initrd", ramdisk)
        if bios is not None:
            bios.check()
            tree.add("isolinux/isolinux.bin", bios.isolinux_bin.read_bytes())
            tree.add("isolinux/ldlinux.c32", bios.ldlinux_c32)
            tree.add("isolinux/isolinux.cfg", ISOLINUX_CFG.format(params=params).encode())
        if esp is not None:
            tree.add(efi.GRUB_CONFIG_PATH, GRUB_CFG.format(params=params).encode())
            tree.add("boot/grub/efiboot.img", esp)
        for rel in sorted(files):
            tree.add(rel, files[rel])
        # The first El Torito entry makes the catalog (platform 0, x86 BIOS); a second
        # call adds a section with platform 0xEF (UEFI).
        if bios is not None:
            catalog = tree.add_directory("isolinux") + "/BOOT.CAT;1"
            iso.add_eltorito(
                tree.iso_path("isolinux/isolinux.bin"),
                bootcatfile=catalog,
                rr_bootcatname="boot.cat",
                joliet_bootcatfile="/isolinux/boot.cat",
                boot_load_size=4,
                boot_info_table=True,
                media_name="noemul",
            )
            if esp is not None:
                iso.add_eltorito(tree.iso_path("boot/grub/efiboot.img"), efi=True, media_name="noemul")
        else:
            iso.add_eltorito(
                tree.iso_path("boot/grub/efiboot.img"),
                bootcatfile="/BOOT.CAT;1",
                rr_bootcatname="boot.cat",
                joliet_bootcatfile="/boot.cat",
                platform_id=0xEF,
                media_name="noemul",
            )
        iso.write(str(part))
        os.replace(part, out)
    except OSError as exc:
        with contextlib.suppress(OSError):
            part.unlink()
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise errors.ImageError(f"out of space writing the boot ISO in {out.parent}: {exc.strerror}") from None
        raise errors.ImageError(f"writing the boot ISO {out.name} failed: {exc.strerror or exc}") from None
    except BaseException:
        with contextlib.suppress(OSError):
            part.unlink()
        raise
    finally:
        iso.close()
    return out
