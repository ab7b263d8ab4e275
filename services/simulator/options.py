"""Settings of one simulator: how many machines, where their disks live, where
they network-boot from, and how their BMC is reached."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from services.common import errors

_UNITS = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "kib": 1024,
    "m": 1000**2,
    "mb": 1000**2,
    "mib": 1024**2,
    "g": 1000**3,
    "gb": 1000**3,
    "gib": 1024**3,
    "t": 1000**4,
    "tb": 1000**4,
    "tib": 1024**4,
}
BOOT_TARGETS = ("None", "Pxe", "Hdd", "Cd", "BiosSetup", "Floppy", "Usb")
BACKENDS = ("python", "qemu")
MAX_QEMU_MACHINES = 64  # each is a TCG process with its own memory
MAX_MACHINES = 100_000
BMC_PROFILES = ("redfish", "ilo")
NICS_PER_MACHINE_MAX = 4


def parse_size(text: str | int) -> int:
    """``1GiB``, ``512MiB``, ``10G`` (decimal) or plain bytes."""
    if isinstance(text, int):
        value = text
    else:
        match = re.fullmatch(r"\s*(\d+)\s*([a-zA-Z]*)\s*", str(text))
        if not match or match.group(2).lower() not in _UNITS:
            raise errors.InvalidParameterValue(f"invalid size {text!r}: expected e.g. 1GiB, 512MiB or bytes")
        value = int(match.group(1)) * _UNITS[match.group(2).lower()]
    if value < 1024 * 1024:
        raise errors.InvalidParameterValue(f"disk size {text!r} is too small: at least 1 MiB")
    return value


@dataclass(frozen=True)
class SimulatorOptions:
    machines: int
    state_dir: str
    boot_url: str = ""  # what DHCP would hand iPXE as its bootfile
    host: str = "127.0.0.1"
    port: int = 0  # 0 = ephemeral
    public_url: str = ""  # the Redfish URL conductors use (driver_info); empty = http://host:port
    disk_size: int | str = 1024**3  # bytes, or a size such as "8MiB"
    username: str = ""  # empty = the BMC asks for no credentials
    password: str = ""
    name_prefix: str = "sim-"
    first_index: int = 0  # shifts names, UUIDs and MACs so two simulators never clash
    nics_per_machine: int = 1
    boot_order: tuple[str, ...] = ("Pxe", "Hdd")  # the firmware order when no override is set
    max_chain_hops: int = 8
    # Rounds of network boot after a first one in which every NIC failed (not an
    # ``exit``): Ferrum's first-stage boot.ipxe retries a failed lookup the same
    # way, so a machine powered on while the database restarts still boots. The
    # n-th retry waits n * pxe_retry_delay seconds, as boot.ipxe's retries do.
    pxe_retries: int = 3
    pxe_retry_delay: float = 1.0
    http_timeout: float = 30.0
    agent_host: str = "127.0.0.1"  # where embedded agents listen (ephemeral ports)
    ipmi: bool = False  # also answer IPMI (one UDP port per machine on host); docs/ipmi.md
    power_delay: tuple[float, float] = (0.0, 0.0)  # a Reset lands after uniform(min, max) s (0 = at once)
    # "python": the firmware and agents run in this process; "qemu": each machine is a
    # QEMU VM (services/simulator/qemu_machine.py) and the options below apply.
    backend: str = "python"
    qemu_binary: str = "qemu-system-x86_64"
    qemu_memory_mib: int = 1024  # the deploy ramdisk unpacks about 60 MiB and runs Python
    qemu_start_timeout: float = 10.0  # QEMU's monitor answers within a second here
    qemu_stop_timeout: float = 10.0  # after QMP quit, then SIGKILL
    agent_port_base: int = 0  # host port forwarded to machine i's agent: base + i (0 = free ports)
    # The Redfish listener's connection bounds (services/common/connection_guard.py).
    max_connections: int = 4096
    header_timeout: float = 10.0
    # Builds the deploy agent a kernel boot starts; None = services.agent.agent.Agent.
    # Takes an AgentLaunch, returns an object with async start() and stop().
    agent_factory: Callable[[Any], Any] | None = None
    # How the BMC lays out virtual media: "redfish" (Cd and Floppy under the System and its
    # Manager, the standard actions) or "ilo" (iLO 5: only under the Manager, members 1 = Floppy
    # and 2 = CD, Oem.Hpe actions too, and a one-time boot by Oem.Hpe.BootOnNextServerReset).
    bmc_profile: str = "redfish"
    # Boot from volume through an HBA (seed 004 scenarios 3, 4): each machine also sees a
    # LUN of this size behind a host bus adapter, a sparse file with a WWN (0 = no HBA).
    hba_lun_size: int | str = 0

    def hba_lun_bytes(self) -> int:
        """The HBA LUN's size in bytes; 0 when the machines have no HBA."""
        return 0 if self.hba_lun_size in (0, "0", "") else parse_size(self.hba_lun_size)

    def validate(self) -> SimulatorOptions:
        if not 1 <= self.machines <= MAX_MACHINES:
            raise errors.InvalidParameterValue(f"--machines must be between 1 and {MAX_MACHINES}")
        if not self.state_dir:
            raise errors.InvalidParameterValue("the simulator needs a state directory for its disks")
        if self.boot_url and not re.match(r"^https?://[^/\s]+", self.boot_url):
            raise errors.InvalidParameterValue(f"--boot-url {self.boot_url!r} must be an http(s) URL")
        if self.public_url and not re.fullmatch(r"https?://[^/\s]+/?", self.public_url):
            raise errors.InvalidParameterValue(f"--public-url {self.public_url!r} must be an http(s) URL with no path")
        if not 0 <= self.port <= 65535:
            raise errors.InvalidParameterValue("--port must be between 0 and 65535")
        if bool(self.username) != bool(self.password):
            raise errors.InvalidParameterValue("give both --username and --password, or neither")
        if not 1 <= self.nics_per_machine <= NICS_PER_MACHINE_MAX:
            raise errors.InvalidParameterValue(f"nics per machine must be 1..{NICS_PER_MACHINE_MAX}")
        if self.first_index < 0 or (self.first_index + self.machines) * NICS_PER_MACHINE_MAX > 2**24:
            raise errors.InvalidParameterValue("machine indexes exceed the 52:54:00 MAC space")
        bad = [t for t in self.boot_order if t not in BOOT_TARGETS or t == "None"]
        if bad or not self.boot_order:
            raise errors.InvalidParameterValue(
                f"boot order {self.boot_order!r} must name devices from {', '.join(BOOT_TARGETS[1:])}"
            )
        if not 0 <= self.pxe_retries <= 100 or not 0 <= self.pxe_retry_delay <= 60:
            raise errors.InvalidParameterValue("--pxe-retries must be 0..100 and --pxe-retry-delay 0..60 seconds")
        low, high = self.power_delay
        if low < 0 or high < low or high > 600:
            raise errors.InvalidParameterValue(f"power delay {low},{high} must be 0 <= min <= max <= 600 seconds")
        if self.max_connections < 1 or self.header_timeout <= 0:
            raise errors.InvalidParameterValue("--max-connections must be >= 1 and --header-timeout > 0")
        if self.bmc_profile not in BMC_PROFILES:
            raise errors.InvalidParameterValue(f"--bmc {self.bmc_profile!r} must be one of {', '.join(BMC_PROFILES)}")
        parse_size(self.disk_size)
        self.hba_lun_bytes()
        if self.backend not in BACKENDS:
            raise errors.InvalidParameterValue(f"backend {self.backend!r} must be one of {', '.join(BACKENDS)}")
        if self.backend == "qemu":
            if self.machines > MAX_QEMU_MACHINES:
                raise errors.InvalidParameterValue(f"the qemu backend runs at most {MAX_QEMU_MACHINES} machines")
            if self.hba_lun_bytes():
                raise errors.InvalidParameterValue("the qemu backend has no HBA LUNs (--hba-lun-size)")
            if not 128 <= self.qemu_memory_mib <= 65536:
                raise errors.InvalidParameterValue("qemu memory must be 128 to 65536 MiB")
            if self.agent_port_base and not 1024 <= self.agent_port_base <= 65535 - self.machines:
                raise errors.InvalidParameterValue("agent port base must leave room for every machine below 65536")
        return self


def parse_delay(text: str) -> tuple[float, float]:
    """``N`` or ``min,max`` seconds."""
    try:
        values = [float(p) for p in str(text).split(",") if p.strip()]
    except ValueError:
        raise errors.InvalidParameterValue(f"invalid power delay {text!r}: expected N or min,max seconds") from None
    if len(values) == 1:
        return values[0], values[0]
    if len(values) != 2:
        raise errors.InvalidParameterValue(f"invalid power delay {text!r}: expected N or min,max seconds")
    return values[0], values[1]
