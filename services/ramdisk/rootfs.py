"""Assembling an initramfs root tree from unpacked Debian packages.

The steps every image built here shares: unpack packages into a directory,
drop what a RAM-only system never reads (documentation, locales, charset
converters, Python's test suite), give busybox its applet links, copy the
kernel modules to load with their order, and pack the tree as a compressed
cpio archive. Nothing is installed on the build machine and nothing needs
root: file ownership is set to root inside the archive.
"""

from __future__ import annotations

import gzip
import os
import shutil
import subprocess
from collections.abc import Iterable, Mapping
from pathlib import Path

from services.ramdisk import cpio, debian, kmod
from services.ramdisk.kernel import Kernel

# Never read in a RAM-only system; together about half of the unpacked bytes.
PRUNED = (
    "usr/share/doc",
    "usr/share/man",
    "usr/share/info",
    "usr/share/locale",
    "usr/share/lintian",
    "usr/share/bug",
    "usr/share/bash-completion",
    "usr/share/gdb",
    "usr/share/python3",
    "usr/lib/python3.11/test",
    "usr/lib/python3.11/idlelib",
    "usr/lib/python3.11/tkinter",
    "usr/lib/python3.11/turtledemo",
    "usr/lib/python3.11/ensurepip",
    "usr/lib/python3.11/lib2to3",
    "usr/lib/python3.11/pydoc_data",
    "usr/lib/python3.11/distutils",
    "usr/lib/python3.11/unittest",
    "usr/lib/python3.11/config-3.11-x86_64-linux-gnu",
)
# Directories thinned to what the ramdisk uses: mtools converts FAT names through
# iconv to codepage 850, and without that one gconv module it cannot read the
# parameters floppy at all ("Error converting to codepage 850").
THINNED = {
    "usr/lib/x86_64-linux-gnu/gconv": frozenset(
        {"IBM850.so", "gconv-modules", "gconv-modules.d", "gconv-modules.cache"}
    ),
}
GZIP_LEVEL = 6  # -9 saves 2 % more here and takes twice as long


def unpack(debs: Iterable[Path], root: Path) -> None:
    for deb in debs:
        debian.extract(deb, root)


def prune(root: Path, paths: Iterable[str] = PRUNED, thinned: Mapping[str, frozenset[str]] = THINNED) -> None:
    for relative in paths:
        _remove(root / relative)
    for relative, kept in thinned.items():
        directory = root / relative
        if directory.is_dir():
            for entry in directory.iterdir():
                if entry.name not in kept:
                    _remove(entry)


def _remove(target: Path) -> None:
    if target.is_dir() and not target.is_symlink():
        shutil.rmtree(target)
    elif target.exists() or target.is_symlink():
        target.unlink()


def install_busybox(root: Path) -> None:
    """``bin/busybox`` plus a link per applet wherever no real program of that name was unpacked."""
    busybox = root / "bin" / "busybox"
    if not busybox.is_file():
        raise debian.PackageError("busybox-static did not unpack bin/busybox")
    listing = subprocess.run(
        [str(busybox), "--list-full"], capture_output=True, text=True, timeout=30, check=True
    ).stdout
    for line in listing.split():
        link = root / line
        if link.exists() or link.is_symlink():
            continue
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to("/bin/busybox")
    for directory in ("proc", "sys", "dev", "tmp", "run", "root", "etc/ferrum"):
        (root / directory).mkdir(parents=True, exist_ok=True)


def install_modules(root: Path, kernel: Kernel, wanted: list[str]) -> list[str]:
    """Copy ``wanted`` modules and their dependencies; write ``etc/ferrum/modules.order``.

    Returns the order (paths under ``/lib/modules``) the init loads them in."""
    order = []
    for module in kmod.load_order(kernel.modules_dir, wanted):
        relative = Path(kernel.version) / module.path.relative_to(kernel.modules_dir)
        target = root / "lib" / "modules" / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(module.path, target)
        order.append(relative.as_posix())
    (root / "etc" / "ferrum").mkdir(parents=True, exist_ok=True)
    (root / "etc" / "ferrum" / "modules.order").write_text("".join(f"{line}\n" for line in order))
    return order


def install_file(root: Path, relative: str, text: str, *, mode: int = 0o644) -> None:
    target = root / relative
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text)
    os.chmod(target, mode)


def tree_size(root: Path) -> int:
    return sum(p.lstat().st_size for p in root.rglob("*") if p.is_file() and not p.is_symlink())


def pack(root: Path, output: Path) -> tuple[int, int]:
    """The tree as a gzip'd newc archive at ``output`` (written atomically); (uncompressed, compressed) bytes."""
    partial = output.with_name(output.name + ".partial")
    with open(partial, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=GZIP_LEVEL, mtime=0) as out:
        size = cpio.write_tree(root, out)  # type: ignore[arg-type]
    os.replace(partial, output)
    return size, output.stat().st_size
