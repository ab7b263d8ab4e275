#!/usr/bin/env python3
"""lvcreate/lvremove/lvextend/lvchange for a kernel without device-mapper (tests only).

This machine's kernel has no device-mapper (no /dev/mapper/control, no
dm_mod), so LVM cannot activate a logical volume: ``lvcreate`` fails with
"Failure to communicate with kernel device-mapper driver". With
``global/activation = 0`` in a private lvm.conf LVM still allocates extents
and keeps real metadata on the physical volume, it just never creates the
block device. This script stands in for that one missing kernel piece and
nothing else: cinder-volume finds it first on its PATH, it runs the real LVM
command, and then "activates" the LV (also on ``lvchange -a y``; ``-a n``
deactivates) the way dm-linear would map it, with a
loop device over the same bytes of the physical volume's backing file
(``losetup --offset pe_start + first_extent * extent_size --sizelimit
extents * extent_size``), linked at the paths LVM's udev rules would create
(``/dev/<vg>/<lv>`` and ``/dev/mapper/<vg>-<lv>`` with dashes doubled).

A loop device maps one contiguous range, so ``lvcreate`` gets
``--alloc contiguous``; snapshots and thin pools need device-mapper targets
and are refused. Its settings come from ``lvm-loop-shim.json`` beside it
(written by tests/support/cinder_service.py): the VG, the PV backing file,
the directory of the real LVM tools and a state directory recording which
loop device serves which LV.

It runs under /usr/bin/python3 with the standard library only.
"""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
CONFIG = json.loads((HERE / "lvm-loop-shim.json").read_text())
VG: str = CONFIG["vg"]
PV_FILE: str = CONFIG["pv_file"]
REAL_DIR: str = CONFIG["real_dir"]
STATE = Path(CONFIG["state_dir"])


def run(*cmd: str) -> str:
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        sys.stderr.write(done.stderr)
        raise SystemExit(f"lvm-loop-shim: {' '.join(cmd)} failed with status {done.returncode}")
    return done.stdout


def report(tool: str, *args: str) -> list[dict[str, str]]:
    data = json.loads(run(os.path.join(REAL_DIR, tool), "--reportformat", "json", *args))
    rows: list[dict[str, str]] = []
    for part in data["report"]:
        for value in part.values():
            rows.extend(value)
    return rows


def links(lv: str) -> list[Path]:
    mapper = f"{VG.replace('-', '--')}-{lv.replace('-', '--')}"
    return [Path("/dev") / VG / lv, Path("/dev/mapper") / mapper]


def activate(lv: str) -> None:
    segments = report("lvs", "-o", "lv_name,seg_pe_ranges", f"{VG}/{lv}")
    if len(segments) != 1:
        raise SystemExit(f"lvm-loop-shim: {VG}/{lv} has {len(segments)} segments; a loop device maps one")
    first, last = (int(x) for x in segments[0]["seg_pe_ranges"].rsplit(":", 1)[1].split("-"))
    pvs = report("pvs", "--units", "b", "--nosuffix", "-o", "pv_name,pe_start,vg_name")
    pe_start = int(next(row["pe_start"] for row in pvs if row["vg_name"] == VG))
    (vg_row,) = report("vgs", "--units", "b", "--nosuffix", "-o", "vg_extent_size", VG)
    extent = int(vg_row["vg_extent_size"])
    loop = run(
        "losetup",
        "--find",
        "--show",
        "--offset",
        str(pe_start + first * extent),
        "--sizelimit",
        str((last - first + 1) * extent),
        PV_FILE,
    ).strip()
    (STATE / lv).write_text(loop)
    for link in links(lv):
        link.parent.mkdir(exist_ok=True)
        link.unlink(missing_ok=True)
        link.symlink_to(loop)


def deactivate(lv: str) -> None:
    record = STATE / lv
    if not record.exists():
        return
    for link in links(lv):
        link.unlink(missing_ok=True)
    subprocess.run(["losetup", "-d", record.read_text().strip()], check=False)
    record.unlink()


def lv_names(args: list[str]) -> list[str]:
    """The LVs named as ``vg/lv`` in an lvremove/lvextend command line, of our VG."""
    return [arg.split("/", 1)[1] for arg in args if arg.startswith(f"{VG}/")]


def activation_mode(args: list[str]) -> bool | None:
    """``lvchange -a y`` (True), ``-a n`` (False), or another change (None)."""
    for i, arg in enumerate(args):
        value = None
        if arg in ("-a", "--activate") and i + 1 < len(args):
            value = args[i + 1]
        elif arg.startswith("-a") and len(arg) > 2 and not arg.startswith("--"):
            value = arg[2:]
        elif arg.startswith("--activate="):
            value = arg.split("=", 1)[1]
        if value is not None:
            return value.lstrip("a").lstrip("l").startswith("y") or value in ("a", "ay", "ly")
    return None


def main() -> int:
    tool = os.path.basename(sys.argv[0])
    args = sys.argv[1:]
    STATE.mkdir(exist_ok=True)
    with open(STATE / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if tool == "lvcreate":
            if any(a in ("-s", "--snapshot", "-T", "--thin", "--thinpool") or a.startswith("--type") for a in args):
                sys.stderr.write(
                    "lvm-loop-shim: snapshots and thin volumes need device-mapper, which this kernel lacks\n"
                )
                return 5
            name = next((args[i + 1] for i, a in enumerate(args[:-1]) if a in ("-n", "--name")), None)
            rc = subprocess.call([os.path.join(REAL_DIR, tool), "--alloc", "contiguous", *args])
            if rc == 0 and name:
                activate(name)
            return rc
        if tool == "lvremove":
            for lv in lv_names(args):
                deactivate(lv)
            return subprocess.call([os.path.join(REAL_DIR, tool), *args])
        if tool == "lvchange":
            mode = activation_mode(args)
            if mode is None:
                return subprocess.call([os.path.join(REAL_DIR, tool), *args])
            for lv in lv_names(args):
                if mode and not (STATE / lv).exists():
                    activate(lv)
                elif not mode:
                    deactivate(lv)
            return 0
        if tool == "lvextend":
            rc = subprocess.call([os.path.join(REAL_DIR, tool), "--alloc", "contiguous", *args])
            for lv in lv_names(args):
                deactivate(lv)
                activate(lv)
            return rc
    sys.stderr.write(f"lvm-loop-shim: unexpected tool name {tool}\n")
    return 2


if __name__ == "__main__":
    sys.exit(main())
