"""Verification (``manage`` from enroll): the BMC answers and reports a power state;
the firmware components are cached on the way (API 1.86, best effort)."""

from __future__ import annotations

from services.conductor.drivers.base import Task
from services.conductor.flows.context import FlowContext, guarded


async def start(ctx: FlowContext, task: Task) -> None:
    async def run() -> None:
        await task.driver.power.validate(task)
        await task.driver.management.validate(task)
        power = await task.driver.power.get_power_state(task)
        note = await ctx.cache_firmware(task)
        await ctx.transition(task, "done", changes={"power_state": power}, note=note)

    await guarded(ctx, task, "Verification", run())


resume = start
