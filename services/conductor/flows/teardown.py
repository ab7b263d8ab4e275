"""Tear down: ``deleting`` -> ``cleaning`` (and on to available).

Every step is safe to repeat, so a conductor that adopts a node caught in
``deleting`` runs the flow again from the top: power off, clean up the
instance's boot, remove the config drive object, detach volumes (with an
event at the start and the end) and forget the instance's VIFs, as Ironic does.
"""

from __future__ import annotations

from services.conductor.drivers import volumes
from services.conductor.drivers.base import Task
from services.conductor.flows import clean
from services.conductor.flows.context import FlowContext, guarded


async def start(ctx: FlowContext, task: Task) -> None:
    if await guarded(ctx, task, "Tear down", _run(ctx, task)):
        await clean.start(ctx, task)  # cleaning's own failures are its own (clean failed, with the step)


async def _run(ctx: FlowContext, task: Task) -> None:
    await task.driver.deploy.tear_down(task)
    await task.driver.boot.clean_up_instance(task)
    await ctx.configdrives.remove(task)
    await _detach_volumes(ctx, task)
    removed = await ctx.remove_vifs(task)
    note = f"VIFs detached: {', '.join(removed)}" if removed else ""
    await ctx.transition(
        task, "clean", changes={"instance_info": {}, "instance_uuid": None, "instance_name": None}, note=note
    )


async def _detach_volumes(ctx: FlowContext, task: Task) -> None:
    """Seed 004: the storage detaches the node's volumes, with an event (node
    history, WatchNodes) when it starts and when it is done, so an operator
    sees whether a volume was left attached."""
    if not task.volume_targets:
        await task.driver.storage.detach_volumes(task)
        await volumes.forget(task)
        return
    storage = task.driver.storage.name
    count = len(task.volume_targets)
    await ctx.record_event(
        task.node,
        "storage-detach",
        f"detaching {count} volume(s) through storage interface {storage}",
        event_type="storage",
    )
    await task.driver.storage.detach_volumes(task)
    await volumes.forget(task)
    await ctx.record_event(
        task.node,
        "storage-detach",
        f"detached {count} volume(s) through storage interface {storage}",
        event_type="storage",
    )


resume = start
