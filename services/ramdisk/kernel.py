"""Debian's kernel: its ``vmlinuz`` and module tree, unpacked once into the cache.

The kernel package is whatever ``linux-image-amd64`` depends on today. It
is unpacked whole (about 400 MB, 7 s here) the first time and reused after
that; ``dpkg -x`` gives the files but runs no maintainer script, so there is
no ``modules.dep`` (see :mod:`services.ramdisk.kmod`).
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from services.ramdisk import debian


@dataclass(frozen=True)
class Kernel:
    package: str  # linux-image-6.1.0-N-amd64
    version: str  # 6.1.0-N-amd64, the directory under lib/modules
    vmlinuz: Path
    modules_dir: Path  # .../lib/modules/<version>


def fetch_kernel(cache: Path) -> Kernel:
    """Debian's current kernel, downloaded and unpacked under ``cache`` unless it already is."""
    package = debian.kernel_package()
    tree = cache / "kernels" / package
    if not (tree / ".complete").is_file():
        deb = debian.download([package], cache / "debs")[package]
        partial = tree.with_name(tree.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        debian.extract(deb, partial)
        (partial / ".complete").write_text(deb.name + "\n")
        shutil.rmtree(tree, ignore_errors=True)
        os.replace(partial, tree)
    images = sorted((tree / "boot").glob("vmlinuz-*"))
    modules = sorted((tree / "lib" / "modules").iterdir())
    if not images or not modules:
        raise debian.PackageError(f"{package} holds no vmlinuz or no modules")
    return Kernel(package=package, version=modules[0].name, vmlinuz=images[0], modules_dir=modules[0])
