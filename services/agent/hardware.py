"""What the agent reports about its machine, and which disk it deploys to.

The inventory has IPA's shape (``disks``: name, size in bytes, serial, wwn,
model, rotational; ``interfaces``: name, mac_address) so a conductor written
for IPA reads it unchanged. Disks are files or block devices named by the
caller; their size is whatever seeking to their end says, which works for
both. Root device hints follow IPA's rules: ``size`` in GiB with an optional
operator (``>= 10``), string hints compared exactly (``s== x``, ``<in> a b``,
``<or>`` forms accepted), ``name`` with or without ``/dev/`` and with globs.
"""

from __future__ import annotations

import fnmatch
import operator
import os
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from services.common import errors

GiB = 1024**3
# IPA skips disks smaller than this when it picks a root disk without hints.
MIN_ROOT_DISK_BYTES = 4 * GiB
_NUMERIC_OPS: dict[str, Callable[[float, float], bool]] = {
    "==": operator.eq,
    "!=": operator.ne,
    ">=": operator.ge,
    "<=": operator.le,
    ">": operator.gt,
    "<": operator.lt,
}
_STRING_HINTS = ("serial", "wwn", "model", "vendor", "wwn_with_extension", "wwn_vendor_extension", "by_path", "hctl")
KNOWN_HINTS = frozenset(("size", "name", "rotational", *_STRING_HINTS))


class DiskLike(Protocol):
    """What describing a disk reads (read-only, so frozen dataclasses qualify)."""

    @property
    def path(self) -> str: ...
    @property
    def name(self) -> str: ...
    @property
    def serial(self) -> str: ...
    @property
    def wwn(self) -> str: ...
    @property
    def model(self) -> str: ...
    @property
    def rotational(self) -> bool: ...


@dataclass(frozen=True)
class DiskInfo:
    """One disk as reported in the inventory (size measured now)."""

    path: str
    name: str
    size: int
    serial: str
    wwn: str
    model: str
    rotational: bool

    def as_inventory(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "size": self.size,
            "serial": self.serial or None,
            "wwn": self.wwn or None,
            "model": self.model or None,
            "vendor": None,
            "rotational": self.rotational,
            "hctl": None,
            "by_path": None,
        }


def device_size(path: str) -> int:
    """Size in bytes of a file or block device (seeking to the end works for both)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        return os.lseek(fd, 0, os.SEEK_END)
    finally:
        os.close(fd)


def describe_disks(disks: Iterable[DiskLike]) -> list[DiskInfo]:
    """Measure every configured disk; a missing one is a clear error, not a size of 0."""
    found = []
    for disk in disks:
        try:
            size = device_size(disk.path)
        except OSError as exc:
            raise errors.HardwareError(
                f"disk {disk.name} ({disk.path}) is not readable: {exc.strerror or exc}"
            ) from None
        found.append(DiskInfo(disk.path, disk.name, size, disk.serial, disk.wwn, disk.model, disk.rotational))
    return found


@dataclass(frozen=True)
class MachineFacts:
    """CPU, memory and boot mode a caller knows better than the host (a simulated machine)."""

    cpu_count: int
    cpu_arch: str
    memory_mb: int
    boot_mode: str = "bios"  # bios | uefi
    links: tuple[bool, ...] = ()  # has_carrier per NIC, in MAC order; missing ones have a link


def inventory(
    disks: Sequence[DiskInfo],
    macs: Sequence[str],
    *,
    hostname: str = "",
    ipv4_address: str = "",
    facts: MachineFacts | None = None,
) -> dict[str, Any]:
    """IPA's ``inventory`` dict for these disks and NICs."""
    interfaces = [
        {
            "name": f"eth{i}",
            "mac_address": mac.lower(),
            "ipv4_address": ipv4_address or None,
            "ipv6_address": None,
            "has_carrier": facts.links[i] if facts is not None and i < len(facts.links) else True,
            "vendor": None,
            "product": None,
            "client_id": None,
            "biosdevname": None,
            "speed_mbps": None,
        }
        for i, mac in enumerate(macs)
    ]
    return {
        "interfaces": interfaces,
        "disks": [d.as_inventory() for d in disks],
        "cpu": {
            "model_name": "ferrum-agent",
            "frequency": None,
            "count": facts.cpu_count if facts is not None else os.cpu_count() or 1,
            "architecture": facts.cpu_arch if facts is not None else os.uname().machine,
            "flags": [],
        },
        "memory": (
            {"total": facts.memory_mb * 1024 * 1024, "physical_mb": facts.memory_mb}
            if facts is not None
            else {"total": total_memory_bytes(), "physical_mb": physical_memory_mb()}
        ),
        "bmc_address": None,
        "bmc_v6address": None,
        "system_vendor": {"product_name": "Ferrum", "serial_number": None, "manufacturer": "Ferrum"},
        "boot": {
            "current_boot_mode": facts.boot_mode if facts is not None else current_boot_mode(),
            "pxe_interface": macs[0].lower() if macs else None,
        },
        "hostname": hostname or None,
    }


def physical_memory_mb(sysfs: str = "/sys") -> int | None:
    """The installed memory in MiB, as Ironic's ``physical_mb`` means it: the
    memory blocks the kernel brought online (``lsmem``'s total; 1024 for a VM
    given 1 GiB), not MemTotal, which the kernel's own reservations shrink.
    None when sysfs has no memory blocks to count (then total_memory_bytes)."""
    base = os.path.join(sysfs, "devices", "system", "memory")
    try:
        with open(os.path.join(base, "block_size_bytes")) as handle:
            block = int(handle.read().strip(), 16)
        online = 0
        for entry in os.listdir(base):
            if not re.fullmatch(r"memory\d+", entry):
                continue
            with open(os.path.join(base, entry, "online")) as handle:
                online += handle.read().strip() == "1"
    except (OSError, ValueError):
        total = total_memory_bytes()
        return total // (1024 * 1024) if total else None
    return block * online // (1024 * 1024) if online else None


def total_memory_bytes(meminfo: str = "/proc/meminfo") -> int | None:
    """MemTotal in bytes (IPA's ``memory.total``), None when it cannot be read."""
    try:
        with open(meminfo) as handle:
            for line in handle:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def current_boot_mode(sysfs: str = "/sys") -> str:
    """``uefi`` when the kernel was started by UEFI firmware (it then exposes
    /sys/firmware/efi), else ``bios``."""
    return "uefi" if os.path.isdir(os.path.join(sysfs, "firmware", "efi")) else "bios"


def _split_op(value: str) -> tuple[str, str]:
    value = value.strip()
    for op in ("s==", "s!=", "<in>", "<or>", "==", "!=", ">=", "<=", ">", "<"):
        if value.startswith(op):
            return op, value[len(op) :].strip()
    return "", value


def _match_size(hint: Any, size_gib: int) -> bool:
    if isinstance(hint, bool):
        raise errors.InvalidParameterValue(f"root device hint size must be a number of GiB, not {hint!r}")
    if isinstance(hint, (int, float)):
        return size_gib == hint
    op, rest = _split_op(str(hint))
    if op == "<in>":
        return any(_match_size(part, size_gib) for part in rest.split())
    if op == "<or>" or " <or> " in str(hint):
        return any(
            _match_size(part.strip(), size_gib) for part in str(hint).replace("<or>", "\0").split("\0") if part.strip()
        )
    try:
        number = float(rest)
    except ValueError:
        raise errors.InvalidParameterValue(f"root device hint size {hint!r} is not a number of GiB") from None
    compare = _NUMERIC_OPS.get(op or "==")
    if compare is None:
        raise errors.InvalidParameterValue(f"root device hint size {hint!r} has an unknown operator")
    return compare(size_gib, number)


def _match_string(hint: Any, actual: str | None, *, glob: bool = False) -> bool:
    text = str(hint)
    if "<or>" in text:
        return any(_match_string(part.strip(), actual, glob=glob) for part in text.split("<or>") if part.strip())
    op, rest = _split_op(text)
    value = actual or ""
    if op == "<in>":
        return value in rest.split()
    if op == "s!=":
        return value != rest
    if op in ("s==", "=="):
        return value == rest
    if glob and any(c in rest for c in "*?["):
        return fnmatch.fnmatchcase(value, rest)
    return value == rest


def _match_bool(hint: Any, actual: bool) -> bool:
    if isinstance(hint, bool):
        return hint == actual
    text = str(hint).strip().lower()
    if text in ("1", "true", "yes", "on", "t", "y"):
        return actual
    if text in ("0", "false", "no", "off", "f", "n"):
        return not actual
    raise errors.InvalidParameterValue(f"root device hint rotational {hint!r} is not a boolean")


def matches_hints(disk: DiskInfo, hints: Mapping[str, Any]) -> bool:
    """True when the disk satisfies every hint."""
    for key, hint in hints.items():
        if key == "size":
            if not _match_size(hint, disk.size // GiB):
                return False
        elif key == "rotational":
            if not _match_bool(hint, disk.rotational):
                return False
        elif key == "name":
            wanted = str(hint)
            op, rest = _split_op(wanted)
            if not op and not rest.startswith("/dev/"):
                wanted = "/dev/" + rest
            if not _match_string(wanted, disk.name, glob=True):
                return False
        elif key in ("serial", "wwn", "model"):
            if not _match_string(hint, getattr(disk, key)):
                return False
        else:  # hints about properties the agent does not know never match
            if not _match_string(hint, None):
                return False
    return True


def select_root_disk(disks: Sequence[DiskInfo], hints: Mapping[str, Any] | None) -> DiskInfo:
    """IPA's choice: the first disk matching the hints; without hints the
    smallest disk of at least 4 GiB, or the first disk when all are smaller
    (test and simulator disks are often tiny)."""
    if not disks:
        raise errors.HardwareError("the agent has no disks to deploy to")
    if hints:
        unknown = sorted(set(hints) - KNOWN_HINTS)
        if unknown:
            raise errors.InvalidParameterValue(f"unknown root device hints: {', '.join(unknown)}")
        for disk in disks:
            if matches_hints(disk, hints):
                return disk
        raise errors.HardwareError(f"No suitable device was found for deployment using these hints {dict(hints)}")
    big = [d for d in disks if d.size >= MIN_ROOT_DISK_BYTES]
    return min(big, key=lambda d: d.size) if big else disks[0]


def partition_device_name(disk_name: str, number: int) -> str:
    """``/dev/sda`` + 1 = ``/dev/sda1``; ``/dev/nvme0n1`` + 1 = ``/dev/nvme0n1p1``."""
    separator = "p" if re.search(r"\d$", disk_name) else ""
    return f"{disk_name}{separator}{number}"
