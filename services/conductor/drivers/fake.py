"""Fake implementations of every interface (CONTRACT.md section 8).

They touch no hardware but keep their state in the node, honour configurable
delays, and compose with real boot/deploy logic, so the whole control plane can
be exercised (and benchmarked) without machines.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any, ClassVar

from services.common import errors, raid_config, states
from services.conductor.drivers import base, bios_steps, raid_steps
from services.conductor.drivers.delays import parse_delay, sleep_for


class _Delayed:
    delay_option = ""

    def _delay(self: Any) -> str:
        return str(self.options.get(self.delay_option, "0"))

    async def _sleep(self: Any) -> None:
        await sleep_for(self._delay())

    async def validate(self: Any, task: base.Task) -> None:
        parse_delay(self._delay())


class FakePower(_Delayed, base.PowerInterface):
    name = "fake"
    delay_option = "fake_power_delay"

    async def get_power_state(self, task: base.Task) -> str:
        await self._sleep()
        return task.node.get("power_state") or states.POWER_OFF

    async def set_power_state(self, task: base.Task, state: str, timeout: float | None = None) -> None:
        if state not in (states.POWER_ON, states.POWER_OFF, states.SOFT_REBOOT, states.SOFT_POWER_OFF):
            raise errors.InvalidParameterValue(f"fake power cannot set {state!r}")
        await self._sleep()

    async def reboot(self, task: base.Task, timeout: float | None = None) -> None:
        await self._sleep()

    def get_supported_power_states(self) -> list[str]:
        return [states.POWER_ON, states.POWER_OFF, states.REBOOT, states.SOFT_REBOOT, states.SOFT_POWER_OFF]


class FakeManagement(_Delayed, base.ManagementInterface):
    name = "fake"
    delay_option = "fake_management_delay"

    def get_supported_boot_devices(self, task: base.Task) -> list[str]:
        return ["pxe"]

    async def set_boot_device(self, task: base.Task, device: str, persistent: bool = False) -> None:
        if device not in self.get_supported_boot_devices(task):
            raise errors.InvalidParameterValue(f"Invalid boot device {device} specified.")
        await self._sleep()

    async def get_boot_device(self, task: base.Task) -> dict[str, Any]:
        await self._sleep()
        return {"boot_device": "pxe", "persistent": False}

    # Ironic's fake indicators: a read-only chassis LED and a settable system LED.
    # Set states live in driver_internal_info["fake_indicators"] ("led@system": "BLINKING").
    INDICATORS: ClassVar[dict[str, dict[str, dict[str, Any]]]] = {
        "chassis": {"led-0": {"readonly": True, "states": ["OFF", "ON"]}},
        "system": {"led": {"readonly": False, "states": ["BLINKING", "OFF", "ON"]}},
    }

    async def get_supported_indicators(self, task: base.Task, component: str | None = None) -> dict[str, Any]:
        await self._sleep()
        return {c: v for c, v in self.INDICATORS.items() if not component or component == c}

    def _indicator(self, component: str, indicator: str) -> dict[str, Any]:
        if component not in self.INDICATORS:
            raise errors.InvalidParameterValue(f"Invalid component {component} specified.")
        if indicator not in self.INDICATORS[component]:
            raise errors.InvalidParameterValue(f"Invalid indicator {indicator} specified.")
        return self.INDICATORS[component][indicator]

    async def get_indicator_state(self, task: base.Task, component: str, indicator: str) -> str:
        self._indicator(component, indicator)
        await self._sleep()
        return task.node["driver_internal_info"].get("fake_indicators", {}).get(f"{indicator}@{component}", "ON")

    async def set_indicator_state(self, task: base.Task, component: str, indicator: str, state: str) -> None:
        spec = self._indicator(component, indicator)
        if spec["readonly"]:
            raise errors.InvalidParameterValue(f"Indicator {indicator}@{component} is read-only.")
        if state not in spec["states"]:
            raise errors.InvalidParameterValue(
                f"Invalid state {state!r} for indicator {indicator}@{component}; valid: {spec['states']}"
            )
        await self._sleep()
        current = dict(task.node["driver_internal_info"].get("fake_indicators", {}))
        current[f"{indicator}@{component}"] = state
        await task.save_internal_info({"fake_indicators": current})

    # Virtual media (API 1.89/1.93): one slot per device type, kept in
    # driver_internal_info["fake_vmedia"] ({device_type: image_url}).
    VMEDIA_DEVICES = ("cdrom", "floppy", "disk")

    async def attach_virtual_media(self, task: base.Task, device_type: str, image_url: str) -> None:
        await self._sleep()
        current = dict(task.node["driver_internal_info"].get("fake_vmedia", {}))
        current[device_type] = image_url
        await task.save_internal_info({"fake_vmedia": current})

    async def detach_virtual_media(self, task: base.Task, device_types: list[str] | None = None) -> None:
        await self._sleep()
        current = dict(task.node["driver_internal_info"].get("fake_vmedia", {}))
        for device in device_types or list(current):
            current.pop(device, None)
        await task.save_internal_info({"fake_vmedia": current})

    async def get_virtual_media(self, task: base.Task) -> list[dict[str, Any]]:
        current = task.node["driver_internal_info"].get("fake_vmedia", {})
        return [
            {"media_types": [device], "image": current.get(device), "inserted": device in current}
            for device in self.VMEDIA_DEVICES
        ]

    def get_supported_boot_modes(self, task: base.Task) -> list[str]:
        return ["bios", "uefi"]

    async def set_boot_mode(self, task: base.Task, mode: str) -> None:
        if mode not in self.get_supported_boot_modes(task):
            raise errors.InvalidParameterValue(f"Invalid boot mode {mode!r}; supported: bios, uefi")
        await self._sleep()

    async def set_secure_boot_state(self, task: base.Task, state: bool) -> None:
        await self._sleep()


class FakeBoot(_Delayed, base.BootInterface):
    name = "fake"
    delay_option = "fake_boot_delay"
    capabilities = frozenset({"ipxe_boot", "pxe_boot"})

    async def prepare_ramdisk(self, task: base.Task, ramdisk_params: Any) -> None:
        await self._sleep()

    async def prepare_instance(self, task: base.Task) -> None:
        await self._sleep()


class FakeDeploy(_Delayed, base.DeployInterface):
    """Deploys synchronously: available -> deploying -> active, no call-back."""

    name = "fake"
    delay_option = "fake_deploy_delay"
    # Like direct: a node whose OS is on its boot volume deploys without an image (seed 004).
    capabilities = frozenset({"boot_from_volume", "iscsi_volume_deploy", "fibre_channel_volume_deploy"})

    async def deploy(self, task: base.Task) -> str | None:
        await self._sleep()
        return None

    def get_deploy_steps(self, task: base.Task) -> list[dict[str, Any]]:
        """Ironic's fake deploy offers deploy.deploy; Ferrum adds ``fake_step``
        (priority 0: runs only when a user asks for it, API 1.69), which waits
        ``args.delay`` seconds (at most 10) so its run can be watched."""
        return [
            *super().get_deploy_steps(task),
            {
                "interface": "deploy",
                "step": "fake_step",
                "priority": 0,
                "argsinfo": {"delay": {"description": "seconds to wait (0-10)", "required": False}},
            },
        ]

    async def execute_deploy_step(self, task: base.Task, step: Any) -> None:
        delay = (step.get("args") or {}).get("delay", 0)
        if isinstance(delay, bool) or not isinstance(delay, (int, float)) or not 0 <= delay <= 10:
            raise errors.InvalidParameterValue(
                f"fake_step: delay must be a number of seconds from 0 to 10, not {delay!r}"
            )
        await asyncio.sleep(delay)

    async def tear_down(self, task: base.Task) -> str:
        await self._sleep()
        return "deleted"

    def get_clean_steps(self, task: base.Task) -> list[dict[str, Any]]:
        """The agent's disk erase steps by name, pretended (there is no disk):
        priority 0, so they run only in manual cleaning, and never in a
        ramdisk, so ``disable_ramdisk`` accepts them. Automated cleaning of a
        fake node runs no step."""
        return [
            {"interface": "deploy", "step": name, "priority": 0, "abortable": True, "requires_ramdisk": False}
            for name in ("erase_devices_metadata", "erase_devices")
        ]

    async def execute_clean_step(self, task: base.Task, step: Mapping[str, Any]) -> str | None:
        await self._sleep()
        return None


class FakeStorage(_Delayed, base.StorageInterface):
    name = "fake"
    delay_option = "fake_storage_delay"

    async def attach_volumes(self, task: base.Task) -> None:
        await self._sleep()

    async def detach_volumes(self, task: base.Task) -> None:
        await self._sleep()


class FakeVendor(_Delayed, base.VendorInterface):
    """Ironic's fake vendor interface (FakeVendorB): each method answers
    whether ``bar`` is its magic word; third_method_sync is synchronous."""

    name = "fake"
    delay_option = "fake_vendor_delay"
    WORDS: ClassVar[dict[str, str]] = {
        "second_method": "kazoo",
        "third_method_sync": "meow",
        "fourth_method_shared_lock": "woof",
    }
    methods: ClassVar[Mapping[str, base.VendorMethod]] = {
        "second_method": base.VendorMethod(("POST",), description="Test if the value of bar is kazoo"),
        "third_method_sync": base.VendorMethod(
            ("POST",), is_async=False, description="Test if the value of bar is meow"
        ),
        "fourth_method_shared_lock": base.VendorMethod(
            ("POST",), require_exclusive_lock=False, description="Test if the value of bar is woof"
        ),
        "log_passthrough": base.VendorMethod(("POST",), description="Test pass-through to wait."),
    }

    async def validate_passthru(self, task: base.Task | None, method: str, data: Any) -> None:
        if method in self.WORDS and not (isinstance(data, dict) and data.get("bar")):
            raise errors.MissingParameter(f"Parameter 'bar' not passed to method '{method}'.")

    async def call_method(self, task: base.Task, method: str, http_method: str, data: Any) -> Any:
        await self._sleep()
        if method in self.WORDS:
            return data.get("bar") == self.WORDS[method]
        return None


class FakeInspect(_Delayed, base.InspectInterface):
    name = "fake"
    delay_option = "fake_inspect_delay"

    async def inspect_hardware(self, task: base.Task) -> str:
        await self._sleep()
        return states.MANAGEABLE


class FakeRescue(_Delayed, base.RescueInterface):
    """Ironic's fake rescue: accepts rescue and unrescue without a machine, so
    fake-hardware keeps exercising the rescue verbs (the rescue flow itself
    is another issue's work and does not call it yet)."""

    name = "fake"
    delay_option = "fake_rescue_delay"

    async def rescue(self, task: base.Task) -> str:
        await self._sleep()
        return states.RESCUE

    async def unrescue(self, task: base.Task) -> str:
        await self._sleep()
        return states.ACTIVE


class FakeBIOS(base.BIOSInterface):
    """Ironic's fake bios: the node's cached settings stand for the machine's BIOS.
    ``apply_configuration`` writes the given settings there (any name), ``factory_reset``
    empties it; both are clean and service steps like the real ones."""

    name = "fake"

    def get_clean_steps(self, task: base.Task) -> list[dict[str, Any]]:
        return bios_steps.steps()

    def get_service_steps(self, task: base.Task) -> list[dict[str, Any]]:
        return bios_steps.steps()

    async def step_argument_problems(self, task: base.Task, step: Mapping[str, Any]) -> list[str]:
        if step.get("step") != "apply_configuration":
            return []
        return bios_steps.shape_problems((step.get("args") or {}).get("settings"))

    async def apply_configuration(self, task: base.Task, settings: list[dict[str, Any]]) -> str | None:
        rows = await task.read_bios_settings() if task.read_bios_settings is not None else []
        values = {row["name"]: row["value"] for row in rows}
        values.update({s["name"]: bios_steps.as_text(s["value"]) for s in settings})
        if task.save_bios_settings is not None:
            await task.save_bios_settings(values, {})
        return None

    async def factory_reset(self, task: base.Task) -> str | None:
        if task.save_bios_settings is not None:
            await task.save_bios_settings({}, {})
        return None


class FakeRAID(base.RAIDInterface):
    """A RAID controller that builds at once whatever the node's target RAID
    config asks: ``raid.create_configuration`` records the target's logical
    disks (less those its arguments leave out) as ``raid_config``,
    ``raid.delete_configuration`` empties it. Ironic's fake RAID does nothing
    and offers no steps; this one lets clients and tests exercise the whole
    RAID flow over REST without a controller (docs/drivers.md)."""

    name = "fake"

    def get_clean_steps(self, task: base.Task) -> list[dict[str, Any]]:
        return raid_steps.steps(requires_ramdisk=False)

    async def create_configuration(
        self, task: base.Task, *, create_root_volume: bool = True, create_nonroot_volumes: bool = True
    ) -> str | None:
        target = raid_config.filter_target(
            task.node, create_root_volume=create_root_volume, create_nonroot_volumes=create_nonroot_volumes
        )
        await task.save_fields(
            {
                "raid_config": raid_config.as_current(target),
                "properties": raid_config.properties_after(task.node.get("properties") or {}, target),
            }
        )
        return None

    async def delete_configuration(self, task: base.Task) -> str | None:
        await task.save_fields({"raid_config": {}})
        return None


class FakeFirmware(base.FirmwareInterface):
    """Ironic's fake firmware interface: an ``update`` clean/service step that
    pretends (as the fake deploy's erase steps do) and no components to read,
    so a fake node's firmware list is empty (API 1.86)."""

    name = "fake"
    UPDATE_STEP: ClassVar[dict[str, Any]] = {
        "interface": "firmware",
        "step": "update",
        "priority": 0,
        "abortable": False,
        "requires_ramdisk": False,
        "argsinfo": {
            "settings": {
                "description": "List of firmware components, each a dictionary with component and url",
                "required": True,
                "type": "array",
            }
        },
    }

    async def validate(self, task: base.Task) -> None:
        return None

    def get_clean_steps(self, task: base.Task) -> list[dict[str, Any]]:
        return [dict(self.UPDATE_STEP)]

    def get_service_steps(self, task: base.Task) -> list[dict[str, Any]]:
        return [dict(self.UPDATE_STEP)]

    async def execute_clean_step(self, task: base.Task, step: Mapping[str, Any]) -> str | None:
        return await self.update(task, list((step.get("args") or {}).get("settings") or []))

    async def execute_service_step(self, task: base.Task, step: Mapping[str, Any]) -> str | None:
        return await self.update(task, list((step.get("args") or {}).get("settings") or []))

    async def update(self, task: base.Task, settings: list[dict[str, Any]]) -> str | None:
        return None

    async def read_components(self, task: base.Task) -> list[dict[str, Any]]:
        return []
