"""The machine's disks, as the agent in a ramdisk finds them in sysfs.

On a real machine (or a QEMU VM) nobody hands the agent a disk list: like
IPA's hardware manager it lists ``/sys/block``, skipping what cannot hold an
image (loop, ram, zram, optical, floppy and device-mapper devices, and
anything with no sectors), and reports each disk's serial, WWN, model and
rotational flag so root device hints can pick one. ``sys_block`` is a
parameter so tests can point it at a tree of plain files.
"""

from __future__ import annotations

import re
from pathlib import Path

from services.agent.agent import Disk

SKIPPED = re.compile(r"^(loop|ram|zram|sr|fd|dm-|md|nbd)\d*")


def _first_line(*candidates: Path) -> str:
    for path in candidates:
        try:
            text = path.read_text(errors="replace").strip()
        except OSError:
            continue
        if text:
            return text.splitlines()[0].strip()
    return ""


def discover_disks(sys_block: Path = Path("/sys/block"), dev: Path = Path("/dev")) -> list[Disk]:
    """Every disk worth deploying to, sorted by name (``vda`` before ``vdb``)."""
    found = []
    for entry in sorted(sys_block.iterdir()) if sys_block.is_dir() else []:
        name = entry.name
        if SKIPPED.match(name):
            continue
        sectors = _first_line(entry / "size")
        if not sectors.isdigit() or int(sectors) == 0:
            continue
        device = entry / "device"
        found.append(
            Disk(
                path=str(dev / name),
                name=f"/dev/{name}",
                serial=_first_line(entry / "serial", device / "serial"),
                wwn=_first_line(entry / "wwid", device / "wwid"),
                model=_first_line(device / "model"),
                rotational=_first_line(entry / "queue" / "rotational") == "1",
            )
        )
    return found
