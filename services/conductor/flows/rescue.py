"""Rescuing and unrescuing (and adopting, which has no hardware work in Ferrum).

- ``rescuing``: the rescue interface boots the rescue ramdisk (``agent``:
  ``rescue wait`` until the agent calls back; ``fake``: done at once). The
  agent's heartbeat in ``rescue wait`` runs ``continue_after_callback``: the
  password hash goes to the agent, the interface cleans up (the hash is
  dropped from the node) and the node is ``rescue``.
- ``unrescuing``: the interface boots the instance again; the node is ``active``.

A failure, the rescue timeout (periodic.py) or ``abort`` in ``rescue wait``
leave the node in ``rescue failed`` with a clear last_error; the machine is
powered off and the hash dropped, as Ironic's rescuing error handler does.

Resuming repeats the state's step: a ramdisk boot already requested is not
repeated (``AgentRescue.rescue``), a waiting node with an agent gets its
password at once, and unrescue is safe to run again.
"""

from __future__ import annotations

from collections.abc import Awaitable

from services.common import states
from services.common.db.outage import is_unavailable
from services.conductor.drivers.base import Task
from services.conductor.flows.context import FlowContext, error_text


async def start(ctx: FlowContext, task: Task) -> None:
    state = task.node["provision_state"]
    if state == states.RESCUING:
        await _guarded(ctx, task, _rescue(ctx, task))
    elif state == states.UNRESCUING:
        await _guarded(ctx, task, _unrescue(ctx, task))
    elif state == states.ADOPTING:
        await _guarded(ctx, task, ctx.transition(task, "done"))


async def _guarded(ctx: FlowContext, task: Task, work: Awaitable[object]) -> None:
    try:
        await work
    except Exception as exc:
        if is_unavailable(exc):
            raise
        what = {states.UNRESCUING: "Unrescue", states.ADOPTING: "Adoption"}.get(task.node["provision_state"], "Rescue")
        await fail(ctx, task, f"{what} failed for node {task.node['uuid']}: {error_text(exc)}")


async def _rescue(ctx: FlowContext, task: Task) -> None:
    result = await task.driver.rescue.rescue(task)
    if result == states.RESCUEWAIT:
        await ctx.transition(task, "wait", note="booting the rescue ramdisk")
        if task.node["driver_internal_info"].get("agent_url"):
            await _finalize(ctx, task)  # the agent called back while we were still booting it
        return
    await ctx.transition(task, "done")


async def _unrescue(ctx: FlowContext, task: Task) -> None:
    await task.driver.rescue.unrescue(task)
    await ctx.transition(task, "done", note="the instance boots again")


async def continue_after_callback(ctx: FlowContext, task: Task) -> None:
    """The rescue ramdisk heartbeated: hand it the password hash and finish."""
    await _guarded(ctx, task, _finalize(ctx, task))


async def _finalize(ctx: FlowContext, task: Task) -> None:
    await task.driver.rescue.finalize_rescue(task)
    await ctx.transition(task, "resume")
    await task.driver.rescue.clean_up(task)
    await ctx.transition(task, "done", note="the agent set the rescue password; the tenant may log in")


async def fail(ctx: FlowContext, task: Task, message: str) -> None:
    """``rescue failed`` (or ``unrescue failed``): power off and drop what the rescue left."""
    if task.node["provision_state"] in (states.RESCUING, states.RESCUEWAIT, states.RESCUEFAIL):
        try:
            await task.driver.power.set_power_state(task, states.POWER_OFF)
            await task.save_fields({"power_state": states.POWER_OFF})
            await task.driver.rescue.clean_up(task)
        except Exception as exc:
            if is_unavailable(exc):
                raise
            message = f"{message}. Also cleaning up failed: {error_text(exc)}"
    if task.node["provision_state"] == states.RESCUEFAIL:
        await task.save_fields({"last_error": message})
    else:
        await ctx.fail(task, message)


async def timed_out(ctx: FlowContext, task: Task) -> None:
    await fail(
        ctx,
        task,
        f"Timeout reached while waiting for the rescue ramdisk of node {task.node['uuid']} to call back",
    )


async def abort(ctx: FlowContext, task: Task) -> None:
    """After ``abort`` moved the node from ``rescue wait`` to ``rescue failed``."""
    await fail(ctx, task, "By request, the rescue operation was aborted")


async def resume(ctx: FlowContext, task: Task) -> None:
    if task.node["provision_state"] == states.RESCUEWAIT:
        if task.node["driver_internal_info"].get("agent_url"):
            await continue_after_callback(ctx, task)
        return
    await start(ctx, task)
