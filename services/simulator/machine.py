"""One simulated machine: its identity, BMC-visible state and power actions.

A machine that is off costs a few hundred bytes: no task, no socket, no open
file. Powering on starts one task that plays the firmware
(:mod:`services.simulator.firmware`); a deploy kernel adds an agent. Power
actions are serialised per machine by a lock, and every one of them stops
whatever the previous boot left running first.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid as uuidlib
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from services.simulator.bios import MachineBios

if TYPE_CHECKING:
    from services.simulator.service import Simulator

LOG = logging.getLogger(__name__)

BOOT_LOG_LENGTH = 200
AGENT_STOP_TIMEOUT = 10.0
HOOK_GRACE = 0.1  # lets the agent answer the command that asked for power off / reboot
# Logged at INFO; the rest of the boot log only at DEBUG (a thousand machines boot at once).
LOUD_EVENTS = frozenset(
    {
        "power_on",
        "power_off",
        "agent_started",
        "os_booted",
        "no_bootable_device",
        "pxe_retry",
        "virtual_media_inserted",
        "cd_boot",
        "sanboot",
        "bios_settings_applied",
    }
)
UUID_NAMESPACE = uuidlib.UUID("6f7e2a52-6c5e-4f3b-9d0e-2d8f1c0ad001")


def machine_mac(index: int, nic: int) -> str:
    """Stable MAC from the machine index: 52:54:00 + 24 bits (4 NIC slots per machine)."""
    value = index * 4 + nic
    return f"52:54:00:{(value >> 16) & 0xFF:02x}:{(value >> 8) & 0xFF:02x}:{value & 0xFF:02x}"


def hba_lun_wwn(index: int) -> str:
    """A stable NAA-5 WWN for machine ``index``'s HBA LUN (as lsblk shows it: 0x + 16 hex digits)."""
    return f"0x5000c50f{index & 0xFFFFFFFF:08x}"


def machine_uuid(name: str) -> str:
    return str(uuidlib.uuid5(UUID_NAMESPACE, name))


class MachineStartError(RuntimeError):
    """The machine could not be powered on (its VM did not start); the BMC answers an error."""


@dataclass
class VirtualMediaSlot:
    image: str | None = None
    inserted: bool = False
    write_protected: bool = True
    boot_on_next_reset: bool = False  # iLO's Oem.Hpe.BootOnNextServerReset: boot this medium once


class Machine:
    """State a BMC shows plus what the firmware and OS did, for tests and demos."""

    def __init__(
        self, simulator: Simulator, index: int, name: str, macs: tuple[str, ...], disk_path: str, disk_serial: str
    ) -> None:
        self.simulator = simulator
        self.index = index
        self.name = name
        self.uuid = machine_uuid(name)
        self.macs = macs
        self.disk_path = disk_path
        self.disk_serial = disk_serial
        # A LUN behind a host bus adapter (SimulatorOptions.hba_lun_size): the firmware boots
        # it before the local disk when it holds an OS, and the ramdisk sees it as /dev/sdb.
        self.lun_path = ""
        self.lun_wwn = ""
        self.power_state = "Off"
        self.boot_target = "None"
        self.boot_enabled = "Disabled"
        self.boot_mode = "UEFI"
        self.health = "OK"  # the System's Status.Health (OK, Warning, Critical); tests change it
        self.status = "off"
        self.boot_count = 0
        self.boot_log: deque[dict[str, Any]] = deque(maxlen=BOOT_LOG_LENGTH)
        self.os_report: dict[str, Any] | None = None
        # What the rescue ramdisk's login checks (/etc/shadow's field): a crypt(3) hash, never clear text.
        self.rescue_password_hash: str | None = None
        self.virtual_media = {"Cd": VirtualMediaSlot(), "Floppy": VirtualMediaSlot()}
        # BIOS settings (Redfish Bios resource): staged values take effect at the next power on.
        self.bios = MachineBios(serial_number=disk_serial)
        self.agent: Any = None
        self._boot_task: asyncio.Task[None] | None = None
        self._pending_power: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()
        self._console_listeners: list[Callable[[dict[str, Any]], None]] = []
        self.records = 0  # boot-log entries ever recorded: the sequence number of the newest one

    # ---- identity -------------------------------------------------------------------

    @property
    def system_path(self) -> str:
        return f"/redfish/v1/Systems/{self.uuid}"

    def media_source(self, url: str) -> str:
        """Where this machine's BMC fetches a virtual media URL from (the URL itself here)."""
        return url

    def ipxe_variables(self, nic: int = 0) -> dict[str, str]:
        """What iPXE would know about itself when it runs the boot script from NIC ``nic``."""
        variables = {
            "mac": self.macs[nic],
            "uuid": self.uuid,
            "serial": self.disk_serial,
            "buildarch": "x86_64",
            "platform": "efi" if self.boot_mode == "UEFI" else "pcbios",
            "manufacturer": "Ferrum",
            "product": "Ferrum simulated machine",
            "hostname": self.name,
        }
        for nic, mac in enumerate(self.macs):
            variables[f"net{nic}/mac"] = mac
        return variables

    # ---- the record ------------------------------------------------------------------

    def record(self, event: str, **detail: Any) -> None:
        entry = {"at": round(time.time(), 3), "boot": self.boot_count, "event": event, **detail}
        self.boot_log.append(entry)
        self.records += 1
        level = logging.INFO if event in LOUD_EVENTS or event.endswith("_error") else logging.DEBUG
        LOG.log(
            level,
            "simulator machine=%s event=%s %s",
            self.name,
            event,
            " ".join(f"{k}={v}" for k, v in detail.items() if not isinstance(v, (dict, list))),
        )
        for listener in list(self._console_listeners):
            listener(entry)

    def subscribe_console(self, listener: Callable[[dict[str, Any]], None]) -> Callable[[], None]:
        """Call ``listener`` with every boot-log entry from now on (Serial-over-LAN
        streams them); returns the function that ends the subscription."""
        self._console_listeners.append(listener)
        return lambda: self._console_listeners.remove(listener) if listener in self._console_listeners else None

    def events(self, name: str) -> list[dict[str, Any]]:
        return [e for e in self.boot_log if e["event"] == name]

    def summary(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "uuid": self.uuid,
            "index": self.index,
            "system_id": self.system_path,
            "macs": list(self.macs),
            "disk_path": self.disk_path,
            "disk_serial": self.disk_serial,
            "lun_path": self.lun_path,
            "lun_wwn": self.lun_wwn,
            "power_state": self.power_state,
            "boot_target": self.boot_target,
            "boot_enabled": self.boot_enabled,
            "status": self.status,
            "boot_count": self.boot_count,
            "agent_running": self.agent is not None,
            "virtual_media": {dev: vars(slot).copy() for dev, slot in self.virtual_media.items()},
        }

    def describe(self) -> dict[str, Any]:
        return {
            **self.summary(),
            "os_report": self.os_report,
            "bios": {"current": dict(self.bios.current), "pending": dict(self.bios.pending)},
            "boot_log": list(self.boot_log),
        }

    # ---- boot override ---------------------------------------------------------------

    def boot_sequence(self) -> list[str]:
        """Devices to try on this boot; a Once override is used up here."""
        order = list(self.simulator.options.boot_order)
        cd = self.virtual_media.get("Cd")
        if cd is not None and cd.boot_on_next_reset:
            cd.boot_on_next_reset = False  # iLO clears it once the server has booted from the medium
            if cd.inserted:
                return ["Cd"] + [d for d in order if d != "Cd"]
        if self.boot_enabled in ("Once", "Continuous") and self.boot_target not in ("None", ""):
            first = self.boot_target
            if self.boot_enabled == "Once":
                self.boot_enabled, self.boot_target = "Disabled", "None"
            return [first] + [d for d in order if d != first]
        return order

    # ---- power -----------------------------------------------------------------------

    async def power_on(self, reason: str = "bmc") -> None:
        async with self._lock:
            if self.power_state == "On":
                return
            self._apply_bios()
            await self._start_boot(reason)
            self.power_state = "On"

    async def power_off(self, reason: str = "bmc") -> None:
        async with self._lock:
            await self._halt()
            if self.power_state != "Off":
                self.power_state = "Off"
                self.status = "off"
                self.record("power_off", reason=reason)

    async def reset(self, reason: str = "bmc") -> None:
        """A restart: whatever runs stops, and the firmware starts over."""
        async with self._lock:
            await self._halt()
            if self.power_state == "On":
                self.record("reset", reason=reason)
            self.power_state = "Off"
            self.status = "off"
            self._apply_bios()
            await self._start_boot(reason)
            self.power_state = "On"

    async def apply_power(self, reset_type: str) -> None:
        """A Redfish ResetType, done now."""
        if reset_type in ("On", "ForceOn"):
            await self.power_on(reason=reset_type)
        elif reset_type in ("ForceOff", "GracefulShutdown"):
            await self.power_off(reason=reset_type)
        else:
            await self.reset(reason=reset_type)

    def schedule_power(self, reset_type: str, delay: float) -> None:
        """Apply ``reset_type`` after ``delay`` s; a newer request replaces a pending one."""
        if self._pending_power is not None:
            self._pending_power.cancel()

        async def later() -> None:
            await asyncio.sleep(delay)
            self._pending_power = None
            if not self.simulator.stopping:
                with contextlib.suppress(MachineStartError):  # recorded in the boot log; nobody awaits an answer
                    await self.apply_power(reset_type)

        self._pending_power = self.simulator.spawn(later())

    def _apply_bios(self) -> None:
        """POST: the firmware applies the staged BIOS settings before anything boots."""
        result = self.bios.apply_pending()
        if result is not None:
            self.record("bios_settings_applied", **result)

    async def _start_boot(self, reason: str) -> None:
        """Power on: start the firmware. A backend whose machine cannot start raises MachineStartError."""
        from services.simulator.firmware import run_firmware

        self.boot_count += 1
        self.status = "booting"
        self.record("power_on", reason=reason)
        self._boot_task = asyncio.create_task(run_firmware(self), name=f"firmware-{self.name}")

    async def _halt(self) -> None:
        self.rescue_password_hash = None  # it lived in the ramdisk's memory
        task, self._boot_task = self._boot_task, None
        if task is not None and not task.done() and task is not asyncio.current_task():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        agent = self.agent
        if agent is not None:
            try:
                await asyncio.wait_for(agent.stop(), AGENT_STOP_TIMEOUT)
                self.record("agent_stopped")
            except asyncio.CancelledError:
                raise  # the agent stays recorded, so the next halt stops it again
            except Exception as exc:  # noqa: BLE001 - an agent that will not stop must not wedge the machine
                self.record("agent_stop_error", error=str(exc) or type(exc).__name__)
            self.agent = None

    def hardware_facts(self) -> Any:
        """What this machine's agent reports: CPUs and memory differ by machine index,
        so inspection has something distinct to find; the last of several NICs has no link."""
        from services.agent.hardware import MachineFacts

        return MachineFacts(
            cpu_count=2 * (1 + self.index % 8),
            cpu_arch="x86_64",
            memory_mb=2048 * (1 + self.index % 5),
            boot_mode="uefi" if self.boot_mode == "UEFI" else "bios",
            links=tuple(nic < len(self.macs) - 1 or len(self.macs) == 1 for nic in range(len(self.macs))),
        )

    async def set_rescue_password(self, hashed: str) -> None:
        """The rescue agent's finalize_rescue: the login of this boot accepts the password now."""
        self.rescue_password_hash = hashed
        self.status = "rescue"
        self.record("rescue_password_set", scheme=hashed[:3])

    # ---- what a backend adds -----------------------------------------------------------

    async def attach_media(self, device: str) -> None:
        """A medium was inserted into ``device`` (its slot is already filled in).

        The simulated firmware reads media when it boots, so nothing happens here;
        a backend with a real drive loads it (and raises MachineStartError on failure)."""

    async def detach_media(self, device: str) -> None:
        """The medium of ``device`` was ejected (see :meth:`attach_media`)."""

    def console_lines(self, count: int) -> list[str]:
        """The last ``count`` lines of the machine's console, oldest first.

        The simulated firmware has no serial port: its console is its boot log."""
        return [line for _, line in self.console_entries(count)]

    def graphical_console(self) -> dict[str, Any] | None:
        """Redfish's GraphicalConsole of this machine's BMC, or None: a simulated machine without
        a VM has no screen to show (QEMU-backed machines override this)."""
        return None

    def console_entries(self, count: int) -> list[tuple[int, str]]:
        """The last ``count`` console lines with their sequence numbers (1 for the first line
        the machine ever showed), so a reader polling the log sees which lines are new."""
        log = list(self.boot_log)
        first = self.records - len(log) + 1
        entries = []
        for number, entry in enumerate(log, start=first):
            detail = " ".join(f"{k}={v}" for k, v in entry.items() if k not in ("at", "boot", "event"))
            entries.append((number, f"{entry['event']} {detail}".strip()))
        return entries[-count:] if count > 0 else []

    def agent_hooks(self) -> tuple[Any, Any]:
        """power_off and reboot hooks for the agent of the current boot.

        They return at once and act a moment later from a fresh task, so the
        agent can answer the command that asked; a hook from an older boot does
        nothing.
        """
        generation = self.boot_count

        def later(action: str) -> None:
            async def act() -> None:
                if self.boot_count != generation or self.power_state != "On" or self.simulator.stopping:
                    return
                if action == "power_off":
                    await self.power_off(reason="agent")
                else:
                    await self.reset(reason="agent")

            self.simulator.spawn(act(), delay=HOOK_GRACE)

        async def power_off() -> None:
            later("power_off")

        async def reboot() -> None:
            later("reboot")

        return power_off, reboot
