"""Inspection (``inspect`` verb): the inspect interface reads the hardware."""

from __future__ import annotations

from services.conductor.drivers.base import Task
from services.conductor.flows.context import FlowContext, guarded
from services.conductor.node_states import now


async def start(ctx: FlowContext, task: Task) -> None:
    async def run() -> None:
        await task.driver.inspect.inspect_hardware(task)
        await ctx.transition(task, "done", changes={"inspection_finished_at": now()})

    await guarded(ctx, task, "Inspection", run())


resume = start
