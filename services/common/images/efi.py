"""UEFI boot for virtual-media ISOs: a GRUB EFI binary and the EFI system partition image holding it.

UEFI firmware boots a CD from the El Torito entry with platform 0xEF: a FAT
image (the ESP) with ``EFI/BOOT/BOOTX64.EFI``. That binary is GRUB, made once
with ``grub-mkimage`` from Debian's ``grub-efi-amd64-bin`` modules, with
every module it needs built in (the ISO carries no ``.mod`` files) and an
embedded configuration that finds the ISO9660 file system by its
``/EFI/BOOT/grub.cfg`` and reads that. The ESP itself holds no grub.cfg, so
the search cannot stop on it. ``grub-mkimage`` only reads the module
directory: it works offline in about 50 ms.

Ironic takes the ESP from ``driver_info['bootloader']`` or its configuration;
Ferrum does too (``build_esp`` accepts any set of files) and makes one when
none is given.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Mapping
from pathlib import Path

from services.common import errors
from services.common.images import fat

GRUB_MODULES_DIR = Path("/usr/lib/grub/x86_64-efi")  # Debian package grub-efi-amd64-bin
# What the embedded GRUB needs to find and read the ISO and start Linux.
GRUB_MODULES = (
    "part_gpt",
    "part_msdos",
    "fat",
    "iso9660",
    "search",
    "search_fs_file",
    "search_label",
    "configfile",
    "normal",
    "linux",
    "echo",
    "test",
    "all_video",
)
GRUB_CONFIG_PATH = "EFI/BOOT/grub.cfg"  # Ironic's [DEFAULT]grub_config_path, on the ISO9660 tree
EMBEDDED_CONFIG = f"search --no-floppy --set=root --file /{GRUB_CONFIG_PATH}\nconfigfile ($root)/{GRUB_CONFIG_PATH}\n"
ESP_LABEL = "ESP_IMAGE"
MIN_ESP_BYTES = 4 * 1024 * 1024  # Ironic's documented ESP size
# The El Torito entry counts 512-byte sectors in 16 bits: an ESP must stay under 32 MiB.
MAX_ESP_BYTES = 32 * 1024 * 1024 - 1024 * 1024
_TIMEOUT = 60.0


def build_grub_efi(out: Path, *, modules_dir: Path = GRUB_MODULES_DIR) -> Path:
    """Write a self-contained x86_64 GRUB EFI binary (about 630 KiB) to ``out``."""
    tool = shutil.which("grub-mkimage")
    if tool is None:
        raise errors.ImageError("grub-mkimage is not installed (Debian package grub-common)")
    if not (modules_dir / "linux.mod").is_file():
        raise errors.ImageError(f"no GRUB EFI modules in {modules_dir} (Debian package grub-efi-amd64-bin)")
    with tempfile.TemporaryDirectory(prefix="ferrum-grub-") as tmp:
        config = Path(tmp) / "embedded.cfg"
        config.write_text(EMBEDDED_CONFIG)
        part = Path(tmp) / "BOOTX64.EFI"
        argv = [
            tool,
            "-O",
            "x86_64-efi",
            "-d",
            str(modules_dir),
            "-o",
            str(part),
            "-p",
            "/EFI/BOOT",
            "-c",
            str(config),
            *GRUB_MODULES,
        ]
        result = subprocess.run(argv, capture_output=True, text=True, timeout=_TIMEOUT, check=False)
        if result.returncode != 0:
            raise errors.ImageError(f"grub-mkimage failed: {result.stderr.strip()[-500:]}")
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(part, out.with_suffix(".part"))
        os.replace(out.with_suffix(".part"), out)
    return out


def esp_size(payload: int) -> int:
    """Bytes for an ESP holding ``payload`` bytes of files: room for FAT overhead, whole MiB, at least 4 MiB."""
    wanted = int(payload * 1.1) + 512 * 1024
    size = max(MIN_ESP_BYTES, -(-wanted // (1024 * 1024)) * 1024 * 1024)
    if size > MAX_ESP_BYTES:
        raise errors.ImageError(
            f"the EFI boot files ({payload} bytes) do not fit an El Torito image (at most {MAX_ESP_BYTES} bytes)"
        )
    return size


def build_esp(files: Mapping[str, Path | bytes], *, work_dir: str | None = None) -> bytes:
    """A FAT ESP image holding ``files`` (ESP path -> file or bytes), e.g. ``{"EFI/BOOT/BOOTX64.EFI": grub}``."""
    payload = sum(v.stat().st_size if isinstance(v, Path) else len(v) for v in files.values())
    return fat.write_image(dict(files), label=ESP_LABEL, size=esp_size(payload), work_dir=work_dir)
