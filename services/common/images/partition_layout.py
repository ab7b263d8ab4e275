"""The disk layout of a *partition image* deploy (Nova's ``root_gb``,
``swap_mb``, ``ephemeral_gb``, ``ephemeral_format``), shared by the agent's
``direct`` deploy and the conductor's ``iscsi`` deploy.

Ironic's layout (``ironic_lib.disk_utils.make_partitions``): ephemeral first,
then swap, then the config drive, and root *last*, so cloud-init's growroot
can grow it to the end of the disk. Partitions are 1 MiB aligned. The table
is ``msdos`` unless ``disk_label`` says ``gpt`` (Ironic's default, and what a
UEFI node gets). The config drive partition is made here (64 MiB, named
``config-2`` on GPT) because root takes the rest of the disk: no room would
be left at its end.

The table is written with ``sfdisk`` on a file or block device. Swap and the
ephemeral file system are made with ``mkswap``/``mkfs.*`` in a sparse file of
the partition's size; only the extents those tools wrote are copied to the
partition (:func:`data_extents`), which is what running them on the
partition itself would have changed. That works the same on a block device,
a disk image file and a LUN the conductor reaches only over iSCSI.

Synchronous: callers run it in a thread.
"""

from __future__ import annotations

import errno
import os
import subprocess
from dataclasses import dataclass

from services.common import errors

MiB = 1024 * 1024
CONFIGDRIVE_MB = 64
LABELS = ("msdos", "gpt")
EPHEMERAL_FORMATS = {
    "ext2": ("mkfs.ext2", "-q", "-F", "-L"),
    "ext3": ("mkfs.ext3", "-q", "-F", "-L"),
    "ext4": ("mkfs.ext4", "-q", "-F", "-E", "lazy_itable_init=1,lazy_journal_init=1", "-L"),
    "vfat": ("mkfs.vfat", "-n"),
}
GPT_TYPES = {"root": "L", "swap": "S", "ephemeral": "L", "configdrive": "L"}
MBR_TYPES = {"root": "83", "swap": "82", "ephemeral": "83", "configdrive": "83"}
_TOOL_TIMEOUT = 120


@dataclass(frozen=True)
class PlannedPartition:
    role: str  # "ephemeral" | "swap" | "configdrive" | "root"
    number: int
    start: int  # bytes
    size: int  # bytes


@dataclass(frozen=True)
class Layout:
    label: str
    disk_size: int
    partitions: tuple[PlannedPartition, ...]

    def role(self, name: str) -> PlannedPartition | None:
        return next((p for p in self.partitions if p.role == name), None)


def _mb(value: object, field: str) -> int:
    if value in (None, ""):
        return 0
    if isinstance(value, bool):
        raise errors.InvalidParameterValue(f"instance_info {field} must be a whole number")
    try:
        number = int(str(value))
    except ValueError:
        raise errors.InvalidParameterValue(f"instance_info {field} must be a whole number, not {value!r}") from None
    if number < 0:
        raise errors.InvalidParameterValue(f"instance_info {field} must not be negative")
    return number


@dataclass(frozen=True)
class PartitionSizes:
    """What Nova asks for, in MiB (``root_gb``/``ephemeral_gb`` arrive in GiB)."""

    root_mb: int
    swap_mb: int = 0
    ephemeral_mb: int = 0
    ephemeral_format: str = "ext4"
    configdrive: bool = False
    label: str = "msdos"

    @classmethod
    def from_instance_info(cls, info: dict[str, object], *, default_label: str = "msdos") -> PartitionSizes:
        """Nova's fields, checked (400 for a bad one)."""
        root_mb = _mb(info.get("root_mb"), "root_mb") or _mb(info.get("root_gb"), "root_gb") * 1024
        if root_mb <= 0:
            raise errors.InvalidParameterValue(
                "A partition image needs instance_info root_gb (the root partition size)"
            )
        ephemeral_format = str(info.get("ephemeral_format") or "ext4")
        if ephemeral_format not in EPHEMERAL_FORMATS:
            raise errors.InvalidParameterValue(
                f"instance_info ephemeral_format {ephemeral_format!r} is not one of {', '.join(EPHEMERAL_FORMATS)}"
            )
        capabilities = info.get("capabilities")
        label = default_label
        if isinstance(capabilities, dict) and capabilities.get("disk_label"):
            label = str(capabilities["disk_label"])
        if label not in LABELS:
            raise errors.InvalidParameterValue(f"disk_label {label!r} is not one of {', '.join(LABELS)}")
        return cls(
            root_mb=root_mb,
            swap_mb=_mb(info.get("swap_mb"), "swap_mb"),
            ephemeral_mb=_mb(info.get("ephemeral_mb"), "ephemeral_mb")
            or _mb(info.get("ephemeral_gb"), "ephemeral_gb") * 1024,
            ephemeral_format=ephemeral_format,
            configdrive=bool(info.get("configdrive")),
            label=label,
        )


def plan(sizes: PartitionSizes, disk_size: int) -> Layout:
    """Where each partition goes on a disk of ``disk_size`` bytes; 400 when they do not fit."""
    wanted = [
        ("ephemeral", sizes.ephemeral_mb),
        ("swap", sizes.swap_mb),
        ("configdrive", CONFIGDRIVE_MB if sizes.configdrive else 0),
        ("root", sizes.root_mb),
    ]
    if sizes.label == "msdos" and sum(1 for _, mb in wanted if mb) > 4:
        raise errors.InvalidParameterValue("An msdos table holds four primary partitions")
    offset = MiB
    parts: list[PlannedPartition] = []
    for role, mb in wanted:
        if not mb:
            continue
        parts.append(PlannedPartition(role=role, number=len(parts) + 1, start=offset, size=mb * MiB))
        offset += mb * MiB
    end = disk_size - (MiB if sizes.label == "gpt" else 0)  # the backup GPT lives in the last sectors
    if offset > end:
        need = sum(mb for _, mb in wanted) + 1
        raise errors.InvalidParameterValue(
            f"The partitions need {need} MiB (root {sizes.root_mb}, swap {sizes.swap_mb}, ephemeral "
            f"{sizes.ephemeral_mb}, config drive {CONFIGDRIVE_MB if sizes.configdrive else 0}) but the disk "
            f"has {disk_size // MiB} MiB"
        )
    return Layout(label=sizes.label, disk_size=disk_size, partitions=tuple(parts))


def sfdisk_script(layout: Layout) -> str:
    types = GPT_TYPES if layout.label == "gpt" else MBR_TYPES
    lines = [f"label: {'gpt' if layout.label == 'gpt' else 'dos'}", "unit: sectors"]
    for part in layout.partitions:
        line = f"start={part.start // 512}, size={part.size // 512}, type={types[part.role]}"
        if layout.label == "gpt":
            line += f', name="{"config-2" if part.role == "configdrive" else part.role}"'
        lines.append(line)
    return "\n".join(lines) + "\n"


def _run(argv: list[str], *, stdin: str | None = None) -> str:
    try:
        done = subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=_TOOL_TIMEOUT, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise errors.ImageError(f"{argv[0]} failed: {exc}") from None
    if done.returncode != 0:
        raise errors.ImageError(f"{argv[0]} failed: {(done.stderr or done.stdout).strip()[-300:]}")
    return done.stdout


def write_table(path: str, layout: Layout) -> None:
    """Write the partition table of ``layout`` onto ``path`` (a disk image file or device)."""
    _run(
        ["sfdisk", "--no-reread", "--no-tell-kernel", "--wipe", "always", "--wipe-partitions", "always", path],
        stdin=sfdisk_script(layout),
    )


def make_filesystem(path: str, size: int, role: str, ephemeral_format: str = "ext4") -> None:
    """Make swap or the ephemeral file system in a new sparse file ``path`` of ``size`` bytes."""
    with open(path, "wb") as f:
        f.truncate(size)
    if role == "swap":
        _run(["mkswap", "-L", "swap1", path])
        return
    tool, *args = EPHEMERAL_FORMATS[ephemeral_format]
    _run([tool, *args, "ephemeral0", path])


def data_extents(path: str) -> list[tuple[int, int]]:
    """The (offset, length) extents of ``path`` that hold data (SEEK_DATA/SEEK_HOLE)."""
    extents = []
    fd = os.open(path, os.O_RDONLY)
    try:
        end = os.fstat(fd).st_size
        offset = 0
        while offset < end:
            try:
                start = os.lseek(fd, offset, os.SEEK_DATA)
            except OSError as exc:
                if exc.errno == errno.ENXIO:
                    break
                raise
            stop = os.lseek(fd, start, os.SEEK_HOLE)
            extents.append((start, stop - start))
            offset = stop
    finally:
        os.close(fd)
    return extents
