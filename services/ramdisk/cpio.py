"""An initramfs archive: the kernel's "newc" cpio format, written in Python.

Writing it here (rather than with ``cpio``) lets every file be owned by root
and carry exactly the mode the tree has, whoever builds it, and keeps the
order deterministic (sorted paths), so the same inputs give the same bytes.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

TRAILER = "TRAILER!!!"


def _header(*, ino: int, mode: int, size: int, name: str, mtime: int, nlink: int = 1) -> bytes:
    encoded = name.encode() + b"\0"
    fields = (ino, mode, 0, 0, nlink, mtime, size, 0, 0, 0, 0, len(encoded), 0)
    header = b"070701" + b"".join(b"%08X" % value for value in fields) + encoded
    return header + b"\0" * (-len(header) % 4)


def _walk(root: Path) -> Iterator[Path]:
    """Every path under ``root`` in sorted order, directories before their contents."""
    for current, dirs, files in os.walk(root):
        dirs.sort()
        base = Path(current)
        if base != root:
            yield base
        for name in sorted(files):
            yield base / name
        for name in dirs:  # symlinks to directories are not descended into by os.walk
            if (base / name).is_symlink():
                yield base / name
        dirs[:] = [d for d in dirs if not (base / d).is_symlink()]


def write_tree(root: Path, out: BinaryIO, *, mtime: int = 0) -> int:
    """Archive the tree under ``root`` (files, directories, symlinks) into ``out``; returns the bytes written.

    Every entry gets ``mtime`` (the same inputs give the same archive); other
    file types (devices, sockets) are skipped: devtmpfs makes device nodes at boot."""
    written = 0
    for ino, path in enumerate(_walk(root), start=1):
        info = path.lstat()
        if stat.S_ISLNK(info.st_mode):
            data = os.readlink(path).encode()
        elif stat.S_ISREG(info.st_mode):
            data = path.read_bytes()
        elif stat.S_ISDIR(info.st_mode):
            data = b""
        else:
            continue
        nlink = 2 if stat.S_ISDIR(info.st_mode) else 1
        name = path.relative_to(root).as_posix()
        entry = _header(ino=ino, mode=info.st_mode, size=len(data), name=name, mtime=mtime, nlink=nlink)
        entry += data + b"\0" * (-len(data) % 4)
        out.write(entry)
        written += len(entry)
    trailer = _header(ino=0, mode=0, size=0, name=TRAILER, mtime=0)
    out.write(trailer)
    return written + len(trailer)
