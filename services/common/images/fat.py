"""FAT (12/16/32) volumes: the label probe in pure Python, files read and written with mtools.

The probe runs on every partition of every disk we inspect, so it is a few
bounded reads of the boot sector and the root directory, never a subprocess.
Reading and writing whole files is left to mtools (Debian's ``mtools``, the
tool the kernel-less world uses for FAT images): a FAT writer is easy to get
subtly wrong (long names, FAT12 packing, the media byte), and mtools is what
the consumers of our floppies were tested with. mtools works on an image file
at a byte offset (``image@@offset``), so a FAT inside a partition needs no
copy and no loop device.

Everything mtools reads comes from untrusted bytes: its output is read up to
a limit and the process is killed past it or past a timeout.
"""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import BinaryIO

from services.common import errors

FLOPPY_BYTES = 1440 * 1024  # a 3.5" HD floppy: what virtual-media BMCs accept
MAX_FILE_BYTES = 64 * 1024 * 1024  # the most a caller may ask mtools to hand back
_ROOT_SCAN_BYTES = 64 * 1024  # how much of the root directory the label probe looks at
_TOOL_TIMEOUT = 60.0
_MTOOLS_ENV = {"MTOOLS_SKIP_CHECK": "1", "MTOOLS_NO_VFAT": "0", "LC_ALL": "C"}


def volume_labels(fp: BinaryIO, offset: int = 0) -> list[str]:
    """The FAT volume labels at byte ``offset``: the root-directory entry, then the boot sector's.

    ``blkid`` reports the root-directory label when there is one (it is what
    ``fatlabel`` changes), else the boot sector's; a config-2 search checks
    both. An empty list means "not FAT" (or FAT without a label).
    """
    fp.seek(offset)
    boot = fp.read(512)
    layout = _layout(boot)
    if layout is None:
        return []
    ext, root_at, root_len = layout
    labels = []
    fp.seek(offset + root_at)
    root = fp.read(min(root_len, _ROOT_SCAN_BYTES))
    for pos in range(0, len(root) - 31, 32):
        dirent = root[pos : pos + 32]
        if dirent[0] == 0:
            break
        if dirent[0] != 0xE5 and dirent[11] & 0x08 and dirent[11] & 0x0F != 0x0F:
            labels.append(dirent[:11].decode("ascii", "replace").rstrip())
            break
    if boot[ext] == 0x29:
        label = boot[ext + 5 : ext + 16].decode("ascii", "replace").rstrip()
        if label and label != "NO NAME":
            labels.append(label)
    return labels


def is_fat(boot: bytes) -> bool:
    """Whether the 512 bytes at the start of a volume are a FAT boot sector."""
    return _layout(boot) is not None


def _layout(boot: bytes) -> tuple[int, int, int] | None:
    """(extended boot record offset, root directory offset, root directory bytes), or None when not FAT.

    The BIOS parameter block must be self-consistent (sector size a power of
    two from 512 to 4096, cluster size a power of two, at least one FAT and
    one reserved sector, a valid media byte) and the boot sector must carry
    a FAT file-system type string or at least the 55 AA signature: an MBR or
    an NTFS boot sector fails one of these.
    """
    if len(boot) < 512 or boot[510:512] != b"\x55\xaa":
        return None
    bps, spc, reserved, nfats, root_entries, _total16, media, fatsz16 = struct.unpack_from("<HBHBHHBH", boot, 11)
    if bps not in (512, 1024, 2048, 4096) or spc == 0 or spc & (spc - 1) or nfats == 0 or reserved == 0:
        return None
    if media != 0xF0 and media < 0xF8:
        return None
    if fatsz16:
        return 38, (reserved + nfats * fatsz16) * bps, root_entries * 32
    fatsz32, root_cluster = struct.unpack_from("<I", boot, 36)[0], struct.unpack_from("<I", boot, 44)[0]
    if fatsz32 == 0:
        return None
    data_at = (reserved + nfats * fatsz32) * bps
    return 66, data_at + (max(root_cluster, 2) - 2) * spc * bps, spc * bps


def _image_spec(image: str | os.PathLike[str], offset: int) -> str:
    return f"{os.fspath(image)}@@{offset}" if offset else os.fspath(image)


def _run(argv: list[str], *, limit: int = MAX_FILE_BYTES, timeout: float = _TOOL_TIMEOUT) -> bytes:
    """Run an mtools command; its output is read up to ``limit`` bytes, the process killed past it."""
    env = {**os.environ, **_MTOOLS_ENV}
    try:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    except FileNotFoundError as exc:
        raise errors.ImageError(f"{argv[0]} is not installed (Debian package mtools)") from exc
    with proc:
        try:
            assert proc.stdout is not None
            out = proc.stdout.read(limit + 1)
            if len(out) > limit:
                proc.kill()
                raise errors.ImageFormatError(f"{argv[0]} output is larger than {limit} bytes")
            _, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise errors.ImageFormatError(f"{argv[0]} did not finish within {timeout}s") from None
    if proc.returncode != 0:
        message = err.decode("utf-8", "replace").strip().splitlines()
        raise errors.ImageFormatError(f"{argv[0]} failed: {message[-1] if message else f'exit {proc.returncode}'}")
    return out


def read_file(image: str | os.PathLike[str], name: str, *, offset: int = 0, limit: int = MAX_FILE_BYTES) -> bytes:
    """The bytes of ``name`` (a path inside the volume, ``/`` separated) in the FAT volume at ``offset``.

    Raises ImageFormatError when the volume or the file cannot be read, or the
    file is larger than ``limit``.
    """
    if not name or any(part in ("", ".", "..") for part in name.strip("/").split("/")):
        raise ValueError(f"invalid FAT path {name!r}")
    return _run(["mtype", "-i", _image_spec(image, offset), f"::/{name.strip('/')}"], limit=limit)


def list_files(image: str | os.PathLike[str], *, offset: int = 0, limit: int = 4 * 1024 * 1024) -> list[str]:
    """Every file and directory of the FAT volume at ``offset``, as paths relative to its root."""
    out = _run(["mdir", "-/", "-b", "-a", "-i", _image_spec(image, offset), "::/"], limit=limit)
    found = []
    for line in out.decode("utf-8", "replace").splitlines():
        path = line.strip()
        if path.startswith("::/"):
            found.append(path[3:].rstrip("/"))
    return sorted(p for p in found if p)


def write_image(
    files: Mapping[str, bytes | Path],
    *,
    label: str,
    size: int = FLOPPY_BYTES,
    work_dir: str | None = None,
    keep_label_case: bool = False,
) -> bytes:
    """A FAT image of ``size`` bytes (FAT12 for a floppy) labelled ``label`` holding ``files``.

    ``files`` maps relative POSIX paths to bytes (or to a file to copy);
    directories are made as needed and long names are kept (VFAT). Raises
    ImageError when the files do not fit or the label is not a valid FAT
    label (at most 11 characters).

    mformat writes the root-directory label in upper case, and that is the
    label ``blkid`` (so udev's ``/dev/disk/by-label`` and ``lsblk``) report.
    ``keep_label_case`` formats with ``mkfs.vfat`` (dosfstools) instead, which
    keeps it as given: the virtual floppy's ``ir-vfd-dev`` is found by that
    exact name (what Ironic's ``mkfs -t vfat -n ir-vfd-dev`` makes).
    """
    if not label or len(label) > 11 or not label.isascii():
        raise ValueError(f"a FAT label is 1 to 11 ASCII characters, not {label!r}")
    if size % 1024 or size < 64 * 1024:
        raise ValueError(f"a FAT image must be a whole number of KiB and at least 64 KiB, not {size}")
    with tempfile.TemporaryDirectory(prefix="ferrum-fat-", dir=work_dir) as tmp:
        image = Path(tmp) / "fat.img"
        if keep_label_case:
            _run([_mkfs_vfat(), "-C", "-n", label, str(image), str(size // 1024)])
        else:
            with open(image, "wb") as fp:
                fp.truncate(size)
            geometry = ["-f", "1440"] if size == FLOPPY_BYTES else ["-T", str(size // 512)]
            _run(["mformat", "-i", str(image), *geometry, "-v", label, "::"])
        made: set[str] = set()
        for rel in sorted(files):
            parts = [p for p in rel.split("/") if p]
            if not parts or any(p in (".", "..") for p in parts):
                raise ValueError(f"invalid path in FAT image: {rel!r}")
            for depth in range(1, len(parts)):
                folder = "/".join(parts[:depth])
                if folder.casefold() not in made:  # FAT names ignore case: OPENSTACK is openstack
                    _run(["mmd", "-i", str(image), f"::/{folder}"])
                    made.add(folder.casefold())
            content = files[rel]
            if isinstance(content, Path):
                source = content
            else:
                source = Path(tmp) / "file"
                source.write_bytes(content)
            try:
                _run(["mcopy", "-i", str(image), "-o", str(source), f"::/{'/'.join(parts)}"])
            except errors.ImageFormatError as exc:
                raise errors.ImageError(f"cannot add {rel} to the FAT image: {exc.message}") from None
        return image.read_bytes()


def _mkfs_vfat() -> str:
    """mkfs.vfat lives in /usr/sbin, which an unprivileged PATH often lacks."""
    found = shutil.which("mkfs.vfat") or next(
        (p for p in ("/usr/sbin/mkfs.vfat", "/sbin/mkfs.vfat") if os.path.exists(p)), None
    )
    if found is None:
        raise errors.ImageError("mkfs.vfat is not installed (Debian package dosfstools)")
    return found


class FatVolume:
    """The FAT volume at ``offset`` of an image file, read the way Linux's vfat shows it.

    Names keep their case, lookups ignore it (vfat's default), which is what
    a reader of a mounted config drive sees. One ``mdir`` lists the tree at
    open; files are read one at a time with ``mtype``, each up to a limit.
    """

    def __init__(self, image: str | os.PathLike[str], *, offset: int = 0) -> None:
        self._image, self._offset = os.fspath(image), offset
        out = _run(["mdir", "-/", "-b", "-a", "-i", _image_spec(self._image, offset), "::/"], limit=4 * 1024 * 1024)
        self._entries: dict[str, tuple[str, bool]] = {"": ("", True)}  # folded path -> (path as stored, is dir)
        for line in out.decode("utf-8", "replace").splitlines():
            line = line.strip()
            if line.startswith("::/") and len(line) > 3:
                path = line[3:]
                is_dir = path.endswith("/")
                path = path.rstrip("/")
                self._entries[path.casefold()] = (path, is_dir)
                parts = path.split("/")
                for depth in range(1, len(parts)):  # parents of a listed file are directories
                    folder = "/".join(parts[:depth])
                    self._entries.setdefault(folder.casefold(), (folder, True))

    def files(self) -> list[str]:
        return sorted(path for path, is_dir in self._entries.values() if not is_dir)

    def is_dir(self, path: str) -> bool:
        entry = self._entries.get(path.strip("/").casefold())
        return entry is not None and entry[1]

    def listdir(self, path: str) -> list[str]:
        path = path.strip("/").casefold()
        if not self.is_dir(path):
            raise FileNotFoundError(path)
        prefix = f"{path}/" if path else ""
        return sorted(
            stored.rsplit("/", 1)[-1]
            for folded, (stored, _) in self._entries.items()
            if folded and folded.startswith(prefix) and "/" not in folded[len(prefix) :]
        )

    def read(self, path: str, *, limit: int = MAX_FILE_BYTES) -> bytes:
        entry = self._entries.get(path.strip("/").casefold())
        if entry is None or entry[1]:
            raise FileNotFoundError(path)
        return read_file(self._image, entry[0], offset=self._offset, limit=limit)
