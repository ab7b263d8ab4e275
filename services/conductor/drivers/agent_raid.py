"""Ironic's ``agent`` RAID interface: the RAID clean steps run by the
deploy ramdisk's agent, which builds the node's ``target_raid_config``.

Only the agent knows whether it can build RAID, so the steps offered are
exactly the ``raid`` steps the booted agent reported (its cached clean
steps, services/conductor/drivers/agent_steps.py), as in Ironic. Ferrum's
own agent reports none (it has no RAID support), so a manual cleaning that
asks for ``raid.create_configuration`` on a node whose agent has not
offered it is a 400 that lists what is offered; an agent that offers it
(IPA's software RAID) gets the step, and its result becomes ``raid_config``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from services.common import raid_config
from services.conductor.drivers import base
from services.conductor.drivers.agent_steps import CACHED_STEPS, AgentCleanSteps

# driver_internal_info key: the logical disks asked of the agent (Ironic's name).
TARGET = "target_raid_config"


class AgentRAID(base.RAIDInterface):
    name = "agent"

    def get_clean_steps(self, task: base.Task) -> list[dict[str, Any]]:
        cached = task.node["driver_internal_info"].get(CACHED_STEPS)
        reported = cached.get("raid") if isinstance(cached, dict) else None
        return [
            {**step, "interface": "raid", "requires_ramdisk": True, "argsinfo": step.get("argsinfo")}
            for step in reported or ()
            if isinstance(step, dict)
        ]

    async def create_configuration(
        self, task: base.Task, *, create_root_volume: bool = True, create_nonroot_volumes: bool = True
    ) -> str | None:
        target = raid_config.filter_target(
            task.node, create_root_volume=create_root_volume, create_nonroot_volumes=create_nonroot_volumes
        )
        await task.save_internal_info({TARGET: target})
        return await self._forward(task, task.node.get("clean_step") or {"step": "create_configuration"})

    async def delete_configuration(self, task: base.Task) -> str | None:
        return await self._forward(task, task.node.get("clean_step") or {"step": "delete_configuration"})

    async def _forward(self, task: base.Task, step: Mapping[str, Any]) -> str | None:
        deploy = task.driver.deploy
        if not isinstance(deploy, AgentCleanSteps):
            raise base.unsupported(self, f"RAID steps with the deploy interface {deploy.name!r}, which runs no agent")
        return await deploy.execute_clean_step(task, {**step, "interface": "raid"})
