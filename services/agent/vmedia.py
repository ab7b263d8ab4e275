"""The agent's second parameter source: the virtual floppy of a virtual-media boot.

A machine booted from a virtual CD finds ``boot_method=vmedia`` on its
kernel command line, and its own parameters (api URL, node UUID, agent
token, BOOTIF) on a vfat device labelled ``ir-vfd-dev``, in
``parameters.txt`` (CONTRACT.md 6.1, IPA's ``_get_vmedia_params``). Those
win over the command line, which for a shared boot ISO carries nothing
about the node.

On a machine, the device is ``/dev/disk/by-label/ir-vfd-dev`` when udev
made the link, else the first block device whose FAT label matches (IPA
matches the label without regard to case). The simulator hands its agents
the inserted medium's bytes instead, as its firmware hands them the kernel
command line. Reading is blocking (a bounded ``mtype``): call it in a thread.
"""

from __future__ import annotations

import logging
import os
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path

from services.agent.cmdline import split
from services.common import errors
from services.common.images import fat, floppy

LOG = logging.getLogger(__name__)
BY_LABEL = Path("/dev/disk/by-label") / floppy.LABEL
SYS_BLOCK = Path("/sys/block")


def wants_floppy(cmdline_text: str) -> bool:
    """IPA reads the floppy only when the kernel was booted from virtual media."""
    return split(cmdline_text).get("boot_method", "").lower() == "vmedia"


def _label_matches(path: Path) -> bool:
    try:
        with open(path, "rb") as fp:
            labels = fat.volume_labels(fp)
    except OSError:
        return False
    return any(label.casefold() == floppy.LABEL for label in labels)


def block_devices(sys_block: Path = SYS_BLOCK, dev: Path = Path("/dev")) -> list[Path]:
    """The machine's block devices, floppies and CDs included (``/sys/block`` names under ``/dev``)."""
    try:
        names = sorted(entry.name for entry in sys_block.iterdir())
    except OSError:
        return []
    return [dev / name for name in names if not name.startswith(("loop", "ram", "zram"))]


def find_floppy(candidates: Iterable[Path]) -> Path | None:
    """The first candidate that is a FAT volume labelled ``ir-vfd-dev``."""
    for path in candidates:
        if _label_matches(path):
            return path
    return None


# A floppy is at most 2.88 MB; a virtual one handed over as a USB stick may be larger.
MAX_FLOPPY_COPY = 16 * 1024 * 1024


def read_parameters(device: Path) -> dict[str, str]:
    """``parameters.txt`` of the floppy at ``device`` (a block device or an image file).

    A block device is copied to a file first: mtools treats a floppy device
    node (``/dev/fd0``) as a drive whose geometry it must probe, and in the
    deploy ramdisk that fails ("Cannot initialize '::'"), while the same
    bytes in a file read fine."""
    if device.is_block_device():
        with tempfile.NamedTemporaryFile(prefix="ferrum-vfd-") as copy:
            with open(device, "rb") as source:
                copy.write(source.read(MAX_FLOPPY_COPY))
            copy.flush()
            return read_parameters(Path(copy.name))
    try:
        raw = fat.read_file(device, floppy.PARAMETERS_FILE, limit=floppy.MAX_PARAMETERS_BYTES)
    except errors.ImageError as exc:
        raise errors.InvalidParameterValue(
            f"cannot read {floppy.PARAMETERS_FILE} from {device}: {exc.message}"
        ) from None
    return floppy.parse_parameters(raw.decode("utf-8", "replace"))


def machine_parameters(devices: Sequence[Path] | None = None) -> dict[str, str]:
    """The floppy's parameters on a real machine ({} when no ``ir-vfd-dev`` device is attached)."""
    found = BY_LABEL if devices is None and BY_LABEL.exists() else find_floppy(devices or block_devices())
    if found is None:
        LOG.warning("booted from virtual media, but no %s device is attached", floppy.LABEL)
        return {}
    LOG.info("reading agent parameters from the virtual floppy device=%s", found)
    return read_parameters(found)


def image_parameters(images: Sequence[bytes], *, work_dir: str | None = None) -> dict[str, str]:
    """The parameters of the first ``ir-vfd-dev`` image among inserted media given as bytes."""
    for image in images:
        with tempfile.NamedTemporaryFile(prefix="ferrum-vfd-", dir=work_dir, delete=False) as fp:
            fp.write(image)
        try:
            path = Path(fp.name)
            if _label_matches(path):
                return read_parameters(path)
        finally:
            os.unlink(fp.name)
    return {}
