"""Conductor half of vendor passthru (API 1.1).

Reads use shared access (no lock, as Ironic's ``shared=True``). Synchronous
methods that need the exclusive lock take it for the call; asynchronous
methods run in the background under the node lock and answer at once.
"""

from __future__ import annotations

import logging
from typing import Any

from services.common import errors
from services.conductor.drivers import base
from services.conductor.drivers.registry import DriverRegistry
from services.conductor.flows.context import error_text
from services.conductor.node_states import NodeStates
from services.conductor.taskmanager import TaskManager

LOG = logging.getLogger(__name__)


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


class VendorPassthru:
    def __init__(self, tasks: TaskManager, states: NodeStates, registry: DriverRegistry) -> None:
        self.tasks = tasks
        self.states = states
        self.registry = registry

    def _driver_vendor(self, driver: str) -> base.VendorInterface:
        names = self.registry.supported(driver, "vendor")  # DriverNotFound when not served here
        if not names:
            raise errors.InvalidParameterValue(f"Driver {driver} has no vendor interface")
        return self.registry.enabled["vendor"][names[0]]  # type: ignore[return-value]

    async def methods(self, node_uuid: str, driver: str) -> dict[str, Any]:
        if node_uuid:
            routes = dict((await self.tasks.shared(node_uuid)).driver.vendor.methods)
        else:
            routes = dict(self._driver_vendor(driver).driver_methods)
        return {name: spec.describe() for name, spec in sorted(routes.items())}

    async def call(
        self, node_uuid: str, driver: str, method: str, http_method: str, data: Any
    ) -> tuple[bool, bool, Any]:
        """Returns (is_async, attach, return value). Async methods run under the
        node lock in the background and return None, as in Ironic."""
        if not node_uuid:
            return await self._driver_call(driver, method, http_method, data)
        shared = await self.tasks.shared(node_uuid)
        spec = _routes_of(shared.driver.vendor, driver_level=False).get(method)
        if spec is None:
            raise _no_handler(method)
        _check_http_method(spec, method, http_method)
        await shared.driver.vendor.validate_passthru(shared, method, data)
        if not spec.is_async:
            if not spec.require_exclusive_lock:
                return False, spec.attach, await shared.driver.vendor.call_method(shared, method, http_method, data)
            async with self.tasks.acquire(node_uuid, f"vendor passthru {method}") as task:
                return False, spec.attach, await task.driver.vendor.call_method(task, method, http_method, data)

        async def work(task: base.Task) -> None:
            try:
                await task.driver.vendor.call_method(task, method, http_method, data)
                LOG.info("vendor passthru done node_uuid=%s method=%s", node_uuid, method)
            except Exception as exc:  # noqa: BLE001 - an async method has no caller to answer to: log and record it
                text = error_text(exc)
                LOG.warning("vendor passthru failed node_uuid=%s method=%s reason=%s", node_uuid, method, text)
                await self.states.record_event(
                    task.node, "vendor-passthru", f"{method} failed: {text}", severity="ERROR"
                )

        # Async methods run in the background under the node lock (shared-lock
        # ones too: Ferrum does not run two operations on a node at once).
        self.tasks.check_capacity()
        async with self.tasks.acquire(node_uuid, f"vendor passthru {method}") as task:
            task.spawn(work, name=f"vendor:{method}")
        return True, spec.attach, None

    async def _driver_call(self, driver: str, method: str, http_method: str, data: Any) -> tuple[bool, bool, Any]:
        vendor = self._driver_vendor(driver)
        spec = _routes_of(vendor, driver_level=True).get(method)
        if spec is None:
            raise _no_handler(method)
        _check_http_method(spec, method, http_method)
        await vendor.validate_passthru(None, method, data)
        # Driver methods have no node and no lock; async ones still answer 202 at once.
        result = await vendor.call_driver_method(method, http_method, data)
        return spec.is_async, spec.attach, None if spec.is_async else result
