"""A partition image written over iSCSI: the table, root, swap, ephemeral and
the config drive, all from the conductor (seed 002's ``work_on_disk``).

The layout is the shared one (``services.common.images.partition_layout``),
made on a sparse *shadow* file of the disk's size and copied onto the LUN
where it differs from nothing: the table's regions, then each file system's
written extents (``--target-is-zero`` makes qemu-img skip the holes, which is
what ``mkswap``/``mkfs`` on the partition itself would have left untouched).
The root partition gets the image with its zeroes written: a file system
image may count on them.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from services.common import errors
from services.common.images import partition_layout
from services.common.images.partition_layout import Layout, PartitionSizes
from services.conductor import iscsi_writer
from services.conductor.iscsi_writer import IscsiLogin

MiB = 1024 * 1024
UUID_PROBE = 128 * 1024


@dataclass(frozen=True)
class PartitionResult:
    layout: Layout
    root_uuid: str
    image_format: str
    image_size: int


async def _blkid_uuid(data: bytes, work_dir: str | None) -> str:
    fd, path = tempfile.mkstemp(prefix="ferrum-root-", dir=work_dir)
    try:
        os.write(fd, data)
        os.close(fd)
        proc = await asyncio.create_subprocess_exec(
            "blkid", "-p", "-o", "export", path, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL
        )
        out, _ = await proc.communicate()
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
    for line in out.decode(errors="replace").splitlines():
        if line.startswith("UUID="):
            return line.split("=", 1)[1].strip()
    return ""


async def write_partition_image(
    login: IscsiLogin,
    sizes: PartitionSizes,
    image: Path,
    *,
    declared_format: str = "",
    configdrive: bytes | None = None,
    work_dir: str | None = None,
) -> PartitionResult:
    fmt, virtual = await iscsi_writer.image_facts(image, declared_format)
    disk = await iscsi_writer.target_size(login, work_dir=work_dir)
    layout = partition_layout.plan(sizes, disk)
    root = layout.role("root")
    assert root is not None
    if virtual > root.size:
        raise errors.ImageError(
            f"The partition image ({virtual} bytes) is larger than the root partition ({root.size} bytes, root_gb)"
        )
    with tempfile.TemporaryDirectory(prefix="ferrum-layout-", dir=work_dir) as tmp:
        shadow = str(Path(tmp) / "shadow")
        await asyncio.to_thread(_make_shadow, shadow, disk)
        await asyncio.to_thread(partition_layout.write_table, shadow, layout)
        edges = [(0, MiB)] + ([(disk - MiB, MiB)] if layout.label == "gpt" else [])
        for offset, size in edges:
            data = await asyncio.to_thread(_pread, shadow, offset, size)
            await iscsi_writer.write_range(login, offset, data, work_dir=work_dir)
        await iscsi_writer.convert_into(image, fmt, login, offset=root.start, size=root.size, work_dir=work_dir)
        for role in ("swap", "ephemeral"):
            part = layout.role(role)
            if part is None:
                continue
            fs = str(Path(tmp) / role)
            await asyncio.to_thread(partition_layout.make_filesystem, fs, part.size, role, sizes.ephemeral_format)
            await iscsi_writer.convert_into(
                Path(fs), "raw", login, offset=part.start, size=part.size, skip_holes=True, work_dir=work_dir
            )
            await asyncio.to_thread(os.unlink, fs)
        drive = layout.role("configdrive")
        if configdrive is not None and drive is not None:
            if len(configdrive) > drive.size:
                raise errors.ConfigDriveError(f"The config drive is larger than {drive.size // MiB} MiB")
            await iscsi_writer.write_range(login, drive.start, configdrive, work_dir=work_dir)
    head = await iscsi_writer.read_range(login, root.start, UUID_PROBE, work_dir=work_dir)
    return PartitionResult(
        layout=layout, root_uuid=await _blkid_uuid(head, work_dir), image_format=fmt, image_size=virtual
    )


def _make_shadow(path: str, size: int) -> None:
    with open(path, "wb") as f:
        f.truncate(size)


def _pread(path: str, offset: int, size: int) -> bytes:
    fd = os.open(path, os.O_RDONLY)
    try:
        return os.pread(fd, size, offset)
    finally:
        os.close(fd)
