"""Fake implementations of every interface (CONTRACT.md section 8).

They touch no hardware but keep their state in the node, honour configurable
delays, and compose with real boot/deploy logic, so the whole control plane can
be exercised (and benchmarked) without machines.
"""

from __future__ import annotations

from typing import Any

from services.common import errors, states
from services.conductor.drivers import base
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

    async def set_power_state(self, task: base.Task, state: str, timeout: int | None = None) -> None:
        if state not in (states.POWER_ON, states.POWER_OFF, states.SOFT_REBOOT, states.SOFT_POWER_OFF):
            raise errors.InvalidParameterValue(f"fake power cannot set {state!r}")
        await self._sleep()

    async def reboot(self, task: base.Task, timeout: int | None = None) -> None:
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

    async def deploy(self, task: base.Task) -> str | None:
        await self._sleep()
        return None

    async def tear_down(self, task: base.Task) -> str:
        await self._sleep()
        return "deleted"


class FakeStorage(_Delayed, base.StorageInterface):
    name = "fake"
    delay_option = "fake_storage_delay"

    async def attach_volumes(self, task: base.Task) -> None:
        await self._sleep()

    async def detach_volumes(self, task: base.Task) -> None:
        await self._sleep()


class FakeVendor(_Delayed, base.VendorInterface):
    name = "fake"
    delay_option = "fake_vendor_delay"


class FakeInspect(_Delayed, base.InspectInterface):
    name = "fake"
    delay_option = "fake_inspect_delay"

    async def inspect_hardware(self, task: base.Task) -> str:
        await self._sleep()
        return states.MANAGEABLE
