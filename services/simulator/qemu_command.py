"""The QEMU command line of one simulated machine (pure: no process is started here).

A machine is a BIOS (SeaBIOS) PC under TCG with:

- one virtio NIC per MAC, user-mode networking (the guest sees the host's
  loopback as ``10.0.2.2``), the first NIC's DHCP offering the boot URL as
  its bootfile, and a forward from a host port to the agent's port 9999 (the
  conductor cannot reach a guest behind user-mode NAT otherwise);
- the machine's disk file as a virtio disk carrying the disk serial;
- an IDE CD drive and a floppy drive for virtual media, empty unless a
  medium was inserted before power on;
- the serial port appended to a log file, and a QMP socket for power and media.

TCG only: this machine class has /dev/kvm, but guests die or hang on it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

GUEST_HOST_ADDRESS = "10.0.2.2"  # what user-mode networking makes of the host's 127.0.0.1
AGENT_GUEST_PORT = 9999
ISCSI_GUEST_PORT = 3260  # where the guest's agent serves its disk for the iSCSI deploy (ipa-iscsi-portal-port)
# Firmware boot device letters (-boot): floppy, disk, CD, network.
BOOT_LETTERS = {"Floppy": "a", "Hdd": "c", "Cd": "d", "Pxe": "n"}


@dataclass(frozen=True)
class VmSpec:
    name: str
    uuid: str
    macs: tuple[str, ...]
    disk_path: str
    disk_serial: str
    serial_log: str
    qmp_socket: str
    agent_port: int  # host port forwarded to the guest's AGENT_GUEST_PORT
    boot_url: str  # as the guest must use it (see guest_url)
    first_boot: tuple[str, ...]  # Redfish device names for this power-on, override first
    later_boots: tuple[str, ...]  # the boot order after a reset from inside the guest
    memory_mib: int = 1024
    iscsi_port: int = 0  # host port forwarded to the guest's ISCSI_GUEST_PORT (the iSCSI deploy's target)
    cd_image: str = ""
    floppy_image: str = ""
    binary: str = "qemu-system-x86_64"


def guest_url(url: str) -> str:
    """``url`` as the guest reaches it: a loopback host becomes 10.0.2.2, the rest is unchanged."""
    parts = urlsplit(url)
    if parts.hostname not in ("127.0.0.1", "localhost", "::1"):
        return url
    netloc = GUEST_HOST_ADDRESS + (f":{parts.port}" if parts.port else "")
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def boot_letters(devices: Sequence[str]) -> str:
    """Redfish boot devices as QEMU's -boot letters, in order, each once (others are skipped)."""
    letters = ""
    for device in devices:
        letter = BOOT_LETTERS.get(device, "")
        if letter and letter not in letters:
            letters += letter
    return letters or "c"


def _drive_value(path: str) -> str:
    return path.replace(",", ",,")  # QEMU's escape for commas in option values


VNC_HOST = "127.0.0.1"
VNC_DISPLAYS = 100  # QEMU tries displays 0..99 (TCP ports 5900..5999) until one is free


def qemu_argv(spec: VmSpec) -> list[str]:
    first, later = boot_letters(spec.first_boot), boot_letters(spec.later_boots)
    boot = f"order={later}" if first == later else f"once={first},order={later}"
    argv = [
        spec.binary,
        "-name",
        spec.name,
        "-accel",
        "tcg",
        "-machine",
        "pc",
        "-m",
        str(spec.memory_mib),
        "-smp",
        "1",
        "-uuid",
        spec.uuid,
        "-nographic",  # SeaBIOS and iPXE print on the serial port too
        "-vnc",  # the VGA screen too, as a BMC's graphical console would: the first free of 5900-5999
        f"{VNC_HOST}:0,to={VNC_DISPLAYS - 1}",
        "-monitor",
        "none",
        "-chardev",
        f"file,id=serial0,path={_drive_value(spec.serial_log)},append=on",
        "-serial",
        "chardev:serial0",
        "-qmp",
        f"unix:{_drive_value(spec.qmp_socket)},server=on,wait=off",
        "-boot",
        boot,
        "-drive",
        f"if=none,id=disk0,file={_drive_value(spec.disk_path)},format=raw,cache=writeback,discard=unmap",
        "-device",
        f"virtio-blk-pci,drive=disk0,serial={spec.disk_serial}",
        "-drive",
        "if=none,id=cd0,media=cdrom,readonly=on"
        + (f",file={_drive_value(spec.cd_image)},format=raw" if spec.cd_image else ""),
        "-device",
        "ide-cd,drive=cd0,id=cdrom0",
        "-drive",
        "if=none,id=fd0" + (f",file={_drive_value(spec.floppy_image)},format=raw" if spec.floppy_image else ""),
        "-device",
        "floppy,drive=fd0,id=floppy0",
    ]
    for index, mac in enumerate(spec.macs):
        netdev = f"user,id=net{index}" + (f",bootfile={_drive_value(spec.boot_url)}" if spec.boot_url else "")
        if index == 0:
            netdev += f",hostfwd=tcp:127.0.0.1:{spec.agent_port}-:{AGENT_GUEST_PORT}"
            if spec.iscsi_port:
                netdev += f",hostfwd=tcp:127.0.0.1:{spec.iscsi_port}-:{ISCSI_GUEST_PORT}"
        argv += ["-netdev", netdev, "-device", f"virtio-net-pci,netdev=net{index},mac={mac}"]
    return argv
