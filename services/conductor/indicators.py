"""Conductor half of indicators (API 1.63): reads shared, changes under the lock."""

from __future__ import annotations

from typing import Any

from services.common import errors
from services.conductor.node_states import NodeStates
from services.conductor.taskmanager import TaskManager

INDICATOR_STATES = ("OFF", "ON", "BLINKING", "UNKNOWN")


class Indicators:
    def __init__(self, tasks: TaskManager, states: NodeStates) -> None:
        self.tasks = tasks
        self.states = states

    async def supported(self, node_uuid: str) -> dict[str, Any]:
        task = await self.tasks.shared(node_uuid)
        await task.driver.management.validate(task)
        return await task.driver.management.get_supported_indicators(task)

    async def state(self, node_uuid: str, component: str, indicator: str) -> str:
        task = await self.tasks.shared(node_uuid)
        await task.driver.management.validate(task)
        return await task.driver.management.get_indicator_state(task, component, indicator)

    async def set_state(self, node_uuid: str, component: str, indicator: str, state: str) -> None:
        if state not in INDICATOR_STATES:
            raise errors.InvalidParameterValue(
                f"Invalid indicator state {state!r}; valid states are {', '.join(INDICATOR_STATES)}"
            )
        async with self.tasks.acquire(node_uuid, "set indicator") as task:
            await task.driver.management.validate(task)
            await task.driver.management.set_indicator_state(task, component, indicator, state)
            await self.states.record_event(task.node, "indicator", f"indicator {indicator}@{component} set to {state}")
