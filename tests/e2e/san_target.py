"""An iSCSI LUN for real SAN boots: tgtd (Debian's userspace target) on
127.0.0.1 with CHAP and an initiator ACL, holding a boot sector that prints a
marker through the BIOS. From a QEMU guest it is 10.0.2.2:<port>.

tgtd ignores SIGTERM while it holds targets (TOOLING.md): the targets are
removed first, then tgtd is stopped by its PID.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from services.common.ports import unused_tcp_port
from tests.e2e.bootfiles import run

TARGET_IQN = "iqn.2026-11.org.ferrum.test:san-boot"
INITIATOR_IQN = "iqn.2026-11.org.ferrum.test:initiator-1"
CHAP_USER, CHAP_SECRET = "ferrum-chap", "chap-secret-0123"
MARKER = "FERRUM-SAN-BOOT-SECTOR-RUNNING"


def boot_sector(message: str) -> bytes:
    """A 512-byte MBR that prints ``message`` through BIOS int 10h and halts.

    SeaBIOS mirrors int 10h text to the serial console under -nographic, so
    the message proves the firmware booted the iSCSI LUN that iPXE hooked."""
    # SeaBIOS's serial console holds back the last character of a screen line: end with a second line.
    text = message.encode() + b"\r\nhalted.\r\n\x00"
    msg_at = 0x19
    code = bytes(
        [
            *(0xFA, 0xFC),  # cli; cld
            *(0x31, 0xC0, 0x8E, 0xD8),  # xor ax,ax; mov ds,ax
            *(0x31, 0xDB),  # xor bx,bx (page 0)
            *(0xBE, msg_at, 0x7C),  # mov si, 0x7C00 + msg_at
            *(0xB4, 0x0E),  # mov ah, 0Eh (teletype)
            0xAC,  # next: lodsb
            *(0x08, 0xC0),  # or al, al
            *(0x74, 0x04),  # jz done
            *(0xCD, 0x10),  # int 10h
            *(0xEB, 0xF7),  # jmp next
            0xF4,  # done: hlt
            *(0xEB, 0xFD),  # jmp done
        ]
    )
    assert len(code) == msg_at
    sector = bytearray(512)
    sector[: len(code)] = code
    sector[msg_at : msg_at + len(text)] = text
    sector[510:512] = b"\x55\xaa"
    return bytes(sector)


@dataclass(frozen=True)
class SanTarget:
    port: int
    iqn: str
    lun: int
    show: Callable[[], str]  # tgtadm's view of the target (its sessions name the initiators)


@contextlib.contextmanager
def running_san_target(workdir: Path, *, marker: str = MARKER) -> Iterator[SanTarget]:
    """tgtd with one LUN holding ``boot_sector(marker)``, CHAP and an ACL for INITIATOR_IQN."""
    disk = workdir / "disk.img"
    disk.write_bytes(boot_sector(marker) + bytes(16 * 1024 * 1024 - 512))
    port, control = unused_tcp_port(), 1000 + os.getpid() % 30000  # tgtadm takes control ports up to 32767
    with open(workdir / "tgtd.log", "wb") as log:  # the child keeps its own copy of the descriptor
        tgtd = subprocess.Popen(
            ["tgtd", "-f", "-C", str(control), "-p", str(workdir / "tgtd.pid"), "--iscsi", f"portal=127.0.0.1:{port}"],
            stdout=subprocess.DEVNULL,
            stderr=log,
        )

    def adm(*args: str) -> str:
        return run("tgtadm", "-C", str(control), "--lld", "iscsi", *args, timeout=30)

    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                adm("--op", "show", "--mode", "target")
                break
            except RuntimeError:
                if tgtd.poll() is not None or time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        adm("--op", "new", "--mode", "target", "--tid", "1", "-T", TARGET_IQN)
        adm("--op", "new", "--mode", "logicalunit", "--tid", "1", "--lun", "1", "-b", str(disk))
        adm("--op", "bind", "--mode", "target", "--tid", "1", "--initiator-name", INITIATOR_IQN)
        adm("--op", "new", "--mode", "account", "--user", CHAP_USER, "--password", CHAP_SECRET)
        adm("--op", "bind", "--mode", "account", "--tid", "1", "--user", CHAP_USER)
        yield SanTarget(port=port, iqn=TARGET_IQN, lun=1, show=lambda: adm("--op", "show", "--mode", "target"))
    finally:
        with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired):
            adm("--op", "delete", "--mode", "target", "--tid", "1", "--force")
        tgtd.terminate()
        try:
            tgtd.wait(10)
        except subprocess.TimeoutExpired:
            tgtd.kill()
            tgtd.wait()
