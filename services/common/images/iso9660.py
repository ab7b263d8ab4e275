"""ISO9660 images in pure Python (pycdlib): write a file tree, read one back with bounds.

Config drives must be readable by the Linux kernel's isofs (cloud-init mounts
the ``config-2`` device) and by tools that only know Joliet (cloudbase-init),
so every image carries Rock Ridge and Joliet names next to the ISO9660 level 3
ones. Files with identical content share one extent (the two metadata version
directories hold the same files), which halves the size of big drives.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import struct
from collections.abc import Mapping
from pathlib import Path
from typing import BinaryIO, Self

import pycdlib
import pycdlib.pycdlibexception

from services.common import errors

SECTOR = 2048
PVD_OFFSET = 16 * SECTOR  # the first volume descriptor follows a 32 KiB system area
_STANDARD_ID = b"CD001"
_MAX_DESCRIPTORS = 32  # a bound on the volume descriptor set we are willing to walk
_COPY_BLOCK = 4 * 1024 * 1024  # pycdlib copies file data in blocks of this size
_NOT_D_CHARS = re.compile(r"[^A-Z0-9_]")
MAX_ENTRIES = 100_000  # names in one image we are willing to index (a config drive has a dozen)
MAX_FILE_BYTES = 64 * 1024 * 1024  # default bound on one file read whole (the config drive limit)
MAX_TOTAL_BYTES = 128 * 1024 * 1024  # default bound on all files read whole from one image
# What pycdlib raises on malformed images besides its own exceptions (found by the fuzz tests).
_PARSE_ERRORS: tuple[type[Exception], ...] = (
    pycdlib.pycdlibexception.PyCdlibException,
    ValueError,
    IndexError,
    KeyError,
    struct.error,
    UnicodeError,
    AttributeError,
    TypeError,
    OverflowError,
    RecursionError,
    OSError,
)


def is_iso9660(head: bytes) -> bool:
    """True when ``head`` (at least the first 34 KiB of a volume) starts an ISO9660 image."""
    return (
        len(head) >= PVD_OFFSET + 7 and head[PVD_OFFSET] == 1 and head[PVD_OFFSET + 1 : PVD_OFFSET + 6] == _STANDARD_ID
    )


def volume_labels(fp: BinaryIO, offset: int = 0) -> list[str]:
    """The volume identifiers of the ISO9660 image at ``offset``: primary, then Joliet.

    ``blkid`` (and so ``lsblk``, which IPA uses) may report either, so a
    config-2 search checks both. An empty list means "not ISO9660".
    """
    labels: list[str] = []
    for index in range(_MAX_DESCRIPTORS):
        fp.seek(offset + PVD_OFFSET + index * SECTOR)
        desc = fp.read(SECTOR)
        if len(desc) < SECTOR or desc[1:6] != _STANDARD_ID:
            break
        kind = desc[0]
        if kind == 255:  # set terminator
            break
        if kind == 1:
            labels.append(desc[40:72].decode("ascii", "replace").strip(" \x00"))
        elif kind == 2 and desc[88:91] in (b"%/@", b"%/C", b"%/E"):  # Joliet escape sequences
            labels.append(desc[40:72].decode("utf-16-be", "replace").strip(" \x00"))
    return labels


def volume_size(fp: BinaryIO, offset: int = 0) -> int:
    """Bytes the ISO9660 image at ``offset`` occupies (volume space size × block size)."""
    fp.seek(offset + PVD_OFFSET)
    pvd = fp.read(SECTOR)
    if len(pvd) < SECTOR or pvd[0] != 1 or pvd[1:6] != _STANDARD_ID:
        raise ValueError("no ISO9660 primary volume descriptor")
    blocks = int.from_bytes(pvd[80:84], "little")
    block_size = int.from_bytes(pvd[128:130], "little")
    return blocks * block_size


def _iso_name(name: str, *, is_dir: bool) -> str:
    """An ISO9660 level 3 identifier for ``name`` (upper-case d-characters, one dot)."""
    if is_dir:
        return _NOT_D_CHARS.sub("_", name.upper())[:31] or "_"
    stem, dot, ext = name.rpartition(".")
    if not dot:
        stem, ext = name, ""
    stem = _NOT_D_CHARS.sub("_", stem.upper()) or "_"
    ext = _NOT_D_CHARS.sub("_", ext.upper())[:8]
    return f"{stem[: 30 - len(ext) - 1]}.{ext}"


class IsoTree:
    """Files added to a new pycdlib image under their real names.

    Each file gets an ISO9660 level 3 identifier (made unique when two long
    names fold to the same one) and keeps its full spelling in Rock Ridge and
    Joliet; parent directories are made as needed. With ``share_identical``,
    files given as bytes with the same content are stored once (hard links).
    The config drive and the boot ISO builders both add their files here.
    """

    def __init__(self, iso: pycdlib.PyCdlib, *, share_identical: bool = True) -> None:
        self._iso = iso
        self._share = share_identical
        self._dirs: dict[str, str] = {"": ""}
        self._used: set[str] = set()
        self._files: dict[str, str] = {}
        self._stored: dict[tuple[int, bytes, bytes], list[tuple[bytes, str]]] = {}

    def iso_path(self, rel_path: str) -> str:
        """The ISO9660 path a file was added under (what El Torito entries name)."""
        return self._files[rel_path.strip("/")]

    def add_directory(self, rel_path: str) -> str:
        parts = _parts(rel_path)
        parent = ""
        for depth, part in enumerate(parts):
            key = "/".join(parts[: depth + 1])
            if key not in self._dirs:
                iso_path = _unique(f"{self._dirs[parent]}/{_iso_name(part, is_dir=True)}", self._used, "")
                self._iso.add_directory(iso_path, rr_name=part, joliet_path="/" + key)
                self._dirs[key] = iso_path
            parent = key
        return self._dirs[parent]

    def add(self, rel_path: str, data: bytes | Path) -> str:
        """Add one file (bytes, or a file read when the image is written); returns its ISO9660 path."""
        parts = _parts(rel_path)
        parent = self.add_directory("/".join(parts[:-1])) if len(parts) > 1 else ""
        iso_path = _unique(f"{parent}/{_iso_name(parts[-1], is_dir=False)}", self._used, ";1")
        joliet = "/" + "/".join(parts)
        if isinstance(data, Path):
            self._iso.add_file(str(data), iso_path, rr_name=parts[-1], joliet_path=joliet)
        else:
            first = _stored_copy(self._stored, data) if self._share else None
            if first is None:
                self._iso.add_fp(io.BytesIO(data), len(data), iso_path, rr_name=parts[-1], joliet_path=joliet)
                self._stored.setdefault(_content_key(data), []).append((data, iso_path))
            else:
                self._iso.add_hard_link(iso_old_path=first, iso_new_path=iso_path, rr_name=parts[-1])
                self._iso.add_hard_link(iso_old_path=first, joliet_new_path=joliet)
        self._files["/".join(parts)] = iso_path
        return iso_path


def _parts(rel_path: str) -> list[str]:
    parts = [p for p in rel_path.split("/") if p]
    if not parts or any(p in (".", "..") for p in parts):
        raise ValueError(f"invalid path in ISO: {rel_path!r}")
    return parts


def write_iso(
    files: Mapping[str, bytes], *, label: str, publisher: str = "Ferrum", share_identical: bool = True
) -> bytes:
    """An ISO9660 image (Rock Ridge 1.09 + Joliet) holding ``files`` (relative POSIX path -> bytes).

    Directories are created as needed. Names longer than ISO9660 allows keep
    their full spelling in Rock Ridge and Joliet, which is what readers use.
    With ``share_identical`` files with the same bytes are stored once.
    """
    iso = pycdlib.PyCdlib()
    iso.new(
        interchange_level=3,
        vol_ident=label,
        joliet=3,
        rock_ridge="1.09",
        pub_ident_str=publisher,
        app_ident_str="Ferrum config drive builder",
    )
    try:
        tree = IsoTree(iso, share_identical=share_identical)
        for rel_path in sorted(files):
            tree.add(rel_path, files[rel_path])
        out = io.BytesIO()
        iso.write_fp(out, blocksize=_COPY_BLOCK)
        return out.getvalue()
    finally:
        iso.close()


def _content_key(data: bytes) -> tuple[int, bytes, bytes]:
    return len(data), data[:64], data[-64:]


def _stored_copy(stored: dict[tuple[int, bytes, bytes], list[tuple[bytes, str]]], data: bytes) -> str | None:
    """The ISO path of a file already added with exactly these bytes (a cheap key, then memcmp)."""
    for other, iso_path in stored.get(_content_key(data), ()):
        if other is data or other == data:
            return iso_path
    return None


def _unique(path: str, used: set[str], suffix: str) -> str:
    """``path`` + ``suffix``, with a numeric tail when two long names fold to the same identifier."""
    candidate = path + suffix
    number = 0
    while candidate.upper() in used:
        number += 1
        head, _, tail = path.rpartition("/")
        stem, dot, ext = tail.rpartition(".")
        tag = f"_{number}"
        if dot:
            candidate = f"{head}/{stem[: max(1, len(stem) - len(tag))]}{tag}.{ext}{suffix}"
        else:
            candidate = f"{head}/{tail[: max(1, len(tail) - len(tag))]}{tag}{suffix}"
    used.add(candidate.upper())
    return candidate


class IsoVolume:
    """An ISO9660 image opened for reading, with the names the Linux kernel shows.

    Rock Ridge names are used when present, then Joliet, then ISO9660 names
    folded to lower case without their ``;1`` version (``map=normal``): the
    order in which the kernel's isofs picks them, and so what cloud-init sees
    on a mounted config drive. The image is untrusted: parsing failures of any
    kind become ImageFormatError, the directory tree is capped at
    ``max_entries`` names, and a file is read only up to a caller's limit.
    Use as a context manager (or call ``close``).
    """

    def __init__(self, fp: BinaryIO, *, max_entries: int = MAX_ENTRIES) -> None:
        self._iso = pycdlib.PyCdlib()
        try:
            self._iso.open_fp(fp)
        except _PARSE_ERRORS as exc:
            raise errors.ImageFormatError(f"not a readable ISO9660 image: {exc}") from None
        try:
            self._kind, self._entries = self._index(max_entries)
        except BaseException:
            self.close()
            raise

    def _index(self, max_entries: int) -> tuple[str, dict[str, tuple[str, bool]]]:
        iso = self._iso
        try:
            kind = "rr_path" if iso.has_rock_ridge() else "joliet_path" if iso.has_joliet() else "iso_path"
            entries: dict[str, tuple[str, bool]] = {"": ("/", True)}
            for dirpath, dirnames, filenames in iso.walk(**{kind: "/"}):
                base = dirpath.rstrip("/")
                for name, is_dir in [*((d, True) for d in dirnames), *((f, False) for f in filenames)]:
                    source = f"{base}/{name}"
                    rel = source.lstrip("/")
                    if kind == "iso_path":
                        rel = "/".join(_plain_name(part) for part in rel.split("/"))
                    entries.setdefault(rel, (source, is_dir))
                    if len(entries) > max_entries:
                        raise errors.ImageFormatError(f"the ISO9660 image has more than {max_entries} names")
            return kind, entries
        except _PARSE_ERRORS as exc:
            raise errors.ImageFormatError(f"the ISO9660 directory tree is corrupt: {exc}") from None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        with contextlib.suppress(*_PARSE_ERRORS):  # closing a half-opened image: nothing to release
            self._iso.close()

    def files(self) -> list[str]:
        """Every file's relative path."""
        return sorted(rel for rel, (_, is_dir) in self._entries.items() if not is_dir)

    def is_dir(self, path: str) -> bool:
        entry = self._entries.get(path.strip("/"))
        return entry is not None and entry[1]

    def listdir(self, path: str) -> list[str]:
        """Names in the directory ``path`` (relative, ``""`` for the root); FileNotFoundError when absent."""
        path = path.strip("/")
        if not self.is_dir(path):
            raise FileNotFoundError(path)
        prefix = f"{path}/" if path else ""
        return sorted(
            rel[len(prefix) :]
            for rel in self._entries
            if rel.startswith(prefix) and "/" not in rel[len(prefix) :] and rel
        )

    def size(self, path: str) -> int:
        """The file's length in bytes; FileNotFoundError when there is no such file."""
        source, _ = self._file(path)
        try:
            return int(self._iso.get_record(**{self._kind: source}).get_data_length())
        except _PARSE_ERRORS as exc:
            raise errors.ImageFormatError(f"cannot read the ISO9660 record of {path}: {exc}") from None

    def read(self, path: str, *, limit: int = MAX_FILE_BYTES) -> bytes:
        """The bytes of file ``path``; ImageFormatError when it is larger than ``limit`` or unreadable."""
        length = self.size(path)
        if length > limit:
            raise errors.ImageFormatError(f"{path} in the ISO9660 image is {length} bytes, more than {limit}")
        source, _ = self._file(path)
        out = io.BytesIO()
        try:
            self._iso.get_file_from_iso_fp(out, **{self._kind: source})
        except _PARSE_ERRORS as exc:
            raise errors.ImageFormatError(f"cannot read {path} from the ISO9660 image: {exc}") from None
        return out.getvalue()[:length]

    def _file(self, path: str) -> tuple[str, bool]:
        entry = self._entries.get(path.strip("/"))
        if entry is None or entry[1]:
            raise FileNotFoundError(path)
        return entry


def _plain_name(name: str) -> str:
    """An ISO9660 name as Linux shows it without Rock Ridge/Joliet: lower case, no ``;1``, no trailing dot."""
    return name.split(";", 1)[0].rstrip(".").lower()


def read_iso_files(
    fp: BinaryIO, *, max_file_bytes: int = MAX_FILE_BYTES, max_total_bytes: int = MAX_TOTAL_BYTES
) -> dict[str, bytes]:
    """Every file of the ISO9660 image in ``fp`` as relative path -> bytes (see :class:`IsoVolume` for names).

    Files are read whole, so the sizes are bounded: one file at most
    ``max_file_bytes``, all of them at most ``max_total_bytes`` (hard links
    make a small image claim many large files). Raises ImageFormatError past
    either bound or when the image does not parse.
    """
    with IsoVolume(fp) as volume:
        found: dict[str, bytes] = {}
        total = 0
        for rel in volume.files():
            total += volume.size(rel)
            if total > max_total_bytes:
                raise errors.ImageFormatError(
                    f"the files of the ISO9660 image add up to more than {max_total_bytes} bytes"
                )
            found[rel] = volume.read(rel, limit=max_file_bytes)
        return found


def extract_iso(fp: BinaryIO, dest: str | os.PathLike[str]) -> list[str]:
    """Write every file of the ISO in ``fp`` under ``dest``; returns the relative paths written."""
    root = Path(dest).resolve()
    written = []
    for rel, data in read_iso_files(fp).items():
        target = (root / rel).resolve()
        if root not in target.parents:
            raise ValueError(f"ISO path escapes the destination: {rel!r}")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
        written.append(rel)
    return sorted(written)
