"""The ``ramdisk`` deploy interface: the instance is a kernel and ramdisk, booted every time, no disk write.

Ironic's ramdisk deploy: nothing is written and no agent runs. Deploying
means preparing the instance's boot (the boot interface: iPXE fetches
``instance_info`` kernel and ramdisk, or ``boot_iso``; virtual media attaches
a boot ISO made of them, with the config drive on a second device) and
powering the machine on. The node goes straight to ``active``.
"""

from __future__ import annotations

from typing import Any

from services.common import errors, states
from services.conductor.drivers import base


class RamdiskDeploy(base.DeployInterface):
    name = "ramdisk"
    capabilities = frozenset({"ramdisk_deploy"})
    prepares_instance_boot = True  # deploy() prepares the boot before it powers on (as Ironic's does)

    def get_properties(self) -> dict[str, str]:
        return {}

    async def validate(self, task: base.Task) -> None:
        info = task.node.get("instance_info") or {}
        if info.get("boot_iso"):
            return
        missing = [k for k in ("kernel", "ramdisk") if not info.get(k)]
        if missing:
            raise errors.MissingParameter(
                f"Node {task.node['uuid']} uses the ramdisk deploy and needs instance_info boot_iso, or kernel "
                f"and ramdisk (missing: {', '.join(missing)})"
            )
        for key in ("kernel", "ramdisk"):
            if not isinstance(info[key], str) or not info[key].startswith(("http://", "https://")):
                raise errors.InvalidParameterValue(
                    f"instance_info {key} of node {task.node['uuid']} must be an http(s) URL"
                )

    async def deploy(self, task: base.Task) -> str | None:
        """Prepare the instance's boot, then (re)boot into it; safe to repeat on take-over."""
        await task.driver.boot.prepare_instance(task)
        if await task.driver.power.get_power_state(task) == states.POWER_ON:
            await task.driver.power.reboot(task)
        else:
            await task.driver.power.set_power_state(task, states.POWER_ON)
        await task.save_fields({"power_state": states.POWER_ON})
        return None

    async def tear_down(self, task: base.Task) -> str:
        await task.driver.power.set_power_state(task, states.POWER_OFF)
        await task.save_fields({"power_state": states.POWER_OFF})
        return "deleted"

    def get_deploy_steps(self, task: base.Task) -> list[dict[str, Any]]:
        return [{"interface": "deploy", "step": "deploy", "priority": 100, "argsinfo": None}]
