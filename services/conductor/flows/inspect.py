"""Inspection (``inspect`` verb): ``inspecting`` (-> ``inspect wait`` -> the
agent posts its inventory -> ``inspecting``) -> ``manageable``.

The inspect interface starts it: ``fake`` is done at once, ``agent`` boots
the ramdisk and the node waits. The agent's inventory arrives on
``/v1/continue_inspection``; the conductor stores it and resumes here
(``process``): the inventory becomes properties, ports and the effects of the
inspection rules (services/conductor/inspection.py), the ramdisk is powered
off and the node is ``manageable`` again. A failure, the inspect timeout
(periodic.py) or ``abort`` leave it in ``inspect failed``.

Progress: ``inspection_data_received`` in ``driver_internal_info`` once the
inventory is stored. Resuming an ``inspecting`` node processes the stored
inventory if it arrived, else starts the inspection again (a ramdisk boot
already requested is not repeated: ``ramdisk_boot.boot_ramdisk``).
"""

from __future__ import annotations

from collections.abc import Awaitable

from services.common import states
from services.common.db.outage import is_unavailable
from services.conductor.drivers.base import Task
from services.conductor.flows.context import FlowContext, error_text
from services.conductor.node_states import now

RECEIVED = "inspection_data_received"


async def start(ctx: FlowContext, task: Task) -> None:
    await _guarded(ctx, task, _start(ctx, task))


async def _guarded(ctx: FlowContext, task: Task, work: Awaitable[None]) -> None:
    try:
        await work
    except Exception as exc:
        if is_unavailable(exc):
            raise
        await fail(ctx, task, f"Inspection failed for node {task.node['uuid']}: {error_text(exc)}")


async def _start(ctx: FlowContext, task: Task) -> None:
    await task.save_fields({"inspection_started_at": now(), "inspection_finished_at": None})
    result = await task.driver.inspect.inspect_hardware(task)
    if result == states.INSPECTWAIT:
        await ctx.transition(task, "wait", note="booting the ramdisk; waiting for its inventory")
        return
    await ctx.transition(task, "done", changes={"inspection_finished_at": now()})


async def process(ctx: FlowContext, task: Task) -> None:
    """The inventory is stored and the node is ``inspecting``: apply it and finish."""
    await _guarded(ctx, task, _process(ctx, task))


async def _process(ctx: FlowContext, task: Task) -> None:
    summary = await ctx.inspection.apply(task)
    await task.driver.inspect.tear_down_inspection(task)
    await task.save_internal_info({}, remove=(RECEIVED,))
    await ctx.transition(task, "done", changes={"inspection_finished_at": now()}, note=summary)


async def fail(ctx: FlowContext, task: Task, message: str) -> None:
    """``inspect failed`` with ``message``; the ramdisk is powered off."""
    try:
        await task.driver.inspect.tear_down_inspection(task)
    except Exception as exc:
        if is_unavailable(exc):
            raise
        message = f"{message}. Also powering the ramdisk off failed: {error_text(exc)}"
    await task.save_internal_info({}, remove=(RECEIVED,))
    if task.node["provision_state"] == states.INSPECTFAIL:
        await task.save_fields({"last_error": message})
    else:
        await ctx.fail(task, message)


async def timed_out(ctx: FlowContext, task: Task) -> None:
    await fail(ctx, task, f"Timeout reached while waiting for the inventory of node {task.node['uuid']}")


async def abort(ctx: FlowContext, task: Task) -> None:
    """After ``abort`` moved the node from ``inspect wait`` to ``inspect failed``."""
    await fail(ctx, task, "By request, the inspection was aborted")


async def resume(ctx: FlowContext, task: Task) -> None:
    if task.node["provision_state"] != states.INSPECTING:
        return  # inspect wait: the agent posts its inventory to whoever owns the node now
    if task.node["driver_internal_info"].get(RECEIVED):
        await process(ctx, task)
    else:
        await start(ctx, task)
