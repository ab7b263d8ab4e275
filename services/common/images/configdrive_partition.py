"""Put the config drive on a disk that already holds a whole-disk image (CONTRACT 3.4).

The image and Ferrum share one contract (seed 001): a partition labelled
``config-2``. If the image brought exactly one, it is reused; otherwise one is
made in the last 64 MiB of the disk. The plan is computed from the partition
table parsed in Python before anything is changed, so a refusal (two
config-2 partitions, no free MBR slot, no room) leaves the disk untouched.
``sgdisk``/``sfdisk`` then do the table edit on the file or block device
itself: no loop device, no mount.

Synchronous on purpose: callers run it in a thread (``asyncio.to_thread``).
"""

from __future__ import annotations

import logging
import os
import stat
import subprocess
from dataclasses import dataclass
from pathlib import Path

from services.common import errors
from services.common.images import fat, iso9660
from services.common.images.configdrive import LABEL, MAX_CONFIGDRIVE_BYTES, NOT_A_DRIVE, drive_format
from services.common.images.partition_table import (
    Partition,
    PartitionTable,
    read_partition_table,
    sector_size_of,
)

LOG = logging.getLogger(__name__)

ConfigDriveError = errors.ConfigDriveError

MiB = 1024 * 1024
REGION_BYTES = 64 * MiB  # "the last 64 MiB of the disk"
MBR_LIMIT_BYTES = 2 * 1024 * 1024 * MiB  # 2 TiB: what 32-bit MBR sector fields reach with 512-byte sectors
GPT_TYPE = "8300"  # Linux filesystem data, sgdisk's default (as IPA leaves it)
MBR_TYPE = "c"  # W95 FAT32 (LBA), what IPA's "parted mkpart primary fat32" sets
_TOOL_TIMEOUT = 120
_WRITE_CHUNK = 4 * MiB


@dataclass(frozen=True)
class ConfigDrivePlacement:
    table: str  # "gpt" | "mbr"
    partition_number: int
    start_byte: int
    size_bytes: int
    created: bool  # False when an existing config-2 partition was reused


def _is_config2(part: Partition) -> bool:
    names = (part.name, *part.labels)
    return any(n.strip().lower() == LABEL for n in names)


def _iso_bytes(iso: bytes | str | os.PathLike[str]) -> bytes:
    data = bytes(iso) if isinstance(iso, (bytes, bytearray, memoryview)) else Path(iso).read_bytes()
    if len(data) > MAX_CONFIGDRIVE_BYTES:
        raise ConfigDriveError(
            f"Config drive size exceeds maximum limit of {MAX_CONFIGDRIVE_BYTES // MiB}MiB ({len(data)} bytes)"
        )
    if drive_format(data) is None:
        raise ConfigDriveError(f"the config drive to write is {NOT_A_DRIVE}")
    return data


def _align_down(value: int, unit: int) -> int:
    return value - value % unit


def _align_up(value: int, unit: int) -> int:
    return _align_down(value + unit - 1, unit)


def plan_new_partition(table: PartitionTable, iso_size: int) -> tuple[int, int, int]:
    """(partition number, first sector, sector count) for a new config-2 partition.

    The partition takes the last 64 MiB of the disk (for GPT, up to the last
    usable sector once the backup header sits at the real end). When the
    image's own partitions reach into that region but the drive still fits
    after them, it starts at the first 1 MiB boundary after the last one (a
    disk barely larger than the image). MBR disks over 2 TiB get it just
    below the 2 TiB limit, as IPA does (2097087 MiB to 2097151 MiB).
    """
    ss = table.sector_size
    align = max(1, MiB // ss)
    need = -(-iso_size // ss)
    if table.table == "gpt":
        if not table.free_slots:
            raise ConfigDriveError(
                f"all {table.entry_count} GPT partition entries are in use; no entry is left for the config drive"
            )
        number = table.free_slots[0]
        entry_sectors = -(-table.entry_count * table.entry_size // ss)
        end_excl = table.disk_sectors - 1 - entry_sectors  # after moving the backup header to the end
        want = _align_down(table.disk_sectors - REGION_BYTES // ss, align)
        floor = table.first_usable
    else:
        primaries = [p for p in table.partitions if p.kind in ("primary", "extended")]
        if not table.free_slots:
            described = ", ".join(f"{p.number} (type {p.type_id})" for p in primaries)
            raise ConfigDriveError(
                "cannot create the config drive partition: all four primary partition slots of the MBR "
                f"partition table are in use ({described}); the image must leave one free or carry a "
                f"partition labelled {LABEL}"
            )
        number = table.free_slots[0]
        limit_sectors = MBR_LIMIT_BYTES // ss
        if table.disk_sectors > limit_sectors:
            end_excl = limit_sectors - align  # 2097151 MiB
        else:
            end_excl = table.disk_sectors
        want = _align_down(end_excl - REGION_BYTES // ss, align)
        floor = align
    start = min(want, _align_down(end_excl - need, align))
    used_end = max([floor - 1, *(p.end for p in table.partitions)])
    if start <= used_end:
        overlapping = [p for p in table.partitions if p.end >= start]
        start = _align_up(used_end + 1, align)
        if start + need > end_excl:
            free = max(0, end_excl - start) * ss
            culprit = ", ".join(f"{p.number} (sectors {p.start}-{p.end})" for p in overlapping)
            raise ConfigDriveError(
                f"no room for the config drive at the end of the disk: it needs {need * ss} bytes but only "
                f"{free} bytes are free after partition(s) {culprit} "
                f"(disk {table.disk_sectors * ss} bytes)"
            )
    if start < floor or start + need > end_excl:
        raise ConfigDriveError(
            f"the disk ({table.disk_sectors * ss} bytes) is too small for a config drive of {iso_size} bytes"
        )
    return number, start, end_excl - start


def _run(argv: list[str], *, stdin: str | None = None) -> str:
    try:
        done = subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=_TOOL_TIMEOUT, check=False)
    except FileNotFoundError as exc:
        raise ConfigDriveError(f"{argv[0]} is not installed; it is needed to edit the partition table") from exc
    except subprocess.TimeoutExpired as exc:
        raise ConfigDriveError(f"{argv[0]} did not finish within {_TOOL_TIMEOUT}s") from exc
    if done.returncode != 0:
        raise ConfigDriveError(
            f"{' '.join(argv)} failed (exit {done.returncode}): {(done.stderr or done.stdout).strip()[-500:]}"
        )
    return done.stdout


def _read_table(device: str) -> PartitionTable:
    with open(device, "rb") as fp:
        try:
            return read_partition_table(fp, sector_size=sector_size_of(fp.fileno()))
        except errors.ImageFormatError as exc:
            raise ConfigDriveError(exc.message) from None


def write_configdrive_partition(
    device: str | os.PathLike[str], iso: bytes | str | os.PathLike[str]
) -> ConfigDrivePlacement:
    """Find or make the ``config-2`` partition on ``device`` and write the ISO into it.

    ``device`` is a disk image file or a block device that already holds the
    written OS image. Exactly one partition labelled ``config-2`` (GPT name or
    ISO9660/FAT/ext label, any case) is overwritten; two or more is an error;
    none means a new one in the last 64 MiB (GPT: backup header moved to the
    real end first; MBR: first free primary slot, below 2 TiB). The ISO is
    written at the partition start and fsynced. Raises ConfigDriveError with
    the cause; the disk is unchanged when the plan is refused.
    """
    path = os.fspath(device)
    data = _iso_bytes(iso)
    table = _read_table(path)
    is_file = stat.S_ISREG(os.stat(path).st_mode)
    ss = table.sector_size
    found = [p for p in table.partitions if _is_config2(p)]
    if len(found) > 1:
        raise ConfigDriveError(
            f"more than one partition labelled {LABEL} on {path}: " + ", ".join(f"partition {p.number}" for p in found)
        )
    if found:
        part = found[0]
        if len(data) > part.sectors * ss:
            raise ConfigDriveError(
                f"the config drive ({len(data)} bytes) is larger than the existing {LABEL} partition "
                f"{part.number} ({part.sectors * ss} bytes)"
            )
        if not table.backup_at_end:
            _run(["sgdisk", "-e", path])
        number, start, sectors, created = part.number, part.start, part.sectors, False
        LOG.info(
            "configdrive_partition device=%s action=reuse partition=%s start=%s size=%s",
            path,
            number,
            start * ss,
            sectors * ss,
        )
    else:
        number, start, sectors = plan_new_partition(table, len(data))
        created = True
        if table.table == "gpt":
            _run(
                [
                    "sgdisk",
                    "-e",
                    "-n",
                    f"{number}:{start}:{start + sectors - 1}",
                    "-c",
                    f"{number}:{LABEL}",
                    "-t",
                    f"{number}:{GPT_TYPE}",
                    path,
                ]
            )
        else:
            quiet = ["--no-reread", "--no-tell-kernel"] if is_file else []
            _run(
                ["sfdisk", *quiet, "--wipe", "never", "--wipe-partitions", "never", "-N", str(number), path],
                stdin=f"start={start}, size={sectors}, type={MBR_TYPE}\n",
            )
        after = _read_table(path)
        made = [p for p in after.partitions if p.number == number]
        if not made or made[0].start != start or made[0].sectors != sectors or not after.backup_at_end:
            raise ConfigDriveError(
                f"the new {LABEL} partition {number} is not where it was planned "
                f"(start sector {start}, {sectors} sectors)"
            )
        LOG.info(
            "configdrive_partition device=%s action=create table=%s partition=%s start=%s size=%s "
            "reason=no_existing_config2",
            path,
            table.table,
            number,
            start * ss,
            sectors * ss,
        )
    _write_at(path, start * ss, data)
    return ConfigDrivePlacement(
        table=table.table, partition_number=number, start_byte=start * ss, size_bytes=sectors * ss, created=created
    )


def _write_at(path: str, offset: int, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        view = memoryview(data)
        done = 0
        while done < len(view):
            done += os.pwrite(fd, view[done : done + _WRITE_CHUNK], offset + done)
        os.fsync(fd)
    finally:
        os.close(fd)


def read_configdrive_partition(device: str | os.PathLike[str]) -> tuple[Partition, bytes]:
    """The config-2 partition of ``device`` and the drive image in it (up to its volume size).

    What a booting machine does to find its config drive; used by the
    simulator and the tests. Raises ConfigDriveError when there is not
    exactly one, or it holds neither an ISO9660 nor a FAT volume.
    """
    path = os.fspath(device)
    table = _read_table(path)
    found = [p for p in table.partitions if _is_config2(p)]
    if len(found) != 1:
        raise ConfigDriveError(f"expected one {LABEL} partition on {path}, found {len(found)}")
    part = found[0]
    with open(path, "rb") as fp:
        offset = part.start * table.sector_size
        try:
            size = iso9660.volume_size(fp, offset)
        except ValueError:
            fp.seek(offset)
            try:
                size = fat.volume_size(fp.read(512))  # a VFAT config drive (Nova's config_drive_format=vfat)
            except ValueError as exc:
                raise ConfigDriveError(f"partition {part.number} labelled {LABEL} holds {NOT_A_DRIVE}") from exc
        size = min(size, part.sectors * table.sector_size)
        fp.seek(offset)
        return part, fp.read(size)
