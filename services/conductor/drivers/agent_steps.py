"""Clean steps that run in the agent ramdisk (Ironic's AgentBaseMixin part).

The agent offers its steps through ``clean.get_clean_steps`` once it runs.
Before that, the conductor already knows what Ferrum's agent offers (the
catalogue below, IPA's GenericHardwareManager steps it implements), so a
manual cleaning request is checked when it is made and refused with a 400
if it names a step nobody offers, not after a ramdisk boot. When the agent
is up its own list is cached in ``driver_internal_info`` and wins.

Each step is sent as ``clean.execute_clean_step`` and runs in the background
on the agent; its command id is recorded, and every heartbeat polls it. No
conductor worker waits on a running step.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from services.common import errors, raid_config, states
from services.conductor.drivers import ramdisk_boot
from services.conductor.drivers.agent_client import AgentClient, agent_node, agent_port, command_failure
from services.conductor.drivers.base import Task

LOG = logging.getLogger(__name__)

CACHED_STEPS = "agent_cached_clean_steps"
MANAGER_VERSION = "hardware_manager_version"
COMMAND = "agent_command_id"
# What Ferrum's agent offers (services/agent/commands.py CLEAN_STEPS), IPA's defaults.
AGENT_CLEAN_STEPS: tuple[Mapping[str, Any], ...] = (
    {"interface": "deploy", "step": "erase_devices_metadata", "priority": 99, "abortable": True},
    {"interface": "deploy", "step": "erase_devices", "priority": 10, "abortable": True},
)
# Step name -> the conductor option that sets its priority (Ironic's [deploy] options).
PRIORITY_OPTIONS = {
    "erase_devices_metadata": "erase_devices_metadata_priority",
    "erase_devices": "erase_devices_priority",
}


class AgentCleanSteps:
    """Mixed into an agent-driven deploy interface (``direct``)."""

    options: dict[str, Any]

    def _client(self, task: Task) -> AgentClient:
        raise NotImplementedError

    def get_clean_steps(self, task: Task) -> list[dict[str, Any]]:
        cached = task.node["driver_internal_info"].get(CACHED_STEPS)
        # The agent's steps of other interfaces (raid) are offered by those interfaces, as in Ironic.
        steps = (
            [dict(s) for s in cached.get("deploy") or () if isinstance(s, dict)]
            if isinstance(cached, dict)
            else [dict(s) for s in AGENT_CLEAN_STEPS]
        )
        for step in steps:
            option = PRIORITY_OPTIONS.get(step["step"])
            if option is not None and option in self.options:
                step["priority"] = int(self.options[option])
            step["requires_ramdisk"] = True
            step.setdefault("argsinfo", None)
        return steps

    async def prepare_cleaning(self, task: Task, *, resume: bool = False) -> str | None:
        """Boot the ramdisk; its first heartbeat starts the steps."""
        await ramdisk_boot.boot_ramdisk(task, fresh=not resume)
        return states.CLEANWAIT

    async def tear_down_cleaning(self, task: Task) -> None:
        await ramdisk_boot.power_off_ramdisk(task)
        await task.save_internal_info({}, remove=(COMMAND,))

    async def refresh_clean_steps(self, task: Task) -> None:
        """Cache the steps the booted agent reports, as Ironic's refresh_steps."""
        result = await self._client(task).run_sync(
            "clean.get_clean_steps", {"node": agent_node(task.node), "ports": [agent_port(p) for p in task.ports]}
        )
        if not isinstance(result, dict) or not isinstance(result.get("clean_steps"), dict):
            raise errors.AgentError(f"The agent of node {task.node['uuid']} sent no clean steps: {result!r:.300}")
        by_interface: dict[str, list[dict[str, Any]]] = {}
        for group in result["clean_steps"].values():
            for step in group if isinstance(group, list) else ():
                if not isinstance(step, dict) or not {"interface", "step", "priority"} <= set(step):
                    raise errors.AgentError(
                        f"The agent of node {task.node['uuid']} sent a bad clean step {step!r:.200}"
                    )
                by_interface.setdefault(str(step["interface"]), []).append(step)
        await task.save_internal_info({CACHED_STEPS: by_interface, MANAGER_VERSION: result.get(MANAGER_VERSION) or {}})

    async def execute_clean_step(self, task: Task, step: Mapping[str, Any]) -> str | None:
        """Send the step to the agent; its result arrives with a later heartbeat."""
        result = await self._client(task).execute(
            "clean.execute_clean_step",
            {
                "step": dict(step),
                "node": agent_node(task.node),
                "ports": [agent_port(p) for p in task.ports],
                "clean_version": task.node["driver_internal_info"].get(MANAGER_VERSION) or {},
            },
        )
        await task.save_internal_info({COMMAND: result.get("id")})
        LOG.info(
            "clean step sent node_uuid=%s step=%s.%s command=%s",
            task.node["uuid"],
            step["interface"],
            step["step"],
            result.get("id"),
        )
        _raise_if_failed(result)
        return states.CLEANWAIT

    async def clean_step_status(self, task: Task) -> str | None:
        command_id = task.node["driver_internal_info"].get(COMMAND)
        if not command_id:
            raise errors.AgentError("no clean step command was recorded for the agent")
        result = await self._client(task).command(command_id)
        _raise_if_failed(result)
        if result.get("command_status") != "SUCCEEDED":
            return None
        await _record_raid_result(task, result)
        return "done"

    async def adopt_clean_step(self, task: Task, step: Mapping[str, Any], *, ordinal: int) -> bool:
        """The dead conductor may have sent ``step`` without recording it. The
        agent keeps the commands of its boot, and steps go out one at a time in
        plan order, so ``step`` was sent when the agent holds ``ordinal``
        clean step commands (it is the ordinal-th in-band step of the plan)."""
        sent = [c for c in await self._client(task).commands() if c.get("command_name") == "execute_clean_step"]
        if len(sent) < ordinal:
            return False
        await task.save_internal_info({COMMAND: sent[-1].get("id")})
        LOG.info(
            "adopted clean step node_uuid=%s step=%s command=%s", task.node["uuid"], step["step"], sent[-1].get("id")
        )
        return True


async def _record_raid_result(task: Task, result: Mapping[str, Any]) -> None:
    """After a RAID step the agent ran: what it built becomes ``raid_config``
    (Ironic's post-step hook); a delete leaves none."""
    step = task.node.get("clean_step") or {}
    if step.get("interface") != "raid":
        return
    if step.get("step") == "delete_configuration":
        await task.save_fields({"raid_config": {}})
        return
    built = (result.get("command_result") or {}).get("clean_result")
    if step.get("step") == "create_configuration":
        if not isinstance(built, dict) or not isinstance(built.get("logical_disks"), list):
            raise errors.AgentError(
                f"The agent of node {task.node['uuid']} sent no RAID configuration after building it: {result!r:.300}"
            )
        await task.save_fields(
            {
                "raid_config": raid_config.as_current(built),
                "properties": raid_config.properties_after(task.node.get("properties") or {}, built),
            }
        )


def _raise_if_failed(result: Mapping[str, Any]) -> None:
    failure = command_failure(result)
    if failure is not None:
        raise errors.AgentError(failure)
