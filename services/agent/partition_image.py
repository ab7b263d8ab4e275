"""The ``direct`` deploy of a *partition image* (IPA's ``image_type: partition``):
the agent makes Ironic's layout on its disk (ephemeral, swap, config drive,
root last; ``services.common.images.partition_layout``, the same code the
conductor's iSCSI deploy uses) and writes the image into root.

The image goes through the agent's usual path first (download, checksum,
qcow2 conversion) into a staging file the size of the root partition, so
every check the whole-disk write makes applies, with the root partition as
"the disk": an image larger than ``root_mb`` is refused before anything is
written. Then the table is written, the staged image is copied into the root
partition (``qemu-img convert`` into a byte range of the disk, zeroes
included), and swap and the ephemeral file system are made and copied (only
what ``mkswap``/``mkfs`` wrote). The staging costs one extra local write of
the image; partition images are small, whole-disk images skip it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from services.agent import configdrive as configdrives
from services.agent import imagewrite
from services.agent.hardware import DiskInfo
from services.common import errors
from services.common.images import filesystems, partition_layout
from services.common.images.partition_layout import Layout, PartitionSizes

if TYPE_CHECKING:
    from services.agent.agent import Agent

MiB = 1024 * 1024


@dataclass(frozen=True)
class PartitionWrite:
    layout: Layout
    root_uuid: str
    written: imagewrite.WriteResult


def sizes_from_image_info(image_info: dict[str, Any], *, configdrive: bool) -> PartitionSizes:
    """IPA's fields (``root_mb``, ``swap_mb``, ``ephemeral_mb``, ``ephemeral_format``, ``disk_label``)."""
    return PartitionSizes.from_instance_info(
        {
            "root_mb": image_info.get("root_mb"),
            "swap_mb": image_info.get("swap_mb"),
            "ephemeral_mb": image_info.get("ephemeral_mb"),
            "ephemeral_format": image_info.get("ephemeral_format"),
            "capabilities": {"disk_label": image_info.get("disk_label") or "msdos"},
            "configdrive": configdrive,
        }
    )


async def _convert_into(src: str, disk: str, *, offset: int, size: int, skip_holes: bool) -> None:
    target = f"driver=raw,offset={offset},size={size},file.driver=file,file.filename={disk.replace(',', ',,')}"
    proc = await asyncio.create_subprocess_exec(
        "qemu-img",
        "convert",
        "-n",
        *(["--target-is-zero"] if skip_holes else []),
        "-f",
        "raw",
        src,
        "--target-image-opts",
        target,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    _, err = await proc.communicate()
    if proc.returncode != 0:
        raise errors.ImageError(f"Writing a partition failed: {err.decode(errors='replace').strip()[-300:]}")


def _root_uuid(disk: str, offset: int) -> str:
    with open(disk, "rb") as fp:
        return filesystems.filesystem_uuid(fp, offset)


def _pwrite(path: str, offset: int, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        view, done = memoryview(data), 0
        while done < len(view):
            done += os.pwrite(fd, view[done:], offset + done)
        os.fsync(fd)
    finally:
        os.close(fd)


async def write_partition_image(
    agent: Agent,
    image_info: dict[str, Any],
    configdrive: str | None,
    disk: DiskInfo,
    progress: imagewrite.Progress,
) -> PartitionWrite:
    sizes = sizes_from_image_info(image_info, configdrive=bool(configdrive))
    layout = partition_layout.plan(sizes, disk.size)
    root = layout.role("root")
    assert root is not None
    iso = None
    if configdrive:
        iso = await configdrives.config_drive_iso(agent.session, configdrive, tls=agent.tls)
    with tempfile.TemporaryDirectory(prefix="ferrum-partition-", dir=agent.options.tmp_dir or None) as tmp:
        staged = Path(tmp) / "root"
        await asyncio.to_thread(_sized, staged, root.size)
        written = await imagewrite.write_image(
            agent.session,
            image_info,
            replace(disk, path=str(staged), name=f"{disk.name} root partition", size=root.size),
            progress=progress,
            allow_md5=agent.allow_md5(),
            tmp_dir=agent.options.tmp_dir,
            block_size=agent.options.write_block_size,
            depth=agent.options.write_depth,
            direct_io=agent.options.direct_io,
            conversion_slots=agent.options.conversion_slots,
            qcow2_stream=agent.options.qcow2_stream,
            tls=agent.tls,
        )
        length = min(root.size, -(-written.bytes_written // 512) * 512)
        await asyncio.to_thread(os.truncate, staged, length)
        progress.stage = "partitioning"
        await asyncio.to_thread(partition_layout.write_table, disk.path, layout)
        await _convert_into(str(staged), disk.path, offset=root.start, size=root.size, skip_holes=False)
        for role in ("swap", "ephemeral"):
            part = layout.role(role)
            if part is None:
                continue
            fs = str(Path(tmp) / role)
            await asyncio.to_thread(partition_layout.make_filesystem, fs, part.size, role, sizes.ephemeral_format)
            await _convert_into(fs, disk.path, offset=part.start, size=part.size, skip_holes=True)
            with contextlib.suppress(FileNotFoundError):
                await asyncio.to_thread(os.unlink, fs)
    drive = layout.role("configdrive")
    if iso is not None and drive is not None:
        if len(iso) > drive.size:
            raise errors.ConfigDriveError(f"The config drive is larger than {drive.size // MiB} MiB")
        progress.stage = "configdrive"
        await asyncio.to_thread(_pwrite, disk.path, drive.start, iso)
    root_uuid = await asyncio.to_thread(_root_uuid, disk.path, root.start)
    if not root_uuid:
        raise errors.ImageError("The root partition holds no file system with a UUID after the write")
    return PartitionWrite(layout=layout, root_uuid=root_uuid, written=written)


def _sized(path: Path, size: int) -> None:
    with open(path, "wb") as f:
        f.truncate(size)
