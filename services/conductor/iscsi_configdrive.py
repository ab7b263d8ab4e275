"""The config drive of an iSCSI deploy, written by the conductor onto the LUN.

The partition logic is the one every other path uses
(``services.common.images.configdrive_partition``: reuse a ``config-2``
partition or make one in the last 64 MiB), and it works on a file. The LUN
is not a file here (libiscsi in userspace gives no block device), so the
conductor works on a *shadow*: a sparse file of the disk's size holding the
parts of the LUN that the partition code reads (the first and last MiB,
where MBR and both GPT copies live, and the first 64 KiB of every
partition, where filesystem labels are). The plan runs on the shadow; then
the parts it may have changed (the table regions and the config drive's
bytes) are written back to the LUN.
"""

from __future__ import annotations

import asyncio
import os
import tempfile

from services.common import errors
from services.common.images.configdrive_partition import ConfigDrivePlacement, write_configdrive_partition
from services.common.images.partition_table import read_partition_table
from services.conductor import iscsi_writer
from services.conductor.iscsi_writer import IscsiLogin

MiB = 1024 * 1024
PROBE_BYTES = 64 * 1024
ALIGN = 4096


def _regions_of_table(disk_size: int) -> list[tuple[int, int]]:
    edge = min(MiB, disk_size)
    return [(0, edge), (disk_size - edge, edge)]


def _pwrite(path: str, offset: int, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.pwrite(fd, data, offset)
    finally:
        os.close(fd)


def _pread(path: str, offset: int, size: int) -> bytes:
    fd = os.open(path, os.O_RDONLY)
    try:
        return os.pread(fd, size, offset)
    finally:
        os.close(fd)


def _partition_heads(path: str, disk_size: int) -> list[tuple[int, int]]:
    with open(path, "rb") as fp:
        try:
            table = read_partition_table(fp)
        except errors.ImageFormatError:
            return []  # no table yet: the plan makes one, nothing to probe
    heads = []
    for part in table.partitions:
        start = part.start * table.sector_size
        size = min(PROBE_BYTES, part.sectors * table.sector_size, max(disk_size - start, 0))
        if size > 0:
            heads.append((start, size))
    return heads


async def write_config_drive(
    login: IscsiLogin, iso: bytes, disk_size: int, *, work_dir: str | None = None
) -> ConfigDrivePlacement:
    """Find or make the ``config-2`` partition on the LUN and write ``iso`` into it."""
    fd, shadow = tempfile.mkstemp(prefix="ferrum-shadow-", dir=work_dir)
    try:
        os.ftruncate(fd, disk_size)
        os.close(fd)
        for offset, size in _regions_of_table(disk_size):
            _pwrite(shadow, offset, await iscsi_writer.read_range(login, offset, size, work_dir=work_dir))
        for offset, size in await asyncio.to_thread(_partition_heads, shadow, disk_size):
            _pwrite(shadow, offset, await iscsi_writer.read_range(login, offset, size, work_dir=work_dir))
        placement = await asyncio.to_thread(write_configdrive_partition, shadow, iso)
        drive_size = min(-(-len(iso) // ALIGN) * ALIGN, placement.size_bytes)
        for offset, size in (*_regions_of_table(disk_size), (placement.start_byte, drive_size)):
            data = await asyncio.to_thread(_pread, shadow, offset, size)
            await iscsi_writer.write_range(login, offset, data, work_dir=work_dir)
        return placement
    finally:
        os.unlink(shadow)
