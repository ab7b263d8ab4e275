"""What the real-VM tests boot: the deploy ramdisk and the demo OS image, built once.

Building them downloads Debian packages and takes tens of seconds, so it
happens before any stack starts: ``scripts/bootstrap.sh`` runs this module,
and the tests' module fixture (which the stack fixture depends on) finds the
builds current and reuses them (a build is redone only when its inputs, such
as the agent's code, changed). Nothing slow may run while a stack's event
loop is running: a stall longer than the heartbeat timeout looks like a dead
conductor.

    python -m tests.e2e.vmfiles    # build into .ferrum/cache/vm-e2e
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from services.ramdisk.demo_os import DemoOsImage, build_demo_os
from services.ramdisk.deploy_ramdisk import RamdiskBuild, build_ramdisk
from tests.e2e.bootfiles import ensure_packages

REPO = Path(__file__).resolve().parents[2]
CACHE = REPO / ".ferrum" / "cache"
OUTPUT = CACHE / "vm-e2e"
PACKAGES = ("syslinux", "mtools", "gdisk")  # the demo image's tools, beside bootfiles.py's QEMU packages


@dataclass(frozen=True)
class VmFiles:
    ramdisk: RamdiskBuild
    os_image: DemoOsImage


def ensure_vm_files() -> VmFiles:
    ensure_packages(*PACKAGES)
    return VmFiles(
        ramdisk=build_ramdisk(OUTPUT, cache=CACHE / "debian", reuse=True),
        os_image=build_demo_os(OUTPUT, cache=CACHE / "debian", reuse=True),
    )


def main() -> int:
    files = ensure_vm_files()
    print(f"deploy kernel: {files.ramdisk.kernel}")
    print(f"deploy ramdisk: {files.ramdisk.initramfs} ({files.ramdisk.compressed_bytes} bytes)")
    print(f"demo OS image: {files.os_image.path} ({files.os_image.size} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
