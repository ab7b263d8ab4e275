"""The ``agent`` rescue interface: boot the agent ramdisk on a deployed node
and let the tenant log in to it (Ironic's AgentRescue).

``rescue`` powers the instance off and boots the ramdisk (``rescue wait``);
the renderer gives a rescuing node the ``rescue_kernel``/``rescue_ramdisk``
of driver_info when set, else the deploy ones. The agent's first heartbeat
gets ``rescue.finalize_rescue`` with the password *hash* the conductor kept
(``instance_info.hashed_rescue_password``, never the password itself); the
agent writes it where the rescue login reads it, stops serving its API, and
the node is ``rescue``. ``unrescue`` powers off, forgets the ramdisk and
boots the instance again.
"""

from __future__ import annotations

from services.common import errors, states
from services.conductor.drivers import base, ramdisk_boot
from services.conductor.drivers.agent_client import client_for, command_error_text

HASHED_PASSWORD = "hashed_rescue_password"


class AgentRescue(base.RescueInterface):
    name = "agent"

    def get_properties(self) -> dict[str, str]:
        return {
            "rescue_kernel": "URL of the rescue kernel. Optional: the deploy kernel is booted when unset.",
            "rescue_ramdisk": "URL of the rescue ramdisk. Optional: the deploy ramdisk is booted when unset.",
        }

    async def validate(self, task: base.Task) -> None:
        await task.driver.boot.validate(task)

    async def rescue(self, task: base.Task) -> str:
        if not task.node["driver_internal_info"].get(ramdisk_boot.BOOT_REQUESTED):
            # A resumed rescue whose ramdisk boot was already requested keeps it running.
            await task.driver.power.set_power_state(task, states.POWER_OFF)
            await task.driver.boot.clean_up_instance(task)
        await ramdisk_boot.boot_ramdisk(task, fresh=False)
        return states.RESCUEWAIT

    async def finalize_rescue(self, task: base.Task) -> None:
        hashed = task.node["instance_info"].get(HASHED_PASSWORD)
        if not hashed:
            raise errors.MissingParameter(f"Node {task.node['uuid']} has no rescue password hash to hand the agent")
        result = await client_for(task.node, self.options).execute(
            "rescue.finalize_rescue", {"rescue_password": hashed, "hashed": True}, wait=True
        )
        if result.get("command_status") != "SUCCEEDED":
            raise errors.AgentError(
                "Agent returned bad result for command finalize_rescue: "
                f"{command_error_text(result.get('command_error'))}"
            )

    async def clean_up(self, task: base.Task) -> None:
        """The hash is dropped once handed over (or the rescue failed), and the ramdisk forgotten."""
        info = {k: v for k, v in task.node["instance_info"].items() if k != HASHED_PASSWORD}
        await task.save_fields({"instance_info": info})
        await task.driver.boot.clean_up_ramdisk(task)
        await ramdisk_boot.forget_agent(task)

    async def unrescue(self, task: base.Task) -> str:
        await task.driver.power.set_power_state(task, states.POWER_OFF)
        await self.clean_up(task)
        await task.driver.boot.prepare_instance(task)
        await task.driver.power.set_power_state(task, states.POWER_ON)
        await task.save_fields({"power_state": states.POWER_ON})
        return states.ACTIVE
