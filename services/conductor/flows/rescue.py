"""Adopting, rescuing, unrescuing and servicing.

These states have no hardware work in Ferrum yet: the flow only completes
the transition. (Cleaning, inspection and rescue that really run are the
subject of their own issue.)
"""

from __future__ import annotations

from services.conductor.drivers.base import Task
from services.conductor.flows.context import FlowContext, guarded


async def start(ctx: FlowContext, task: Task) -> None:
    await guarded(ctx, task, task.node["provision_state"], _done(ctx, task))


async def _done(ctx: FlowContext, task: Task) -> None:
    await ctx.transition(task, "done")


resume = start
