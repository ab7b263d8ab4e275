"""The small, bootable-looking disk image the demo deploys.

A GPT disk with one Linux partition holding an ext4 filesystem with a marker
file, made with Debian's sgdisk and mke2fs on plain files (no loop devices,
no mounting), plus its qcow2 twin made by qemu-img. Real enough that the
simulated machine's "OS boot" finds the partition table and the config drive
added behind it.
"""

from __future__ import annotations

import hashlib
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

MiB = 1024 * 1024
PARTITION_START = 1 * MiB


@dataclass(frozen=True)
class DemoImage:
    path: Path
    size: int
    sha256: str
    payload_start: int  # where the partition's bytes begin (the tables around it change on deploy)
    payload_end: int


def _run(*argv: str) -> None:
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed: {done.stderr.strip()}")


def build_demo_image(directory: Path, *, size_mib: int = 48, marker: str = "ferrum demo") -> DemoImage:
    """Write ``demo-disk.raw`` under ``directory`` and describe it."""
    directory.mkdir(parents=True, exist_ok=True)
    image = directory / "demo-disk.raw"
    size = size_mib * MiB
    part_end = size - MiB  # leaves room for the backup GPT
    with tempfile.TemporaryDirectory(prefix="ferrum-demo-fs-") as tmp:
        root = Path(tmp) / "root"
        (root / "etc").mkdir(parents=True)
        (root / "etc" / "ferrum-demo").write_text(marker + "\n")
        (root / "etc" / "hostname").write_text("localhost\n")
        fs = Path(tmp) / "fs.img"
        _run(
            "mke2fs",
            "-q",
            "-F",
            "-t",
            "ext4",
            "-L",
            "ferrum-root",
            "-d",
            str(root),
            str(fs),
            f"{(part_end - PARTITION_START) // 1024}k",
        )
        with open(image, "wb") as out:
            out.truncate(size)
        _run(
            "sgdisk",
            "-n",
            f"1:{PARTITION_START // 512}:{part_end // 512 - 1}",
            "-t",
            "1:8300",
            "-c",
            "1:root",
            str(image),
        )
        with open(fs, "rb") as src, open(image, "r+b") as out:
            out.seek(PARTITION_START)
            while chunk := src.read(4 * MiB):
                out.write(chunk)
    digest = hashlib.sha256()
    with open(image, "rb") as f:
        while chunk := f.read(4 * MiB):
            digest.update(chunk)
    return DemoImage(
        path=image, size=size, sha256=digest.hexdigest(), payload_start=PARTITION_START, payload_end=part_end
    )


def payload_digest(path: Path, image: DemoImage) -> str:
    """sha256 of the partition bytes on a disk (or the image), for a byte-for-byte check."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        f.seek(image.payload_start)
        left = image.payload_end - image.payload_start
        while left > 0:
            chunk = f.read(min(4 * MiB, left))
            if not chunk:
                break
            digest.update(chunk)
            left -= len(chunk)
    return digest.hexdigest()
