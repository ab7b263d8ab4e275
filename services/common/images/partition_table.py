"""Read a disk's partition table (GPT or MBR) and its partitions' labels, in pure Python.

The agent must decide where the config drive goes before it changes
anything, on a plain file as well as on a block device, without loop devices
or ``lsblk``. So this module parses the tables itself and probes each
partition's content for the labels ``blkid`` would report (ISO9660 volume id,
FAT label, ext2/3/4 label), mirroring IPA's ``lsblk -Po name,label`` search.
"""

from __future__ import annotations

import binascii
import fcntl
import os
import stat
import struct
import uuid
from dataclasses import dataclass, field
from typing import BinaryIO

from services.common import errors
from services.common.images import iso9660

_BLKSSZGET = 0x1268  # logical sector size of a block device
_GPT_SIGNATURE = b"EFI PART"
_MBR_EXTENDED = frozenset({0x05, 0x0F, 0x85})
_MBR_PROTECTIVE = 0xEE
_MAX_LOGICAL = 128  # bound on an EBR chain (a loop in it must not hang us)


@dataclass(frozen=True)
class Partition:
    number: int  # 1-based, as the kernel numbers it (GPT entry index + 1, MBR slot + 1, logicals from 5)
    start: int  # first sector
    sectors: int
    kind: str  # "gpt" | "primary" | "extended" | "logical"
    type_id: str  # GPT type GUID or MBR type byte as two hex digits
    name: str = ""  # GPT partition name
    labels: tuple[str, ...] = ()  # filesystem labels found in the content

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
        return struct.unpack("i", buf)[0]
    return 512


def read_partition_table(fp: BinaryIO, *, sector_size: int = 512) -> PartitionTable:
    """The GPT or MBR partition table of the disk open in ``fp``, labels included.

    Raises ConfigDriveError when there is no table, or a GPT header is corrupt.
    """
    disk_bytes = fp.seek(0, os.SEEK_END)
    disk_sectors = disk_bytes // sector_size
    fp.seek(0)
    mbr = fp.read(512)
    if len(mbr) < 512 or mbr[510:512] != b"\x55\xaa":
        raise errors.ConfigDriveError("the disk has no partition table (no MBR signature in sector 0)")
    entries = [mbr[446 + 16 * i : 462 + 16 * i] for i in range(4)]
    if any(e[4] == _MBR_PROTECTIVE for e in entries):
        return _read_gpt(fp, sector_size, disk_sectors)
    return _read_mbr(fp, entries, sector_size, disk_sectors)


def _read_gpt(fp: BinaryIO, ss: int, disk_sectors: int) -> PartitionTable:
    fp.seek(ss)
    header = fp.read(ss)
    if header[:8] != _GPT_SIGNATURE:
        raise errors.ConfigDriveError("protective MBR found but no GPT header at LBA 1")
    size = struct.unpack_from("<I", header, 12)[0]
    if not 92 <= size <= ss:
        raise errors.ConfigDriveError(f"GPT header size {size} is invalid")
    crc = struct.unpack_from("<I", header, 16)[0]
    if binascii.crc32(header[:16] + b"\0\0\0\0" + header[20:size]) != crc:
        raise errors.ConfigDriveError("the primary GPT header is corrupt (bad CRC)")
    (backup_lba, first_usable, last_usable) = struct.unpack_from("<QQQ", header, 32)
    entries_lba, count, esize = struct.unpack_from("<QII", header, 72)
    if backup_lba >= disk_sectors:
        raise errors.ConfigDriveError(
            f"the GPT says the disk has {backup_lba + 1} sectors but it has only {disk_sectors}: "
            "the image is larger than the disk"
        )
    if esize < 128 or count > 4096:
        raise errors.ConfigDriveError(f"unsupported GPT entry layout ({count} entries of {esize} bytes)")
    fp.seek(entries_lba * ss)
    raw = fp.read(count * esize)
    if binascii.crc32(raw) != struct.unpack_from("<I", header, 88)[0]:
        raise errors.ConfigDriveError("the GPT partition entry array is corrupt (bad CRC)")
    parts, free = [], []
    for index in range(count):
        entry = raw[index * esize : (index + 1) * esize]
        type_guid = uuid.UUID(bytes_le=entry[:16])
        if type_guid.int == 0:
            free.append(index + 1)
            continue
        first, last = struct.unpack_from("<QQ", entry, 32)
        name = entry[56:128].decode("utf-16-le", "replace").split("\x00", 1)[0]
        parts.append(
            Partition(
                number=index + 1,
                start=first,
                sectors=last - first + 1,
                kind="gpt",
                type_id=str(type_guid).upper(),
                name=name,
                labels=probe_labels(fp, first * ss),
            )
        )
    return PartitionTable(
        table="gpt",
        sector_size=ss,
        disk_sectors=disk_sectors,
        partitions=tuple(parts),
        free_slots=tuple(free),
        first_usable=first_usable,
        last_usable=last_usable,
        backup_lba=backup_lba,
        entry_count=count,
        entry_size=esize,
    )


def _read_mbr(fp: BinaryIO, entries: list[bytes], ss: int, disk_sectors: int) -> PartitionTable:
    parts, free = [], []
    for slot, entry in enumerate(entries, start=1):
        ptype = entry[4]
        start, count = struct.unpack_from("<II", entry, 8)
        if ptype == 0 or count == 0:
            free.append(slot)
            continue
        if ptype in _MBR_EXTENDED:
            parts.append(Partition(number=slot, start=start, sectors=count, kind="extended", type_id=f"{ptype:02x}"))
            parts.extend(_read_logicals(fp, start, ss))
        else:
            parts.append(
                Partition(
                    number=slot,
                    start=start,
                    sectors=count,
                    kind="primary",
                    type_id=f"{ptype:02x}",
                    labels=probe_labels(fp, start * ss),
                )
            )
    return PartitionTable(
        table="mbr", sector_size=ss, disk_sectors=disk_sectors, partitions=tuple(parts), free_slots=tuple(free)
    )


def _read_logicals(fp: BinaryIO, ext_start: int, ss: int) -> list[Partition]:
    found: list[Partition] = []
    ebr_rel = 0
    seen: set[int] = set()
    while len(found) < _MAX_LOGICAL and ebr_rel not in seen:
        seen.add(ebr_rel)
        ebr_lba = ext_start + ebr_rel
        fp.seek(ebr_lba * ss)
        ebr = fp.read(512)
        if len(ebr) < 512 or ebr[510:512] != b"\x55\xaa":
            break
        ptype = ebr[446 + 4]
        rel, count = struct.unpack_from("<II", ebr, 446 + 8)
        if ptype and count:
            start = ebr_lba + rel
            found.append(
                Partition(
                    number=5 + len(found),
                    start=start,
                    sectors=count,
                    kind="logical",
                    type_id=f"{ptype:02x}",
                    labels=probe_labels(fp, start * ss),
                )
            )
        next_rel, next_count = struct.unpack_from("<II", ebr, 462 + 8)
        if not ebr[462 + 4] or not next_count:
            break
        ebr_rel = next_rel
    return found


def probe_labels(fp: BinaryIO, offset: int) -> tuple[str, ...]:
    """Filesystem labels of the content at byte ``offset``: ISO9660, FAT or ext2/3/4."""
    labels = iso9660.volume_labels(fp, offset)
    if not labels:
        labels = _fat_labels(fp, offset)
    if not labels:
        fp.seek(offset + 1024)
        sb = fp.read(136)
        if len(sb) == 136 and sb[56:58] == b"\x53\xef":
            label = sb[120:136].split(b"\x00", 1)[0].decode("utf-8", "replace")
            labels = [label] if label else []
    return tuple(dict.fromkeys(label for label in labels if label))


def _fat_labels(fp: BinaryIO, offset: int) -> list[str]:
    fp.seek(offset)
    boot = fp.read(512)
    if len(boot) < 512 or boot[510:512] != b"\x55\xaa":
        return []
    bps, spc, reserved, nfats, root_entries, _total16, _media, fatsz16 = struct.unpack_from("<HBHBHHBH", boot, 11)
    if bps not in (512, 1024, 2048, 4096) or spc == 0 or spc & (spc - 1) or nfats == 0 or reserved == 0:
        return []
    if fatsz16:
        ext, root_at, root_len = 38, offset + (reserved + nfats * fatsz16) * bps, root_entries * 32
    else:
        fatsz32, root_cluster = struct.unpack_from("<I", boot, 36)[0], struct.unpack_from("<I", boot, 44)[0]
        data_at = offset + (reserved + nfats * fatsz32) * bps
        ext, root_at, root_len = 66, data_at + (max(root_cluster, 2) - 2) * spc * bps, spc * bps
    labels = []
    fp.seek(root_at)
    root = fp.read(min(root_len, 64 * 1024))
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
