"""The ``redfish`` bios interface: a System's Bios resource through sushy, as
Ironic's ``redfish`` bios does it.

``cache_bios_settings`` stores the BIOS ``Attributes`` (and, from the BMC's
attribute registry, each one's type, allowed values, bounds and flags) in
the node's cached settings, what ``GET /v1/nodes/{id}/bios`` shows.

``apply_configuration`` and ``factory_reset`` are clean and service steps
(bios_steps.py). A BIOS applies new settings only while the machine starts
(POST), so each step stages its change on the BMC (a PATCH of the
``@Redfish.Settings`` SettingsObject, or the ``Bios.ResetBios`` action),
reboots the node through its power interface, and then reads the Bios
resource until the change took effect, the BMC dropped it, or
``redfish_bios_apply_timeout`` passed. Unlike Ironic, which returns
``clean wait`` and lets a periodic task notice the reboot finished, the
step waits itself: the steps Ferrum ships run out of band, so nothing else
would run on the node meanwhile, and the outcome stays in one place. The
node ends in the power state it had (a manageable node is off again, an
active one is running).

A step fails, with a last_error that names the settings, when the BMC
refuses the staged values (its Redfish messages are quoted), or when after
the reboot a value is not what was asked for (with the ``Messages`` the BMC
reported for the last apply). Settings already at the requested values are
not staged and the node is not rebooted, as Ironic skips them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import sushy
from sushy import exceptions as sushy_exc

from services.common import errors, states
from services.conductor.drivers import base, bios_steps
from services.conductor.drivers.redfish import _float_option, _RedfishBase
from services.conductor.drivers.redfish_client import RedfishInfo

LOG = logging.getLogger(__name__)

DEFAULT_APPLY_TIMEOUT = 600.0  # a server's POST with new BIOS settings takes minutes


@dataclass(frozen=True)
class BiosView:
    """One read of a System's Bios resource."""

    attributes: dict[str, Any]
    pending: dict[str, Any]
    registry: dict[str, dict[str, Any]] = field(default_factory=dict)  # name -> REGISTRY_COLUMNS
    defaults: dict[str, Any] = field(default_factory=dict)  # name -> the registry's DefaultValue
    apply_on_reset: bool = False
    messages: tuple[str, ...] = ()  # what the BMC said about the last apply (not OK ones)


def _bios_of(system: Any) -> Any:
    try:
        return system.bios
    except sushy_exc.MissingAttributeError:
        raise errors.UnsupportedDriverExtension(
            f"Redfish system {system.identity} has no Bios resource: its BMC does not support BIOS settings"
        ) from None


def _registry_details(entry: Any) -> dict[str, Any]:
    values = entry.allowable_values
    if isinstance(values, list):
        values = [v.get("ValueName") or v.get("ValueDisplayName") for v in values if isinstance(v, dict)]
        values = [v for v in values if v]
    return {
        "attribute_type": entry.attribute_type,
        "allowable_values": values or None,
        "lower_bound": entry.lower_bound,
        "upper_bound": entry.upper_bound,
        "min_length": entry.min_length,
        "max_length": entry.max_length,
        "read_only": entry.read_only,
        "reset_required": entry.reset_required,
        "unique": entry.unique,
    }


def read_bios(system: Any) -> BiosView:
    """Attributes, pending attributes, registry and last-apply messages. Blocking."""
    bios = _bios_of(system)
    attributes = dict(bios.attributes or {})
    try:
        pending = bios.pending_attributes
    except (sushy_exc.SushyError, AttributeError) as exc:
        LOG.debug("no pending BIOS settings readable system=%s reason=%s", system.identity, exc)
        pending = {}
    try:
        apply_on_reset = sushy.APPLY_TIME_ON_RESET in (bios.supported_apply_times or [])
    except AttributeError:
        apply_on_reset = False
    settings = (bios.json or {}).get("@Redfish.Settings") or {}
    messages = tuple(
        f"{m.get('MessageId', '')}: {m.get('Message', '')}".strip(": ")
        for m in settings.get("Messages") or []
        if isinstance(m, dict) and str(m.get("Severity", "OK")).upper() != "OK"
    )
    registry: dict[str, dict[str, Any]] = {}
    defaults: dict[str, Any] = {}
    try:
        found = bios.get_attribute_registry()
        entries = found.registry_entries.attributes if found and found.registry_entries else []
    except Exception as exc:  # noqa: BLE001 - a registry is optional; the settings stand without it
        LOG.info("no BIOS attribute registry system=%s reason=%s", system.identity, exc)
        entries = []
    for entry in entries or []:
        registry[entry.name] = _registry_details(entry)
        if entry.default_value is not None and not entry.read_only:
            defaults[entry.name] = entry.default_value
    return BiosView(
        attributes=attributes,
        pending=pending if isinstance(pending, dict) else {},
        registry=registry,
        defaults=defaults,
        apply_on_reset=apply_on_reset,
        messages=messages,
    )


def bmc_messages(exc: sushy_exc.HTTPError) -> str:
    """Every message of a Redfish error, as the BMC worded them."""
    found = [
        str(info.get("Message") or info.get("MessageId"))
        for info in exc.extended_info or []
        if isinstance(info, dict) and (info.get("Message") or info.get("MessageId"))
    ]
    return " ".join(found) or str(exc.detail or f"HTTP {exc.status_code}")


def typed(settings: Sequence[Mapping[str, Any]], view: BiosView) -> dict[str, Any]:
    """name -> value with the JSON type the BIOS holds: API clients send text
    ("120", "true") for Integer and Boolean attributes, as Ironic converts them."""
    wanted = {}
    for setting in settings:
        name, value = setting["name"], setting["value"]
        kind = (view.registry.get(name) or {}).get("attribute_type")
        current = view.attributes.get(name)
        if kind is None and current is not None:
            kind = {bool: "Boolean", int: "Integer"}.get(type(current))
        if isinstance(value, str) and kind == "Integer":
            with contextlib.suppress(ValueError):  # not a number: the BMC says what it thinks of it
                value = int(value.strip())
        elif isinstance(value, str) and kind == "Boolean" and value.strip().lower() in ("true", "false"):
            value = value.strip().lower() == "true"
        wanted[name] = value
    return wanted


def describe(values: Mapping[str, Any]) -> str:
    return ", ".join(f"{name}={value!r}" for name, value in values.items())


class RedfishBIOS(_RedfishBase, base.BIOSInterface):
    name = "redfish"

    def __init__(self, options: Any = None) -> None:
        super().__init__(options)
        self._setup()
        self.apply_timeout = _float_option(self.options, "redfish_bios_apply_timeout", DEFAULT_APPLY_TIMEOUT)

    def get_clean_steps(self, task: base.Task) -> list[dict[str, Any]]:
        return bios_steps.steps()

    def get_service_steps(self, task: base.Task) -> list[dict[str, Any]]:
        return bios_steps.steps()

    async def step_argument_problems(self, task: base.Task, step: Mapping[str, Any]) -> list[str]:
        if step.get("step") != "apply_configuration":
            return []
        settings = (step.get("args") or {}).get("settings")
        problems = bios_steps.shape_problems(settings)
        if problems or not isinstance(settings, list) or task.read_bios_settings is None:
            return problems
        return bios_steps.cached_problems(settings, await task.read_bios_settings())

    # ---- caching -----------------------------------------------------------------------

    async def cache_bios_settings(self, task: base.Task) -> None:
        view = await self._call(task, "read the BIOS settings", read_bios)
        await self._store(task, view)

    async def _store(self, task: base.Task, view: BiosView) -> None:
        if task.save_bios_settings is None:
            return
        settings = {name: bios_steps.as_text(value) for name, value in view.attributes.items()}
        registry = {name: details for name, details in view.registry.items() if name in settings}
        await task.save_bios_settings(settings, registry)
        LOG.info("cached BIOS settings node_uuid=%s count=%d", task.node["uuid"], len(settings))

    # ---- steps -------------------------------------------------------------------------

    async def apply_configuration(self, task: base.Task, settings: list[dict[str, Any]]) -> str | None:
        info = self.redfish_info(task.node)
        view = await self._info_call(info, "read the BIOS settings", read_bios)
        wanted = typed(settings, view)
        if all(view.attributes.get(n) == v and view.pending.get(n, v) == v for n, v in wanted.items()):
            LOG.info("BIOS settings already applied, no reboot node_uuid=%s settings=%s", task.node["uuid"], wanted)
            await self._store(task, view)
            return None
        apply_time = sushy.APPLY_TIME_ON_RESET if view.apply_on_reset else None

        def stage(system: Any) -> None:
            try:
                _bios_of(system).set_attributes(wanted, apply_time=apply_time)
            except sushy_exc.HTTPError as exc:
                raise errors.BMCError(
                    f"The BMC of node {task.node['uuid']} refused the BIOS settings {describe(wanted)}: "
                    f"{bmc_messages(exc)}"
                ) from exc

        LOG.info("staging BIOS settings node_uuid=%s settings=%s", task.node["uuid"], wanted)
        await self._info_call(info, "stage the BIOS settings", stage)
        final = await self._reboot_until(task, info, lambda v: self._settings_outcome(task, v, wanted))
        await self._store(task, final)
        return None

    def _settings_outcome(self, task: base.Task, view: BiosView, wanted: Mapping[str, Any]) -> bool:
        """True once the BMC consumed the staged values; raises if one did not take effect.
        A BMC whose pending area holds every writable attribute (HPE, Lenovo) shows a
        consumed value there equal to the current one."""
        if any(n in view.pending and view.pending[n] != view.attributes.get(n) for n in wanted):
            return False
        missing = {n: v for n, v in wanted.items() if view.attributes.get(n) != v}
        if missing:
            now = {n: view.attributes.get(n) for n in missing}
            raise errors.BMCError(
                f"BIOS settings {describe(missing)} did not take effect on node {task.node['uuid']} after the "
                f"reboot (the BIOS has {describe(now)}); the BMC reported: "
                f"{' '.join(view.messages) or 'no message'}"
            )
        return True

    async def factory_reset(self, task: base.Task) -> str | None:
        info = self.redfish_info(task.node)

        def reset(system: Any) -> None:
            try:
                _bios_of(system).reset_bios()
            except sushy_exc.MissingActionError:
                raise errors.UnsupportedDriverExtension(
                    f"Redfish system {system.identity} offers no Bios.ResetBios action: no BIOS factory reset"
                ) from None
            except sushy_exc.HTTPError as exc:
                raise errors.BMCError(
                    f"The BMC of node {task.node['uuid']} refused the BIOS factory reset: {bmc_messages(exc)}"
                ) from exc

        LOG.info("BIOS factory reset node_uuid=%s", task.node["uuid"])
        await self._info_call(info, "reset the BIOS to factory defaults", reset)
        final = await self._reboot_until(task, info, self._reset_outcome)
        await self._store(task, final)
        return None

    @staticmethod
    def _reset_outcome(view: BiosView) -> bool:
        """Done once every writable attribute the registry gives a default has it
        (without a registry nothing can be checked: one read after the reboot)."""
        return all(view.attributes.get(n, v) == v for n, v in view.defaults.items())

    async def _reboot_until(self, task: base.Task, info: RedfishInfo, done: Callable[[BiosView], bool]) -> BiosView:
        """Reboot the node so its BIOS applies what was staged, then read the Bios
        resource until ``done(view)``; the node is left in the power state it had."""
        power = task.driver.power
        was_on = await power.get_power_state(task) == states.POWER_ON
        await task.driver.boot.before_power_on(task)
        await power.reboot(task)
        await task.save_fields({"power_state": states.POWER_ON})
        deadline = time.monotonic() + self.apply_timeout
        try:
            while True:
                view = await self._info_call(info, "read the BIOS settings", read_bios)
                if done(view):
                    return view
                if time.monotonic() >= deadline:
                    raise errors.BMCError(
                        f"The BIOS of node {task.node['uuid']} had not applied the staged change "
                        f"{self.apply_timeout:g} s after the reboot (redfish_bios_apply_timeout); pending: "
                        f"{describe(view.pending) or 'nothing'}; the BMC reported: "
                        f"{' '.join(view.messages) or 'no message'}"
                    )
                await asyncio.sleep(self.poll_interval)
        finally:
            if not was_on:
                await self._power_off_again(task)

    async def _power_off_again(self, task: base.Task) -> None:
        try:
            await task.driver.power.set_power_state(task, states.POWER_OFF)
            await task.save_fields({"power_state": states.POWER_OFF})
        except errors.FerrumError as exc:
            LOG.warning("could not power the node off after its BIOS step node_uuid=%s: %s", task.node["uuid"], exc)
