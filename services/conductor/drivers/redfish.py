"""The ``redfish`` power and management interfaces (sushy, off the event loop).

Every sushy call runs in a worker thread, off the event loop: in a small
pool of the interface's own (``redfish_workers``, like ``asyncio.to_thread``
but isolated), so BMCs that hang until their timeouts cannot starve the
conductor's default executor that other work shares. Power changes are
asynchronous on real BMCs (and on sushy-tools' fake driver, which applies
them 1-11 s later), so after asking for a change we poll the system until it
reports the wanted state or the timeout passes; we never sleep a fixed time
and call it done. A hard reboot is power off, then power on, each confirmed,
as Ironic does: a ForceRestart cannot be observed reliably.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import logging
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import sushy

from services.common import errors, states
from services.common.db.records import NodeRecord
from services.conductor.drivers import base, power_change
from services.conductor.drivers.redfish_client import (
    DRIVER_INFO_PROPERTIES,
    ConnectionCache,
    RedfishInfo,
    parse_driver_info,
)

LOG = logging.getLogger(__name__)

DEFAULT_POWER_TIMEOUT = 60.0
DEFAULT_POLL_INTERVAL = 1.0
DEFAULT_WORKERS = 16
CLOSE_TIMEOUT = 15.0

GET_POWER_STATE = {
    sushy.PowerState.ON: states.POWER_ON,
    sushy.PowerState.POWERING_ON: states.POWER_ON,
    sushy.PowerState.OFF: states.POWER_OFF,
    sushy.PowerState.POWERING_OFF: states.POWER_OFF,
}
SET_POWER_STATE = {
    states.POWER_ON: sushy.ResetType.ON,
    states.POWER_OFF: sushy.ResetType.FORCE_OFF,
    states.SOFT_POWER_OFF: sushy.ResetType.GRACEFUL_SHUTDOWN,
    states.SOFT_REBOOT: sushy.ResetType.GRACEFUL_RESTART,
    states.REBOOT: sushy.ResetType.FORCE_RESTART,
}
BOOT_DEVICES = {
    "pxe": sushy.BootSource.PXE,
    "disk": sushy.BootSource.HDD,
    "cdrom": sushy.BootSource.CD,
    "bios": sushy.BootSource.BIOS_SETUP,
}
BOOT_DEVICES_REV = {v: k for k, v in BOOT_DEVICES.items()}
CONSOLE_LOG_SERVICES = ("Console", "SerialConsole")  # LogService ids holding console lines
BOOT_MODES = {"bios": sushy.BootSourceOverrideMode.LEGACY, "uefi": sushy.BootSourceOverrideMode.UEFI}
BOOT_MODES_REV = {v: k for k, v in BOOT_MODES.items()}
# Ironic's indicator states and the Redfish IndicatorLED values behind them.
INDICATOR_LEDS = {"ON": sushy.IndicatorLED.LIT, "BLINKING": sushy.IndicatorLED.BLINKING, "OFF": sushy.IndicatorLED.OFF}
INDICATOR_STATES = {v: k for k, v in INDICATOR_LEDS.items()}
VIRTUAL_MEDIA_TYPES = {
    "cdrom": (sushy.VirtualMediaType.CD, sushy.VirtualMediaType.DVD),
    "floppy": (sushy.VirtualMediaType.FLOPPY, sushy.VirtualMediaType.USB_STICK),
}


def _media_devices(system: Any) -> list[Any]:
    """Virtual media of the system: its own collection, else its managers' (older BMCs)."""
    try:
        return list(system.virtual_media.get_members())
    except sushy.exceptions.MissingAttributeError:
        return [m for manager in system.managers for m in manager.virtual_media.get_members()]


def _media_for(system: Any, device: str) -> list[Any]:
    if device not in VIRTUAL_MEDIA_TYPES:
        raise errors.InvalidParameterValue(
            f"Invalid virtual media device {device}; supported: {', '.join(VIRTUAL_MEDIA_TYPES)}"
        )
    wanted = set(VIRTUAL_MEDIA_TYPES[device])
    return [m for m in _media_devices(system) if wanted & set(m.media_types or ())]


def _float_option(options: dict[str, Any], name: str, default: float) -> float:
    try:
        value = float(options.get(name, default))
    except (TypeError, ValueError):
        raise errors.InvalidParameterValue(f"conductor option {name} must be a number") from None
    return value if value > 0 else default


class _RedfishBase:
    """What power and management share: options, the connection cache, calls."""

    options: dict[str, Any]
    kind: str

    def _setup(self) -> None:
        self.power_timeout = _float_option(self.options, "redfish_power_timeout", DEFAULT_POWER_TIMEOUT)
        self.poll_interval = _float_option(self.options, "redfish_poll_interval", DEFAULT_POLL_INTERVAL)
        request_timeout = _float_option(self.options, "redfish_request_timeout", 30.0)
        self.connections = ConnectionCache(request_timeout=request_timeout, connect_timeout=min(10.0, request_timeout))
        workers = int(_float_option(self.options, "redfish_workers", DEFAULT_WORKERS))
        self._executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix=f"redfish-{self.kind}")

    def get_properties(self) -> dict[str, str]:
        return dict(DRIVER_INFO_PROPERTIES)

    def redfish_info(self, node: NodeRecord) -> RedfishInfo:
        """Where and how to reach the node's BMC (the iLO interfaces read their own fields)."""
        return parse_driver_info(node)

    async def close(self) -> None:
        """At conductor stop: log out of every BMC session (bounded), then drop the threads."""
        loop = asyncio.get_running_loop()
        try:
            await asyncio.wait_for(loop.run_in_executor(self._executor, self.connections.close), CLOSE_TIMEOUT)
        except TimeoutError:
            LOG.warning(
                "redfish %s interface: BMC logouts still running after %ss; not waiting", self.kind, CLOSE_TIMEOUT
            )
        self._executor.shutdown(wait=False, cancel_futures=True)

    async def validate(self, task: base.Task) -> None:
        self.redfish_info(task.node)

    async def _call(self, task: base.Task, action: str, fn: Any) -> Any:
        return await self._info_call(self.redfish_info(task.node), action, fn)

    async def _info_call(self, info: RedfishInfo, action: str, fn: Any) -> Any:
        """``connections.call`` in this interface's pool, with the caller's context (log ids)."""
        context = contextvars.copy_context()
        call = functools.partial(context.run, self.connections.call, info, action, fn)
        return await asyncio.get_running_loop().run_in_executor(self._executor, call)


def _read_power(system: Any) -> str:
    state = GET_POWER_STATE.get(system.power_state)
    if state is None:
        raise errors.BMCError(f"Redfish system {system.identity} reports an unknown power state {system.power_state!r}")
    return state


class RedfishPower(_RedfishBase, base.PowerInterface):
    name = "redfish"

    def __init__(self, options: Any = None) -> None:
        super().__init__(options)
        self._setup()

    def get_supported_power_states(self) -> list[str]:
        return [states.POWER_ON, states.POWER_OFF, states.REBOOT, states.SOFT_REBOOT, states.SOFT_POWER_OFF]

    async def get_power_state(self, task: base.Task) -> str:
        return await self._call(task, "read the power state", _read_power)

    async def set_power_state(self, task: base.Task, state: str, timeout: float | None = None) -> None:
        if state not in SET_POWER_STATE:
            raise errors.InvalidParameterValue(
                f"redfish power cannot set {state!r}; supported: {self.get_supported_power_states()}"
            )
        await power_change.set_power_state(self._control(task), state, timeout or self.power_timeout)

    async def reboot(self, task: base.Task, timeout: float | None = None) -> None:
        await power_change.reboot(self._control(task), timeout or self.power_timeout)

    def _control(self, task: base.Task) -> power_change.PowerControl:
        """The node's BMC for power_change: system reads and ComputerSystem.Reset."""
        info = self.redfish_info(task.node)

        async def read() -> str:
            return await self._info_call(info, "read the power state", _read_power)

        async def request(state: str) -> None:
            reset = SET_POWER_STATE[state]
            LOG.info("redfish reset address=%s system=%s reset_type=%s", info.address, info.system_id, reset.value)
            await self._info_call(info, f"reset the system ({reset.value})", lambda system: system.reset_system(reset))

        return power_change.PowerControl(
            node_uuid=str(task.node.get("uuid")),
            bmc=f"Redfish BMC {info.address}",
            read=read,
            request=request,
            poll_interval=self.poll_interval,
            graceful_restart=True,
        )


class RedfishManagement(_RedfishBase, base.ManagementInterface):
    name = "redfish"
    # Inserts and ejects virtual media (the virtual-media boot interfaces rely on it).
    capabilities = frozenset({"virtual_media"})

    def __init__(self, options: Any = None) -> None:
        super().__init__(options)
        self._setup()

    def get_supported_boot_devices(self, task: base.Task) -> list[str]:
        return list(BOOT_DEVICES)

    async def set_boot_device(self, task: base.Task, device: str, persistent: bool = False) -> None:
        if device not in BOOT_DEVICES:
            raise errors.InvalidParameterValue(
                f"Invalid boot device {device} specified; supported: {', '.join(BOOT_DEVICES)}"
            )
        enabled = sushy.BootSourceOverrideEnabled.CONTINUOUS if persistent else sushy.BootSourceOverrideEnabled.ONCE
        LOG.info("redfish boot device node_uuid=%s device=%s persistent=%s", task.node.get("uuid"), device, persistent)
        await self._call(
            task,
            f"set the boot device to {device}",
            lambda system: system.set_system_boot_options(target=BOOT_DEVICES[device], enabled=enabled),
        )

    async def get_boot_device(self, task: base.Task) -> dict[str, Any]:
        def read(system: Any) -> dict[str, Any]:
            boot = system.boot
            target = boot.target if boot else None
            enabled = boot.enabled if boot else None
            return {
                "boot_device": BOOT_DEVICES_REV.get(target),
                "persistent": enabled == sushy.BootSourceOverrideEnabled.CONTINUOUS,
            }

        return await self._call(task, "read the boot device", read)

    async def get_node_health(self, task: base.Task) -> str | None:
        """The System resource's ``Status.Health`` (Ironic's redfish ``get_node_health``)."""

        def read(system: Any) -> str | None:
            health = getattr(system.status, "health", None) if system.status is not None else None
            return None if health is None else str(getattr(health, "value", health))

        return await self._call(task, "read the system health", read)

    # Boot mode, secure boot (1.76) and the system's indicator LED (1.63), as
    # Ironic's redfish management does them through sushy.
    def get_supported_boot_modes(self, task: base.Task) -> list[str]:
        return list(BOOT_MODES)

    async def get_boot_mode(self, task: base.Task) -> str | None:
        def read(system: Any) -> str | None:
            mode = system.boot.mode if system.boot else None
            return BOOT_MODES_REV.get(mode)

        return await self._call(task, "read the boot mode", read)

    async def set_boot_mode(self, task: base.Task, mode: str) -> None:
        if mode not in BOOT_MODES:
            raise errors.InvalidParameterValue(f"Invalid boot mode {mode!r}; supported: {', '.join(BOOT_MODES)}")
        LOG.info("redfish boot mode node_uuid=%s mode=%s", task.node.get("uuid"), mode)
        await self._call(
            task, f"set the boot mode to {mode}", lambda system: system.set_system_boot_options(mode=BOOT_MODES[mode])
        )

    async def get_secure_boot_state(self, task: base.Task) -> bool | None:
        return await self._call(task, "read the secure boot state", lambda system: bool(system.secure_boot.enabled))

    async def set_secure_boot_state(self, task: base.Task, state: bool) -> None:
        LOG.info("redfish secure boot node_uuid=%s enabled=%s", task.node.get("uuid"), state)
        await self._call(
            task,
            f"{'enable' if state else 'disable'} secure boot",
            lambda system: system.secure_boot.set_enabled(state),
        )

    async def get_supported_indicators(self, task: base.Task, component: str | None = None) -> dict[str, Any]:
        def read(system: Any) -> dict[str, Any]:
            if system.indicator_led is None:  # the BMC reports no LED
                return {}
            return {"system": {"led": {"readonly": False, "states": sorted(INDICATOR_STATES.values())}}}

        found = await self._call(task, "read the indicators", read)
        return {c: v for c, v in found.items() if not component or component == c}

    def _check_indicator(self, component: str, indicator: str) -> None:
        if (component, indicator) != ("system", "led"):
            raise errors.InvalidParameterValue(
                f"Invalid indicator {indicator}@{component}: the redfish interface manages led@system only"
            )

    async def get_indicator_state(self, task: base.Task, component: str, indicator: str) -> str:
        self._check_indicator(component, indicator)

        def read(system: Any) -> str:
            return {v: k for k, v in INDICATOR_LEDS.items()}.get(system.indicator_led, "UNKNOWN")

        return await self._call(task, "read the indicator LED", read)

    async def set_indicator_state(self, task: base.Task, component: str, indicator: str, state: str) -> None:
        self._check_indicator(component, indicator)
        if state not in INDICATOR_LEDS:
            raise errors.InvalidParameterValue(
                f"Invalid state {state!r} for led@system; valid: {sorted(INDICATOR_LEDS)}"
            )
        await self._call(
            task, f"set the indicator LED to {state}", lambda system: system.set_indicator_led(INDICATOR_LEDS[state])
        )

    async def get_system_uuid(self, task: base.Task) -> str | None:
        """The system's UUID as the BMC reports it (inspection uses it)."""
        return await self._call(task, "read the system UUID", lambda system: system.uuid)

    async def get_mac_addresses(self, task: base.Task) -> list[str]:
        """Lower-case MACs of the system's Ethernet interfaces, in BMC order."""

        def read(system: Any) -> list[str]:
            macs = []
            for nic in system.ethernet_interfaces.get_members():
                mac = nic.permanent_mac_address or nic.mac_address
                if mac and mac.lower() not in macs:
                    macs.append(mac.lower())
            return macs

        return await self._call(task, "read the NIC MAC addresses", read)

    # ---- virtual media (for virtual-media boot; CONTRACT.md section 6) ----------------

    async def insert_virtual_media(self, task: base.Task, device: str, url: str) -> None:
        """Insert ``url`` into the first empty ``cdrom`` or ``floppy`` slot."""
        if not url.startswith(("http://", "https://")):
            raise errors.InvalidParameterValue(f"virtual media URL {url!r} must be http or https")

        def insert(system: Any) -> None:
            slots = _media_for(system, device)
            if not slots:
                raise errors.BMCError(f"Redfish system {system.identity} has no virtual {device} device")
            free = [m for m in slots if not m.inserted]
            if not free:
                raise errors.BMCError(
                    f"every virtual {device} of system {system.identity} already holds media; eject it first"
                )
            free[0].insert_media(url, inserted=True, write_protected=True)

        LOG.info("redfish insert virtual media node_uuid=%s device=%s", task.node.get("uuid"), device)
        await self._call(task, f"insert virtual {device} media", insert)

    async def eject_virtual_media(self, task: base.Task, device: str | None = None) -> None:
        """Eject every inserted medium of ``device`` (all devices when None)."""

        def eject(system: Any) -> None:
            slots = _media_devices(system) if device is None else _media_for(system, device)
            for medium in slots:
                if medium.inserted:
                    medium.eject_media()

        await self._call(task, f"eject virtual {device or 'all'} media", eject)

    async def attach_virtual_media(self, task: base.Task, device_type: str, image_url: str) -> None:
        """API 1.89: the same insert the virtual-media boot uses, on request."""
        if device_type not in VIRTUAL_MEDIA_TYPES:
            raise errors.InvalidParameterValue(
                f"The redfish management interface cannot attach a virtual {device_type}; "
                f"it attaches {', '.join(VIRTUAL_MEDIA_TYPES)}"
            )
        await self.insert_virtual_media(task, device_type, image_url)

    async def detach_virtual_media(self, task: base.Task, device_types: list[str] | None = None) -> None:
        for device in device_types or [None]:  # type: ignore[list-item]
            if device is not None and device not in VIRTUAL_MEDIA_TYPES:
                continue  # no such slot on a Redfish BMC: nothing is attached there
            await self.eject_virtual_media(task, device)

    async def get_virtual_media(self, task: base.Task) -> list[dict[str, Any]]:
        """What each virtual media slot holds: id, media types, image, inserted."""

        def read(system: Any) -> list[dict[str, Any]]:
            return [
                {
                    "id": m.identity,
                    "media_types": sorted(t.value for t in (m.media_types or ())),
                    "image": m.image or None,
                    "inserted": bool(m.inserted),
                }
                for m in _media_devices(system)
            ]

        return await self._call(task, "read the virtual media", read)

    async def get_console_tail(self, task: base.Task, lines: int = 20) -> list[str]:
        """The BMC's console log: the system's LogService named ``Console`` (or ``SerialConsole``).

        sushy has no log services, so the documents are read through the
        system's own connection. Entries may come expanded (``Message`` in each
        member, as Ferrum's simulator serves them) or as links, which are read
        one by one (the last ``lines`` only)."""

        def read(system: Any) -> list[str]:
            conn = system._conn  # sushy's connector: same session, auth and TLS settings
            services = (system.json or {}).get("LogServices") or {}
            if not services.get("@odata.id"):
                return []
            members = conn.get(services["@odata.id"]).json().get("Members") or []
            console = next(
                (
                    m["@odata.id"]
                    for m in members
                    if str(m.get("@odata.id", "")).rstrip("/").rsplit("/", 1)[-1] in CONSOLE_LOG_SERVICES
                ),
                None,
            )
            if console is None:
                return []
            service = conn.get(console).json()
            entries_path = (service.get("Entries") or {}).get("@odata.id")
            if not entries_path:
                return []
            found = []
            for entry in (conn.get(entries_path).json().get("Members") or [])[-lines:]:
                if "Message" not in entry and entry.get("@odata.id"):
                    entry = conn.get(entry["@odata.id"]).json()
                found.append(str(entry.get("Message") or ""))
            return found

        try:
            return await self._call(task, "read the console log", read)
        except (errors.FerrumError, ValueError, AttributeError) as exc:
            LOG.info("no console log from the BMC node_uuid=%s reason=%s", task.node.get("uuid"), exc)
            return []
