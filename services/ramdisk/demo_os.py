"""``ferrum image build-demo``: a small bootable GPT disk image with a demo OS.

Layout: a GPT disk whose protective MBR holds syslinux's ``gptmbr.bin``, and
one FAT partition marked legacy-BIOS-bootable holding syslinux
(``ldlinux.sys``), Debian's kernel and a busybox initramfs
(``files/demo-os-init.sh``). The OS prints ``hostname=<meta_data.json
hostname>`` and ``user_data=<first line>`` from its config drive on the
serial console, which is how a test sees that a deploy really worked.

Everything is done on plain files, without loop devices or mounting (the
build machine may not allow either): ``mformat``/``mcopy`` (mtools) make and
fill the FAT file system, syslinux's mtools installer makes it bootable,
``sgdisk`` writes the table, and the partition is copied into place.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import asdict, dataclass
from importlib import resources
from pathlib import Path

from services.ramdisk import debian, rootfs
from services.ramdisk.kernel import Kernel, fetch_kernel

MiB = 1024 * 1024
SECTOR = 512
PARTITION_START = 1 * MiB
MIN_SIZE_MIB, MAX_SIZE_MIB = 16, 4096  # the kernel and initramfs take about 10 MiB
MODULES = (
    "virtio_pci",
    "virtio_blk",
    "virtio_scsi",
    "sd_mod",
    "ahci",
    "nvme",
    "isofs",
    "vfat",
    "nls_cp437",
    "nls_ascii",
)
BOOT_PACKAGES = ("syslinux", "syslinux-common")
SYSLINUX_CFG = """\
SERIAL 0 115200
DEFAULT ferrum-demo
PROMPT 0
TIMEOUT 0
LABEL ferrum-demo
  LINUX /vmlinuz
  INITRD /initrd
  APPEND console=tty0 console=ttyS0,115200n8 panic=10
"""


@dataclass(frozen=True)
class DemoOsImage:
    path: Path
    size: int
    sha256: str
    kernel_package: str
    seconds: float
    inputs: str  # digest of what the image was made from


def _tool(*argv: str) -> None:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    if done.returncode != 0:
        raise debian.PackageError(f"{' '.join(argv[:3])} ... failed: {(done.stderr or done.stdout).strip()[-1000:]}")


def _initramfs(directory: Path, kernel: Kernel, busybox_deb: Path, init_text: str) -> Path:
    root = directory / "initrd-root"
    rootfs.unpack([busybox_deb], root)
    rootfs.prune(root)
    rootfs.install_busybox(root)
    rootfs.install_modules(root, kernel, list(MODULES))
    rootfs.install_file(root, "init", init_text, mode=0o755)
    initrd = directory / "initrd"
    rootfs.pack(root, initrd)
    return initrd


def build_demo_os(output: Path, *, cache: Path, size_mib: int = 32, reuse: bool = False) -> DemoOsImage:
    """Write ``output/ferrum-demo-os.raw`` (atomically) and describe it.

    ``reuse``: keep an image already there that was made from the same inputs
    (kernel, packages, init, size), recorded in ``ferrum-demo-os.json``."""
    if not MIN_SIZE_MIB <= size_mib <= MAX_SIZE_MIB:
        raise ValueError(f"the demo image size must be {MIN_SIZE_MIB} to {MAX_SIZE_MIB} MiB, not {size_mib}")
    started = time.monotonic()
    output, cache = output.absolute(), cache.absolute()  # as build_ramdisk: tools run in other directories
    with debian.locked(cache):
        kernel = fetch_kernel(cache)
        debs = debian.download(("busybox-static", *BOOT_PACKAGES), cache / "debs")
    init_text = resources.files("services.ramdisk").joinpath("files/demo-os-init.sh").read_text()
    inputs = hashlib.sha256(
        "\0".join(
            [kernel.package, *sorted(p.name for p in debs.values()), *MODULES, SYSLINUX_CFG, init_text, str(size_mib)]
        ).encode()
    ).hexdigest()
    output.mkdir(parents=True, exist_ok=True)
    image = output / "ferrum-demo-os.raw"
    record = output / "ferrum-demo-os.json"
    if reuse and image.is_file():
        try:
            previous = json.loads(record.read_text())
            if previous.get("inputs") == inputs:
                return DemoOsImage(**{**previous, "path": image})
        except (OSError, ValueError, TypeError):
            pass
    size = size_mib * MiB
    part_end = size - MiB  # room for the backup GPT
    part_sectors = (part_end - PARTITION_START) // SECTOR
    with tempfile.TemporaryDirectory(dir=output, prefix=".build-") as tmp:
        work = Path(tmp)
        tools = work / "syslinux"
        for name in BOOT_PACKAGES:
            debian.extract(debs[name], tools)
        initrd = _initramfs(work, kernel, debs["busybox-static"], init_text)
        fat = work / "boot.fat"
        with open(fat, "wb") as handle:
            handle.truncate(part_end - PARTITION_START)
        # Hidden sectors = where the partition starts: the boot sector finds its files from there.
        _tool(
            "mformat", "-i", str(fat), "-T", str(part_sectors), "-h", "64", "-s", "32",
            "-H", str(PARTITION_START // SECTOR), "-v", "FERRUMBOOT", "::",
        )  # fmt: skip
        _tool(str(tools / "usr" / "bin" / "syslinux"), "--install", str(fat))
        config = work / "syslinux.cfg"
        config.write_text(SYSLINUX_CFG)
        for source, name in ((kernel.vmlinuz, "vmlinuz"), (initrd, "initrd"), (config, "syslinux.cfg")):
            _tool("mcopy", "-i", str(fat), str(source), f"::/{name}")
        disk = work / "disk.raw"
        with open(disk, "wb") as handle:
            handle.truncate(size)
        _tool(
            "sgdisk",
            "-n", f"1:{PARTITION_START // SECTOR}:{part_end // SECTOR - 1}",
            "-t", "1:0700", "-c", "1:boot", "-A", "1:set:2",  # legacy BIOS bootable: gptmbr.bin boots it
            str(disk),
        )  # fmt: skip
        gptmbr = (tools / "usr" / "lib" / "syslinux" / "mbr" / "gptmbr.bin").read_bytes()
        with open(disk, "r+b") as out, open(fat, "rb") as partition:
            out.write(gptmbr[:440])  # boot code only: the table after byte 440 stays
            out.seek(PARTITION_START)
            shutil.copyfileobj(partition, out, 4 * MiB)
        digest = hashlib.sha256()
        with open(disk, "rb") as handle:
            while chunk := handle.read(4 * MiB):
                digest.update(chunk)
        os.replace(disk, image)
    built = DemoOsImage(
        path=image,
        size=size,
        sha256=digest.hexdigest(),
        kernel_package=kernel.package,
        seconds=round(time.monotonic() - started, 1),
        inputs=inputs,
    )
    record.write_text(json.dumps({**asdict(built), "path": str(image)}, indent=1) + "\n")
    return built
