"""Conductor half of the virtual media API (1.89 attach and detach, 1.93 list):
the node's management interface does the work, under the node's lock for
changes. Unlike Ironic, which answers 204 and reports a failure later in
``last_error``, the attach and detach finish before the answer, so a BMC's
refusal reaches the client as the error of its request; each change is
recorded in the node's history.
"""

from __future__ import annotations

from typing import Any

from services.conductor.node_states import NodeStates
from services.conductor.taskmanager import TaskManager


class VirtualMedia:
    def __init__(self, tasks: TaskManager, states: NodeStates) -> None:
        self.tasks = tasks
        self.states = states

    async def attach(self, node_uuid: str, device_type: str, image_url: str) -> None:
        async with self.tasks.acquire(node_uuid, "attaching virtual media") as task:
            management = task.driver.management
            await management.validate(task)
            await management.attach_virtual_media(task, device_type, image_url)
            await self.states.record_event(task.node, "vmedia", f"virtual {device_type} attached")

    async def detach(self, node_uuid: str, device_types: list[str] | None) -> None:
        async with self.tasks.acquire(node_uuid, "detaching virtual media") as task:
            management = task.driver.management
            await management.validate(task)
            await management.detach_virtual_media(task, device_types)
            what = ", ".join(device_types) if device_types else "all devices"
            await self.states.record_event(task.node, "vmedia", f"virtual media detached ({what})")

    async def list(self, node_uuid: str) -> list[dict[str, Any]]:
        task = await self.tasks.shared(node_uuid)
        await task.driver.management.validate(task)
        return await task.driver.management.get_virtual_media(task)
