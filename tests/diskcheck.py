"""What is left on a disk file: blkid's signatures and raw byte searches, for
tests that check cleaning wiped a disk (the simulator's and a QEMU VM's)."""

from __future__ import annotations

import subprocess

MiB = 1024 * 1024


def disk_signatures(path: str) -> list[str]:
    """What blkid finds on the whole disk (partition table, filesystem), empty when nothing."""
    found = subprocess.run(["blkid", "-p", "-o", "export", path], check=False, capture_output=True, text=True)
    assert found.returncode in (0, 2), found.stderr  # 2: nothing found
    return [line for line in found.stdout.splitlines() if line.startswith(("TYPE=", "PTTYPE=", "LABEL="))]


def find_bytes(path: str, needle: bytes) -> bool:
    with open(path, "rb") as disk:
        tail = b""
        while chunk := disk.read(8 * MiB):
            if needle in tail + chunk:
                return True
            tail = chunk[-len(needle) :]
    return False
