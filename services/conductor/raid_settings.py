"""Conductor half of ``PUT /v1/nodes/{ident}/states/raid`` (API 1.12).

Under the node lock, the node's raid interface checks the new target RAID
config (a ``no-raid`` node refuses it), and it is stored; an empty config
clears the target without a check, as in Ironic. Nothing touches the
hardware: the config is built later by a ``raid.create_configuration``
clean step.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from services.conductor.node_states import NodeStates
from services.conductor.taskmanager import TaskManager

LOG = logging.getLogger(__name__)


class RaidSettings:
    def __init__(self, tasks: TaskManager, states: NodeStates) -> None:
        self.tasks = tasks
        self.states = states

    async def set_target(self, node_uuid: str, target: Mapping[str, Any]) -> None:
        async with self.tasks.acquire(node_uuid, "set target RAID config") as task:
            if target:
                await task.driver.raid.validate_raid_config(task, target)
            await task.save_fields({"target_raid_config": dict(target)})
            disks = len(target.get("logical_disks") or ())
            LOG.info("target RAID config set node_uuid=%s logical_disks=%d", node_uuid, disks)
