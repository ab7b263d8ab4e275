"""The ``ipmitool`` power and management interfaces (IPMI 2.0 over pyghmi, off the event loop).

Named as Ironic names them (its ``ipmi`` hardware type's interfaces are
``ipmitool``), so node documents and client scripts carry over; they speak
IPMI through pyghmi rather than by running the ipmitool binary.

Every pyghmi call runs in a worker thread of the interface's own bounded
pool (``ipmi_workers``), with a deadline (``ipmi_timeout``) that pyghmi's
retry timers honour too (ipmi_client.py), so a silent BMC costs one worker
for at most that long and the caller gets a ``BMCError`` naming the BMC.
Sessions are reused per BMC, credentials, privilege and cipher suite
(``SessionCache``), shared by the power and management interfaces of a
conductor. Power changes are confirmed by polling the chassis status until
it reports the wanted state (``ipmi_power_timeout``); a reboot is power off
then power on, each confirmed, as Ironic's ipmitool power does.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from services.common import errors, node_capabilities, states
from services.common.db.records import NodeRecord
from services.conductor.drivers import base, power_change
from services.conductor.drivers.ipmi_client import (
    DRIVER_INFO_PROPERTIES,
    IpmiCommand,
    IpmiInfo,
    SessionCache,
    parse_driver_info,
)

LOG = logging.getLogger(__name__)
T = TypeVar("T")

DEFAULT_POWER_TIMEOUT = 60.0
DEFAULT_POLL_INTERVAL = 1.0
DEFAULT_TIMEOUT = 10.0
DEFAULT_RETRIES = 3
DEFAULT_WORKERS = 16
DEFAULT_MAX_SESSIONS = 10_000
DEFAULT_KEEPALIVE_INTERVAL = 30.0
CLOSE_TIMEOUT = 15.0
CALL_GRACE = 2.0  # beyond the deadline, how long the event loop waits for a worker before giving up on it

# Ironic's boot devices -> pyghmi's names for the IPMI boot flags selectors.
BOOT_DEVICES = {"pxe": "network", "disk": "hd", "cdrom": "optical", "bios": "setup", "safe": "safe"}
BOOT_DEVICES_REV = {v: k for k, v in BOOT_DEVICES.items()}
# Ironic's power targets -> IPMI chassis controls (pyghmi's names); no graceful restart in IPMI.
CHASSIS_CONTROLS = {states.POWER_ON: "on", states.POWER_OFF: "off", states.SOFT_POWER_OFF: "shutdown"}
BOOT_MODES = ("bios", "uefi")
DEFAULT_BOOT_MODE = "uefi"  # Ironic's default_boot_mode, and the renderer's


def _float_option(options: dict[str, Any], name: str, default: float) -> float:
    try:
        value = float(options.get(name, default))
    except (TypeError, ValueError):
        raise errors.InvalidParameterValue(f"conductor option {name} must be a number") from None
    return value if value > 0 else default


# ---- the session cache shared by a conductor's ipmitool interfaces -----------------------

_SHARED_LOCK = threading.Lock()
_SHARED: dict[tuple[float, int, int, float], tuple[SessionCache, int]] = {}


def _acquire_cache(timeout: float, retries: int, max_sessions: int, keepalive_interval: float) -> SessionCache:
    """The cache for these settings, shared with the conductor's other ipmitool interface
    (one session per BMC, whichever interface asks), counted so the last ``close`` closes it."""
    key = (timeout, retries, max_sessions, keepalive_interval)
    with _SHARED_LOCK:
        cache, users = _SHARED.get(key, (None, 0))
        if cache is None:
            cache = SessionCache(
                timeout=timeout, retries=retries, max_sessions=max_sessions, keepalive_interval=keepalive_interval
            )
        _SHARED[key] = (cache, users + 1)
        return cache


def _release_cache(cache: SessionCache) -> bool:
    """Drop one use of ``cache``; True when it was the last (the caller closes it)."""
    with _SHARED_LOCK:
        for key, (found, users) in list(_SHARED.items()):
            if found is cache:
                if users <= 1:
                    del _SHARED[key]
                    return True
                _SHARED[key] = (found, users - 1)
                return False
    return False


def node_boot_mode(node: NodeRecord) -> str:
    """bios or uefi: the node's boot_mode, its capabilities, instance_info, else uefi."""
    candidates = [
        node.get("boot_mode"),
        node_capabilities.of_node(node).get("boot_mode"),
        (node.get("instance_info") or {}).get("deploy_boot_mode"),
    ]
    for value in candidates:
        if isinstance(value, str) and value.strip().lower() in BOOT_MODES:
            return value.strip().lower()
    return DEFAULT_BOOT_MODE


class _IpmiBase:
    """What power and management share: options, the session cache, calls in the pool."""

    options: dict[str, Any]
    kind: str

    def _setup(self) -> None:
        self.power_timeout = _float_option(self.options, "ipmi_power_timeout", DEFAULT_POWER_TIMEOUT)
        self.poll_interval = _float_option(self.options, "ipmi_poll_interval", DEFAULT_POLL_INTERVAL)
        self.timeout = _float_option(self.options, "ipmi_timeout", DEFAULT_TIMEOUT)
        retries = int(_float_option(self.options, "ipmi_retries", DEFAULT_RETRIES))
        max_sessions = int(_float_option(self.options, "ipmi_max_sessions", DEFAULT_MAX_SESSIONS))
        keepalive = self.options.get("ipmi_keepalive_interval", DEFAULT_KEEPALIVE_INTERVAL)
        try:
            keepalive = max(0.0, float(keepalive))  # 0: no keep-alives
        except (TypeError, ValueError):
            raise errors.InvalidParameterValue("conductor option ipmi_keepalive_interval must be a number") from None
        self.sessions = _acquire_cache(self.timeout, retries, max_sessions, keepalive)
        workers = int(_float_option(self.options, "ipmi_workers", DEFAULT_WORKERS))
        self._executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix=f"ipmi-{self.kind}")
        self._closed = False

    def get_properties(self) -> dict[str, str]:
        return dict(DRIVER_INFO_PROPERTIES)

    def ipmi_info(self, node: NodeRecord) -> IpmiInfo:
        return parse_driver_info(node)

    async def validate(self, task: base.Task) -> None:
        self.ipmi_info(task.node)

    async def close(self) -> None:
        """At conductor stop: log out of every BMC session (bounded, when the other
        ipmitool interface is done with them too), then drop the threads."""
        if self._closed:
            return
        self._closed = True
        if _release_cache(self.sessions):
            loop = asyncio.get_running_loop()
            try:
                await asyncio.wait_for(loop.run_in_executor(self._executor, self.sessions.close), CLOSE_TIMEOUT)
            except TimeoutError:
                LOG.warning("ipmitool %s interface: BMC logouts still running after %ss", self.kind, CLOSE_TIMEOUT)
        self._executor.shutdown(wait=False, cancel_futures=True)

    async def _call(self, task: base.Task, action: str, fn: Callable[[IpmiCommand], T]) -> T:
        return await self._info_call(self.ipmi_info(task.node), action, fn)

    async def _info_call(self, info: IpmiInfo, action: str, fn: Callable[[IpmiCommand], T]) -> T:
        """``sessions.call`` in this interface's pool with a deadline, and the caller's context (log ids)."""
        deadline = time.monotonic() + self.timeout
        context = contextvars.copy_context()
        call = functools.partial(context.run, self.sessions.call, info, action, fn, deadline=deadline)
        future = asyncio.get_running_loop().run_in_executor(self._executor, call)
        try:
            return await asyncio.wait_for(future, self.timeout + CALL_GRACE)
        except TimeoutError:
            raise errors.BMCError(
                f"IPMI BMC at {info.describe()} gave no answer within {self.timeout:g}s while trying to {action}"
            ) from None


def _read_power(command: IpmiCommand) -> str:
    state = command.get_power().get("powerstate")
    if state == "on":
        return states.POWER_ON
    if state == "off":
        return states.POWER_OFF
    raise errors.BMCError(f"IPMI BMC at {command.bmc} reports an unknown power state {state!r}")


class IpmiPower(_IpmiBase, base.PowerInterface):
    name = "ipmitool"

    def __init__(self, options: Any = None) -> None:
        super().__init__(options)
        self._setup()

    def get_supported_power_states(self) -> list[str]:
        return [states.POWER_ON, states.POWER_OFF, states.REBOOT, states.SOFT_REBOOT, states.SOFT_POWER_OFF]

    async def get_power_state(self, task: base.Task) -> str:
        return await self._call(task, "read the power state", _read_power)

    async def set_power_state(self, task: base.Task, state: str, timeout: float | None = None) -> None:
        if state not in self.get_supported_power_states():
            raise errors.InvalidParameterValue(
                f"ipmitool power cannot set {state!r}; supported: {self.get_supported_power_states()}"
            )
        await power_change.set_power_state(self._control(task), state, timeout or self.power_timeout)

    async def reboot(self, task: base.Task, timeout: float | None = None) -> None:
        await power_change.reboot(self._control(task), timeout or self.power_timeout)

    def _control(self, task: base.Task) -> power_change.PowerControl:
        """The node's BMC for power_change: chassis status reads and chassis controls."""
        info = self.ipmi_info(task.node)

        async def read() -> str:
            return await self._info_call(info, "read the power state", _read_power)

        async def request(state: str) -> None:
            control = CHASSIS_CONTROLS[state]
            LOG.info(
                "ipmi chassis control node_uuid=%s bmc=%s control=%s", task.node.get("uuid"), info.where(), control
            )
            await self._info_call(info, f"power {control}", lambda command: command.set_power(control, wait=False))

        return power_change.PowerControl(
            node_uuid=str(task.node.get("uuid")),
            bmc=f"IPMI BMC {info.where()}",
            read=read,
            request=request,
            poll_interval=self.poll_interval,
            graceful_restart=False,  # IPMI has no graceful restart: an ACPI shutdown, confirmed, then on
        )


class IpmiManagement(_IpmiBase, base.ManagementInterface):
    name = "ipmitool"

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
        uefi = node_boot_mode(task.node) == "uefi"
        LOG.info(
            "ipmi boot device node_uuid=%s device=%s persistent=%s uefi=%s",
            task.node.get("uuid"),
            device,
            persistent,
            uefi,
        )
        await self._call(
            task,
            f"set the boot device to {device}",
            lambda command: command.set_bootdev(BOOT_DEVICES[device], persist=persistent, uefiboot=uefi),
        )

    async def get_boot_device(self, task: base.Task) -> dict[str, Any]:
        def read(command: IpmiCommand) -> dict[str, Any]:
            found = command.get_bootdev()
            return {
                "boot_device": BOOT_DEVICES_REV.get(found.get("bootdev")),
                "persistent": bool(found.get("persistent")) and found.get("bootdev") != "default",
            }

        return await self._call(task, "read the boot device", read)

    # Boot mode: IPMI carries it as the EFI flag of a boot device override, so it
    # is applied with one: to the override in force now, and to every later one
    # (set_boot_device reads the node's boot_mode, which the conductor records).
    def get_supported_boot_modes(self, task: base.Task) -> list[str]:
        return list(BOOT_MODES)

    async def get_boot_mode(self, task: base.Task) -> str | None:
        def read(command: IpmiCommand) -> str | None:
            found = command.get_bootdev()
            if found.get("bootdev") in (None, "default"):
                return None  # no override in force: the flags say nothing about the mode
            return "uefi" if found.get("uefimode") else "bios"

        return await self._call(task, "read the boot mode", read) or task.node.get("boot_mode")

    async def set_boot_mode(self, task: base.Task, mode: str) -> None:
        if mode not in BOOT_MODES:
            raise errors.InvalidParameterValue(f"Invalid boot mode {mode!r}; supported: {', '.join(BOOT_MODES)}")

        def apply(command: IpmiCommand) -> None:
            found = command.get_bootdev()
            if found.get("bootdev") in (None, "default") or found.get("bootdev") not in BOOT_DEVICES_REV:
                return  # nothing to re-send: the mode goes with the next boot device override
            command.set_bootdev(found["bootdev"], persist=bool(found.get("persistent")), uefiboot=mode == "uefi")

        LOG.info("ipmi boot mode node_uuid=%s mode=%s", task.node.get("uuid"), mode)
        await self._call(task, f"set the boot mode to {mode}", apply)
