"""A disk's partition table (GPT or MBR with logical partitions) and what each partition holds, in pure Python.

The one reader for every caller: the agent decides where the config drive
goes and reports partition UUIDs (IPA's ``get_partition_uuids``), and the
simulator reports what a booting OS finds. It runs on a plain file as well as
on a block device, without loop devices, ``lsblk`` or ``sfdisk``. The bytes
come from whatever image was written, so every size and count read from them
is checked against the disk before it is used: the GPT entry array is at most
4 MiB, an EBR chain at most 128 links and loop-free, and partitions that lie
beyond the disk's end are kept (a finding) but never probed.
"""

from __future__ import annotations

import binascii
import fcntl
import os
import stat
import struct
import uuid
from dataclasses import dataclass, field, replace
from typing import BinaryIO

from services.common import errors
from services.common.images import filesystems

_BLKSSZGET = 0x1268  # logical sector size of a block device
_GPT_SIGNATURE = b"EFI PART"
_MBR_EXTENDED = frozenset({0x05, 0x0F, 0x85})
_MBR_PROTECTIVE = 0xEE
_MAX_LOGICAL = 128  # bound on an EBR chain (a loop in it must not hang us)
_MAX_GPT_ENTRIES = 4096
_MAX_GPT_ARRAY = 4 * 1024 * 1024  # bytes of GPT entry array we are willing to read (128 KiB is usual)

# Well-known GPT partition types, for reports (IPA and the simulator name them).
GPT_TYPE_NAMES = {
    "C12A7328-F81F-11D2-BA4B-00A0C93EC93B": "efi",
    "21686148-6449-6E6F-744E-656564454649": "bios_boot",
    "0FC63DAF-8483-4772-8E79-3D69D8477DE4": "linux",
    "0657FD6D-A4AB-43C4-84E5-0933C84B4F4F": "linux_swap",
    "EBD0A0A2-B9E5-4433-87C0-68B6B72699C7": "basic_data",
    "9E1A2D38-C612-4316-AA26-8B49521E5A8B": "prep",
}


@dataclass(frozen=True)
class Partition:
    number: int  # 1-based, as the kernel numbers it (GPT entry index + 1, MBR slot + 1, logicals from 5)
    start: int  # first sector
    sectors: int
    kind: str  # "gpt" | "primary" | "extended" | "logical"
    type_id: str  # GPT type GUID (upper case) or MBR type byte as two hex digits
    name: str = ""  # GPT partition name
    labels: tuple[str, ...] = ()  # filesystem labels found in the content
    uuid: str = ""  # GPT unique partition GUID (lower case), or blkid's MBR PARTUUID "<disk id>-<number hex>"
    filesystem: str = ""  # what the content holds (see filesystems.probe); "" when unknown or not probed
    beyond_end: bool = False  # the table places it (partly) past the disk's end

    @property
    def end(self) -> int:
        """Last sector (inclusive)."""
        return self.start + self.sectors - 1


@dataclass(frozen=True)
class PartitionTable:
    table: str  # "gpt" | "mbr"
    sector_size: int
    disk_sectors: int
    partitions: tuple[Partition, ...] = field(default_factory=tuple)
    free_slots: tuple[int, ...] = ()  # GPT entry numbers or MBR primary slots (1-4) not in use
    disk_id: str = ""  # GPT disk GUID (lower case) or the MBR disk signature as 8 hex digits
    # GPT only:
    first_usable: int = 0
    last_usable: int = 0
    backup_lba: int = 0
    entry_count: int = 0
    entry_size: int = 0

    @property
    def backup_at_end(self) -> bool:
        return self.table != "gpt" or self.backup_lba == self.disk_sectors - 1


def sector_size_of(fd: int) -> int:
    """The logical sector size: from the kernel for block devices, 512 for image files."""
    if stat.S_ISBLK(os.fstat(fd).st_mode):
        buf = fcntl.ioctl(fd, _BLKSSZGET, b"\0" * 4)
        size: int = struct.unpack("i", buf)[0]
        return size
    return 512


def table_kind(fp: BinaryIO) -> str | None:
    """ "gpt", "mbr" or None from sector 0 alone: what the table claims to be, valid or not."""
    fp.seek(0)
    mbr = fp.read(512)
    if len(mbr) < 512 or mbr[510:512] != b"\x55\xaa":
        return None
    return "gpt" if any(mbr[446 + 16 * i + 4] == _MBR_PROTECTIVE for i in range(4)) else "mbr"


def read_partition_table(fp: BinaryIO, *, sector_size: int = 512) -> PartitionTable:
    """The GPT or MBR partition table of the disk open in ``fp``, file systems and labels included.

    Raises ImageFormatError when there is no table, or the GPT is corrupt or
    does not fit the disk.
    """
    if sector_size not in (512, 1024, 2048, 4096):
        raise ValueError(f"unsupported sector size {sector_size}")
    disk_bytes = fp.seek(0, os.SEEK_END)
    disk_sectors = disk_bytes // sector_size
    fp.seek(0)
    mbr = fp.read(512)
    if len(mbr) < 512 or mbr[510:512] != b"\x55\xaa":
        raise errors.ImageFormatError("the disk has no partition table (no MBR signature in sector 0)")
    entries = [mbr[446 + 16 * i : 462 + 16 * i] for i in range(4)]
    if any(e[4] == _MBR_PROTECTIVE for e in entries):
        return _read_gpt(fp, sector_size, disk_sectors)
    return _read_mbr(fp, entries, struct.unpack_from("<I", mbr, 440)[0], sector_size, disk_sectors)


def _read_gpt(fp: BinaryIO, ss: int, disk_sectors: int) -> PartitionTable:
    fp.seek(ss)
    header = fp.read(ss)
    if header[:8] != _GPT_SIGNATURE:
        raise errors.ImageFormatError("protective MBR found but no GPT header at LBA 1")
    size = struct.unpack_from("<I", header, 12)[0]
    if not 92 <= size <= ss:
        raise errors.ImageFormatError(f"GPT header size {size} is invalid")
    crc = struct.unpack_from("<I", header, 16)[0]
    if binascii.crc32(header[:16] + b"\0\0\0\0" + header[20:size]) != crc:
        raise errors.ImageFormatError("the primary GPT header is corrupt (bad CRC)")
    (backup_lba, first_usable, last_usable) = struct.unpack_from("<QQQ", header, 32)
    disk_guid = str(uuid.UUID(bytes_le=header[56:72]))
    entries_lba, count, esize = struct.unpack_from("<QII", header, 72)
    if backup_lba >= disk_sectors:
        raise errors.ImageFormatError(
            f"the GPT says the disk has {backup_lba + 1} sectors but it has only {disk_sectors}: "
            "the image is larger than the disk"
        )
    if esize < 128 or esize % 8 or count > _MAX_GPT_ENTRIES or count * esize > _MAX_GPT_ARRAY:
        raise errors.ImageFormatError(f"unsupported GPT entry layout ({count} entries of {esize} bytes)")
    if entries_lba < 2 or (entries_lba * ss + count * esize) > disk_sectors * ss:
        raise errors.ImageFormatError(f"the GPT entry array at LBA {entries_lba} lies outside the disk")
    fp.seek(entries_lba * ss)
    raw = fp.read(count * esize)
    if binascii.crc32(raw) != struct.unpack_from("<I", header, 88)[0]:
        raise errors.ImageFormatError("the GPT partition entry array is corrupt (bad CRC)")
    parts, free = [], []
    for index in range(count):
        entry = raw[index * esize : (index + 1) * esize]
        type_guid = uuid.UUID(bytes_le=entry[:16])
        if type_guid.int == 0:
            free.append(index + 1)
            continue
        first, last = struct.unpack_from("<QQ", entry, 32)
        if last < first:
            raise errors.ImageFormatError(f"GPT partition {index + 1} ends (sector {last}) before it starts ({first})")
        name = entry[56:128].decode("utf-16-le", "replace").split("\x00", 1)[0]
        parts.append(
            _probed(
                fp,
                Partition(
                    number=index + 1,
                    start=first,
                    sectors=last - first + 1,
                    kind="gpt",
                    type_id=str(type_guid).upper(),
                    name=name,
                    uuid=str(uuid.UUID(bytes_le=entry[16:32])),
                ),
                ss,
                disk_sectors,
            )
        )
    return PartitionTable(
        table="gpt",
        sector_size=ss,
        disk_sectors=disk_sectors,
        partitions=tuple(parts),
        free_slots=tuple(free),
        disk_id=disk_guid,
        first_usable=first_usable,
        last_usable=last_usable,
        backup_lba=backup_lba,
        entry_count=count,
        entry_size=esize,
    )


def _probed(fp: BinaryIO, part: Partition, ss: int, disk_sectors: int) -> Partition:
    """``part`` with its file system and labels, unless the table puts it past the disk's end."""
    if part.end >= disk_sectors:
        return replace(part, beyond_end=True)
    found = filesystems.probe(fp, part.start * ss)
    return replace(part, filesystem=found.kind, labels=found.labels)


def _read_mbr(fp: BinaryIO, entries: list[bytes], signature: int, ss: int, disk_sectors: int) -> PartitionTable:
    disk_id = f"{signature:08x}"
    parts, free = [], []
    for slot, entry in enumerate(entries, start=1):
        ptype = entry[4]
        start, count = struct.unpack_from("<II", entry, 8)
        if ptype == 0 or count == 0:
            free.append(slot)
            continue
        part = Partition(
            number=slot,
            start=start,
            sectors=count,
            kind="primary",
            type_id=f"{ptype:02x}",
            uuid=f"{disk_id}-{slot:02x}",
        )
        if ptype in _MBR_EXTENDED:
            parts.append(replace(part, kind="extended", beyond_end=part.end >= disk_sectors))
            parts.extend(_read_logicals(fp, start, disk_id, ss, disk_sectors))
        else:
            parts.append(_probed(fp, part, ss, disk_sectors))
    return PartitionTable(
        table="mbr",
        sector_size=ss,
        disk_sectors=disk_sectors,
        partitions=tuple(parts),
        free_slots=tuple(free),
        disk_id=disk_id,
    )


def _read_logicals(fp: BinaryIO, ext_start: int, disk_id: str, ss: int, disk_sectors: int) -> list[Partition]:
    found: list[Partition] = []
    ebr_rel = 0
    seen: set[int] = set()
    while len(found) < _MAX_LOGICAL and ebr_rel not in seen and ext_start + ebr_rel < disk_sectors:
        seen.add(ebr_rel)
        ebr_lba = ext_start + ebr_rel
        fp.seek(ebr_lba * ss)
        ebr = fp.read(512)
        if len(ebr) < 512 or ebr[510:512] != b"\x55\xaa":
            break
        ptype = ebr[446 + 4]
        rel, count = struct.unpack_from("<II", ebr, 446 + 8)
        if ptype and count:
            number = 5 + len(found)
            part = Partition(
                number=number,
                start=ebr_lba + rel,
                sectors=count,
                kind="logical",
                type_id=f"{ptype:02x}",
                uuid=f"{disk_id}-{number:02x}",
            )
            found.append(_probed(fp, part, ss, disk_sectors))
        next_rel, next_count = struct.unpack_from("<II", ebr, 462 + 8)
        if not ebr[462 + 4] or not next_count:
            break
        ebr_rel = next_rel
    return found
