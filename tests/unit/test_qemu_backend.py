"""The QEMU backend's pure parts: the command line, the guest's view of URLs,
and console text as a BMC shows it."""

from __future__ import annotations

from pathlib import Path

from services.conductor.console_tail import clean
from services.simulator.console import clean_line, tail_lines
from services.simulator.qemu_command import VmSpec, boot_letters, guest_url, qemu_argv


def spec(**changes: object) -> VmSpec:
    values: dict[str, object] = {
        "name": "vm-0000",
        "uuid": "355f51f6-80e7-5467-b257-031545aff04c",
        "macs": ("52:54:00:00:00:00", "52:54:00:00:00:01"),
        "disk_path": "/state/disks/vm-0000.img",
        "disk_serial": "FERRUMSIM000000",
        "serial_log": "/state/serial/vm-0000.log",
        "qmp_socket": "/tmp/ferrum-qmp-x/0.qmp",
        "agent_port": 45001,
        "boot_url": "http://10.0.2.2:8080/boot.ipxe",
        "first_boot": ("Pxe", "Hdd"),
        "later_boots": ("Pxe", "Hdd"),
    }
    values.update(changes)
    return VmSpec(**values)  # type: ignore[arg-type]


def value_of(argv: list[str], flag: str) -> list[str]:
    return [argv[i + 1] for i, item in enumerate(argv) if item == flag]


def test_command_line_of_a_machine() -> None:
    argv = qemu_argv(spec())
    assert argv[0] == "qemu-system-x86_64" and value_of(argv, "-accel") == ["tcg"]
    assert value_of(argv, "-boot") == ["order=nc"]
    netdevs = value_of(argv, "-netdev")
    assert netdevs[0] == ("user,id=net0,bootfile=http://10.0.2.2:8080/boot.ipxe,hostfwd=tcp:127.0.0.1:45001-:9999")
    assert "hostfwd" not in netdevs[1] and "bootfile=" in netdevs[1]
    devices = value_of(argv, "-device")
    assert "virtio-net-pci,netdev=net1,mac=52:54:00:00:00:01" in devices
    assert "virtio-blk-pci,drive=disk0,serial=FERRUMSIM000000" in devices
    assert "file,id=serial0,path=/state/serial/vm-0000.log,append=on" in value_of(argv, "-chardev")
    assert value_of(argv, "-qmp") == ["unix:/tmp/ferrum-qmp-x/0.qmp,server=on,wait=off"]
    drives = value_of(argv, "-drive")
    assert "if=none,id=cd0,media=cdrom,readonly=on" in drives and "if=none,id=fd0" in drives


def test_a_once_override_applies_to_the_first_boot_only() -> None:
    argv = qemu_argv(spec(first_boot=("Cd", "Pxe", "Hdd"), cd_image="/m/cd,1.iso", floppy_image="/m/fd.img"))
    assert value_of(argv, "-boot") == ["once=dnc,order=nc"]
    drives = value_of(argv, "-drive")
    assert "if=none,id=cd0,media=cdrom,readonly=on,file=/m/cd,,1.iso,format=raw" in drives  # comma escaped
    assert "if=none,id=fd0,file=/m/fd.img,format=raw" in drives


def test_boot_devices_map_to_firmware_letters() -> None:
    assert boot_letters(["Hdd", "Pxe", "Hdd"]) == "cn"
    assert boot_letters(["BiosSetup", "Usb"]) == "c"  # nothing QEMU can boot: the disk
    assert boot_letters(["Floppy", "Cd"]) == "ad"


def test_loopback_urls_become_the_guests_view_of_the_host() -> None:
    assert guest_url("http://127.0.0.1:8080/boot.ipxe") == "http://10.0.2.2:8080/boot.ipxe"
    assert guest_url("http://localhost/boot.ipxe?x=1") == "http://10.0.2.2/boot.ipxe?x=1"
    assert guest_url("http://192.0.2.7:8080/boot.ipxe") == "http://192.0.2.7:8080/boot.ipxe"


def test_console_text_loses_escapes_and_overwritten_text(tmp_path: Path) -> None:
    assert clean_line("\x1b[0;1miPXE 1.0\x1b[0m -- Open Source") == "iPXE 1.0 -- Open Source"
    assert clean_line("Loading...  47%\r67%\r ok\r") == "ok"
    log = tmp_path / "serial.log"
    log.write_bytes(b"\x1bc\x1b[?7lSeaBIOS\r\n\r\nferrum-ramdisk: starting\r\n   \nlast words\xff\n")
    assert tail_lines(log, 10) == ["SeaBIOS", "ferrum-ramdisk: starting", "last words\ufffd"]
    assert tail_lines(log, 1) == ["last words\ufffd"]
    assert tail_lines(tmp_path / "missing.log", 5) == []
    big = tmp_path / "big.log"
    big.write_bytes(b"x" * 200_000 + b"\nend\n")
    assert tail_lines(big, 5) == ["end"]  # the cut first line of the tail is dropped


def test_conductor_cleans_console_lines_for_last_error() -> None:
    assert clean("\x1b[31mKernel panic\x00 -\t not syncing\x1b[0m") == "Kernel panic - not syncing"
    assert len(clean("y" * 1000)) == 200
