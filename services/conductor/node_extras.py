"""Conductor halves of vendor passthru (API 1.1), indicators (1.63) and boot
mode / secure boot (1.76).

Like every conductor operation they resolve the node's composed driver here,
so the api never touches hardware. Reads use shared access (no lock, as
Ironic's ``shared=True``); changes take the node lock, and the boot mode and
secure boot changes run in the background under it (the api answers 202).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from services.common import errors
from services.conductor.drivers import base

if TYPE_CHECKING:
    from services.conductor.manager import ConductorManager

LOG = logging.getLogger(__name__)
BOOT_MODES = ("bios", "uefi")
INDICATOR_STATES = ("OFF", "ON", "BLINKING", "UNKNOWN")


def _no_handler(method: str) -> errors.FerrumError:
    return errors.InvalidParameterValue(f"No handler for method {method}")


def _check_http_method(spec: base.VendorMethod, method: str, http_method: str) -> None:
    if http_method.upper() not in spec.http_methods:
        raise errors.InvalidParameterValue(f"The method {method} does not support HTTP {http_method.upper()}")


def _routes_of(vendor: base.VendorInterface, driver_level: bool) -> dict[str, base.VendorMethod]:
    """The interface's methods; ``no-vendor`` (and any interface without
    methods of that level) is Ironic's UnsupportedDriverExtension."""
    routes = dict(vendor.driver_methods if driver_level else vendor.methods)
    if not vendor.methods and not vendor.driver_methods:
        raise base.unsupported(vendor, "vendor passthru")
    return routes


class NodeExtras:
    """Vendor passthru, indicators, boot mode and secure boot for one conductor."""

    def __init__(self, manager: ConductorManager) -> None:
        self.manager = manager

    async def _shared_task(self, node_uuid: str) -> base.Task:
        node = await self.manager.nodes.get(node_uuid)
        return await self.manager.tasks.build_task(node)

    def _driver_vendor(self, driver: str) -> base.VendorInterface:
        registry = self.manager.registry
        names = registry.supported(driver, "vendor")  # DriverNotFound when not served here
        if not names:
            raise errors.InvalidParameterValue(f"Driver {driver} has no vendor interface")
        return registry.enabled["vendor"][names[0]]  # type: ignore[return-value]

    # -- vendor passthru ---------------------------------------------------------

    async def vendor_methods(self, node_uuid: str, driver: str) -> dict[str, Any]:
        if node_uuid:
            vendor = (await self._shared_task(node_uuid)).driver.vendor
            routes = dict(vendor.methods)
        else:
            vendor = self._driver_vendor(driver)
            routes = dict(vendor.driver_methods)
        return {name: spec.describe() for name, spec in sorted(routes.items())}

    async def vendor_passthru(
        self, node_uuid: str, driver: str, method: str, http_method: str, data: Any
    ) -> tuple[bool, bool, Any]:
        """Returns (is_async, attach, return value). Async methods run under the
        node lock in the background and return None, as in Ironic."""
        if not node_uuid:
            return await self._driver_passthru(driver, method, http_method, data)
        shared = await self._shared_task(node_uuid)
        routes = _routes_of(shared.driver.vendor, driver_level=False)
        spec = routes.get(method)
        if spec is None:
            raise _no_handler(method)
        _check_http_method(spec, method, http_method)
        await shared.driver.vendor.validate_passthru(shared, method, data)
        if not spec.is_async:
            if not spec.require_exclusive_lock:
                return False, spec.attach, await shared.driver.vendor.call_method(shared, method, http_method, data)
            task = await self.manager.tasks.acquire(node_uuid)
            try:
                result = await task.driver.vendor.call_method(task, method, http_method, data)
            finally:
                await self.manager.tasks.release(node_uuid)
            return False, spec.attach, result

        async def work(task: base.Task) -> None:
            try:
                await task.driver.vendor.call_method(task, method, http_method, data)
                LOG.info("vendor passthru done node_uuid=%s method=%s", node_uuid, method)
            except Exception as exc:  # noqa: BLE001 - an async method has no caller to answer to: log and record it
                text = exc.message if isinstance(exc, errors.FerrumError) else f"{type(exc).__name__}: {exc}"
                LOG.warning("vendor passthru failed node_uuid=%s method=%s reason=%s", node_uuid, method, text)
                await self.manager.record_event(
                    task.node, "vendor-passthru", f"{method} failed: {text}", severity="ERROR"
                )

        # Async methods run in the background under the node lock (shared-lock
        # ones too: Ferrum does not run two operations on a node at once).
        self.manager.tasks.check_capacity()
        task = await self.manager.tasks.acquire(node_uuid)
        self.manager.tasks.spawn(task, work, name=f"vendor:{method}")
        return True, spec.attach, None

    async def _driver_passthru(self, driver: str, method: str, http_method: str, data: Any) -> tuple[bool, bool, Any]:
        vendor = self._driver_vendor(driver)
        spec = _routes_of(vendor, driver_level=True).get(method)
        if spec is None:
            raise _no_handler(method)
        _check_http_method(spec, method, http_method)
        await vendor.validate_passthru(None, method, data)
        # Driver methods have no node and no lock; async ones still answer 202 at once.
        result = await vendor.call_driver_method(method, http_method, data)
        return spec.is_async, spec.attach, None if spec.is_async else result

    # -- indicators (1.63) ---------------------------------------------------------

    async def supported_indicators(self, node_uuid: str) -> dict[str, Any]:
        task = await self._shared_task(node_uuid)
        await task.driver.management.validate(task)
        return await task.driver.management.get_supported_indicators(task)

    async def indicator_state(self, node_uuid: str, component: str, indicator: str) -> str:
        task = await self._shared_task(node_uuid)
        await task.driver.management.validate(task)
        return await task.driver.management.get_indicator_state(task, component, indicator)

    async def set_indicator_state(self, node_uuid: str, component: str, indicator: str, state: str) -> None:
        if state not in INDICATOR_STATES:
            raise errors.InvalidParameterValue(
                f"Invalid indicator state {state!r}; valid states are {', '.join(INDICATOR_STATES)}"
            )
        task = await self.manager.tasks.acquire(node_uuid)
        try:
            await task.driver.management.validate(task)
            await task.driver.management.set_indicator_state(task, component, indicator, state)
            await self.manager.record_event(task.node, "indicator", f"indicator {indicator}@{component} set to {state}")
        finally:
            await self.manager.tasks.release(node_uuid)

    # -- boot mode and secure boot (1.76) ---------------------------------------------

    async def _locked_change(self, node_uuid: str, what: str, check: Any, apply: Any, field: str, value: Any) -> None:
        """Lock, check at once (400/409 to the caller), then apply in the background."""
        self.manager.tasks.check_capacity()
        task = await self.manager.tasks.acquire(node_uuid)
        try:
            node = task.node
            if node["target_provision_state"]:
                raise errors.InvalidStateRequested(
                    f'Can not change the {what} of node {node_uuid} while it is in state "{node["provision_state"]}"'
                )
            await task.driver.management.validate(task)
            check(task)
        except BaseException:
            await self.manager.tasks.release(node_uuid)
            raise

        async def work(task: base.Task) -> None:
            try:
                await apply(task)
                await task.save_fields({field: value})
                await self.manager.record_event(task.node, what.replace(" ", "-"), f"{what} set to {value}")
            except Exception as exc:  # noqa: BLE001 - a background change has no caller: record any failure on the node
                text = exc.message if isinstance(exc, errors.FerrumError) else f"{type(exc).__name__}: {exc}"
                message = f"Failed to set the {what} of node {node_uuid} to {value}: {text}"
                LOG.warning("management change failed node_uuid=%s what=%s reason=%s", node_uuid, what, text)
                await task.save_fields({"last_error": message})
                await self.manager.record_event(task.node, what.replace(" ", "-"), message, severity="ERROR")

        self.manager.tasks.spawn(task, work, name=what)

    async def set_boot_mode(self, node_uuid: str, mode: str) -> None:
        if mode not in BOOT_MODES:
            raise errors.InvalidParameterValue(f"Invalid boot mode {mode!r}: must be one of {', '.join(BOOT_MODES)}")

        def check(task: base.Task) -> None:
            supported = task.driver.management.get_supported_boot_modes(task)
            if mode not in supported:
                raise base.unsupported(task.driver.management, f"boot mode {mode}")

        await self._locked_change(
            node_uuid,
            "boot mode",
            check,
            lambda task: task.driver.management.set_boot_mode(task, mode),
            "boot_mode",
            mode,
        )

    async def set_secure_boot_state(self, node_uuid: str, state: bool) -> None:
        def check(task: base.Task) -> None:
            if state and task.node.get("boot_mode") == "bios":
                raise errors.InvalidParameterValue(
                    f"Secure boot needs UEFI boot mode; node {node_uuid} boots in bios mode"
                )

        await self._locked_change(
            node_uuid,
            "secure boot",
            check,
            lambda task: task.driver.management.set_secure_boot_state(task, state),
            "secure_boot",
            state,
        )
