"""Cleaning, manual (``clean`` verb from manageable) and automated (``provide``,
and after tear down): ``cleaning`` (-> ``clean wait`` -> agent) -> done.

The plan is made first (services/conductor/step_plan.py): for automated
cleaning the enabled steps by priority, for manual cleaning exactly the
requested ones, checked when they were requested. If a planned step runs in
the ramdisk, the ramdisk boots (``clean wait``) and its first heartbeat
checks the plan against the steps the agent reports and starts it. Each step
is shown in ``clean_step`` and recorded in the history while it runs; an
in-band step leaves the node in ``clean wait`` and every heartbeat polls it.
After the last step the ramdisk is torn down (power off) and the node moves
on, to ``available`` (or ``manageable`` for manual cleaning and retired nodes).

Progress lives in ``driver_internal_info``: ``clean_steps`` (the plan),
``clean_step_index`` (the step running), ``cleaning_ramdisk`` (whether the
plan boots the ramdisk) and the ramdisk boot's own keys (boot requested,
agent URL, the step's command id). ``resume`` continues from there: a boot
already requested is not repeated (the machine is only powered on if it is
off), a step the agent already got is polled, not sent again, and a
conductor-side step is run again from its beginning (every clean step is
safe to repeat).

A failed step fails the node into ``clean failed`` with the step and the
agent's error in last_error, powers it off and, as Ironic does, sets
maintenance with the fault ``clean failure``. So does the clean timeout
(periodic.py) when the ramdisk stops calling back, and ``abort`` in
``clean wait`` without maintenance.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable
from typing import Any

from services.common import errors, states
from services.common.db.records import NodeRecord
from services.conductor import child_steps, reserved_steps, step_plan
from services.conductor.drivers.base import Task
from services.conductor.flows.context import FlowContext, error_text

LOG = logging.getLogger(__name__)

PLAN = "clean_steps"
INDEX = "clean_step_index"
RAMDISK = "cleaning_ramdisk"
DISABLE_RAMDISK = "cleaning_disable_ramdisk"
REFRESHED = "agent_clean_steps_checked"
CLEANING_KEYS = (PLAN, INDEX, RAMDISK, DISABLE_RAMDISK, REFRESHED)
FAULT = "clean failure"


async def start(ctx: FlowContext, task: Task) -> None:
    await _guarded(ctx, task, _begin(ctx, task))


async def _guarded(ctx: FlowContext, task: Task, work: Awaitable[None]) -> None:
    """Run one part of the flow; any failure is the node's ``clean failed``."""
    try:
        await work
    except Exception as exc:
        if _database_lost(exc):
            raise
        step = task.node.get("clean_step") or {}
        what = f"Clean step {step_plan.step_id(step)} failed" if step else "Cleaning failed"
        await fail(ctx, task, f"{what} on node {task.node['uuid']}: {error_text(exc)}")


def _database_lost(exc: BaseException) -> bool:
    from services.common.db.outage import is_unavailable

    return is_unavailable(exc)


def is_manual(node: NodeRecord) -> bool:
    return node["target_provision_state"] == states.MANAGEABLE


async def _begin(ctx: FlowContext, task: Task) -> None:
    node = task.node
    manual = is_manual(node)
    automated = node["automated_clean"] if node["automated_clean"] is not None else ctx.config.automated_clean
    if not manual and not automated:
        setting = "the API" if node["automated_clean"] is False else "configuration"
        await _done(ctx, task, note=f"automated cleaning skipped: disabled via {setting}")
        return
    await task.driver.power.validate(task)
    note = await ctx.cache_firmware(task)
    if note:
        await ctx.record_event(node, "firmware", note)
    info = node["driver_internal_info"]
    plan = list(info.get(PLAN) or []) if manual else step_plan.automated(task)
    ramdisk = any(s.get("requires_ramdisk") for s in plan) and not info.get(DISABLE_RAMDISK)
    if plan or any(key in info for key in (PLAN, RAMDISK, INDEX, REFRESHED)):
        # Recorded for resume. With nothing to run and nothing left of an earlier
        # cleaning, the flow goes straight to _done, which drops these keys again:
        # the write would change nothing but cost a statement.
        await task.save_internal_info({PLAN: plan, RAMDISK: ramdisk}, remove=(INDEX, REFRESHED))
    if ramdisk and await task.driver.deploy.prepare_cleaning(task) == states.CLEANWAIT:
        await ctx.transition(task, "wait", note=f"booting the ramdisk for {_kind(task)} cleaning")
        return
    await _run_steps(ctx, task, 0)


def _kind(task: Task) -> str:
    return "manual" if is_manual(task.node) else "automated"


async def _run_steps(ctx: FlowContext, task: Task, first: int) -> None:
    """Run the plan from step ``first`` until an in-band step must be waited for, or to the end."""
    plan = task.node["driver_internal_info"].get(PLAN) or []
    for index in range(first, len(plan)):
        step = plan[index]
        await task.save_internal_info({INDEX: index})
        await task.save_fields({"clean_step": dict(step)})
        await ctx.record_event(
            task.node,
            "clean-step",
            f"clean step {step_plan.step_id(step)} (priority {step['priority']}) started",
        )
        if child_steps.on_children(step):
            children = await child_steps.run(ctx.config, task, "clean", step)
            await ctx.record_event(
                task.node,
                "clean-step",
                f"clean step {step_plan.step_id(step)} finished on child nodes: {', '.join(children) or 'none'}",
            )
            continue
        if reserved_steps.is_reserved(step):
            if step["step"] == reserved_steps.HOLD:
                await ctx.transition(task, "hold", note="clean step hold: waiting for unhold")
                return
            await reserved_steps.run_power_step(ctx.config, task, step)
            continue
        result = await getattr(task.driver, step["interface"]).execute_clean_step(task, step)
        if result == states.CLEANWAIT:
            await ctx.transition(task, "wait", note=f"clean step {step_plan.step_id(step)} runs in the ramdisk")
            return
    await _finish(ctx, task)


async def _finish(ctx: FlowContext, task: Task) -> None:
    info = task.node["driver_internal_info"]
    plan = info.get(PLAN) or []
    if info.get(RAMDISK):
        await task.driver.deploy.tear_down_cleaning(task)
    note = f"{_kind(task)} cleaning finished"
    if info.get(DISABLE_RAMDISK):
        note += " (ramdisk disabled)"
    if plan:
        note += f" (steps: {', '.join(step_plan.step_id(s) for s in plan)})"
    await _done(ctx, task, note=note)


async def _done(ctx: FlowContext, task: Task, *, note: str) -> None:
    node = task.node
    manual = is_manual(node)
    # A retired node never becomes available again: its cleaning ends in
    # manageable (API 1.61, as Ironic does).
    if node.get("retired") and not manual:
        note += "; the node is retired, so it stays manageable"
    event = "manage" if manual or node.get("retired") else "done"
    # The flow's last write: the state, the keys cleaning kept, and the lock, in one statement.
    await ctx.transition(
        task, event, changes={"clean_step": {}}, note=note, remove_internal_info=CLEANING_KEYS, release=True
    )


async def continue_after_callback(ctx: FlowContext, task: Task) -> None:
    """A heartbeat in ``clean wait``: start the plan once the ramdisk is up, or poll the running step."""
    await _guarded(ctx, task, _after_callback(ctx, task))


async def _after_callback(ctx: FlowContext, task: Task) -> None:
    info = task.node["driver_internal_info"]
    deploy = task.driver.deploy
    if not info.get(REFRESHED):
        # The ramdisk just came up: the agent's own steps replace the catalogue.
        await deploy.refresh_clean_steps(task)
        plan = task.node["driver_internal_info"].get(PLAN) or []
        step_plan.still_offered(task, "clean", [s for s in plan if s.get("requires_ramdisk")])
        await task.save_internal_info({REFRESHED: True})
    index = task.node["driver_internal_info"].get(INDEX)
    if index is None:
        await ctx.transition(task, "resume", note="the ramdisk is up")
        await _run_steps(ctx, task, 0)
        return
    try:
        status = await deploy.clean_step_status(task)
    except errors.AgentUnreachable as exc:
        # The agent heartbeated, then stopped answering: it may be rebooting. Its next
        # heartbeat asks again; a dead one runs into the clean timeout, naming the step.
        LOG.warning("agent unreachable while polling its clean step node_uuid=%s: %s", task.node["uuid"], exc)
        return
    if status is None:
        return  # still running: the next heartbeat asks again
    step = task.node.get("clean_step") or {}
    await ctx.record_event(task.node, "clean-step", f"clean step {step_plan.step_id(step)} finished")
    if step.get("abort_after"):
        await ctx.transition(task, "fail", last_error=aborted_message(task.node))
        await _tear_down_after_stop(ctx, task)
        return
    await ctx.transition(task, "resume")
    await _run_steps(ctx, task, int(index) + 1)


async def fail(ctx: FlowContext, task: Task, message: str, *, maintenance: bool | None = None) -> None:
    """``clean failed`` with ``message``; the ramdisk is torn down (power off), and a
    node whose step failed goes into maintenance with the fault ``clean failure``."""
    if maintenance is None:
        maintenance = bool(task.node.get("clean_step"))
    message = await _tear_down(task, message)
    changes: dict[str, Any] = {"clean_step": {}}
    if maintenance:
        changes.update(maintenance=True, fault=FAULT)
        if not task.node.get("maintenance_reason"):
            changes["maintenance_reason"] = message
    await task.save_internal_info({}, remove=CLEANING_KEYS)
    if task.node["provision_state"] in (states.CLEANING, states.CLEANWAIT):
        await ctx.transition(task, "fail", last_error=message, changes=changes)
    else:
        await task.save_fields({**changes, "last_error": message})


async def _tear_down(task: Task, message: str) -> str:
    """Power the ramdisk off; a tear down that fails too is added to the message."""
    try:
        await task.driver.deploy.tear_down_cleaning(task)
    except Exception as exc:
        if _database_lost(exc):
            raise
        LOG.warning("tear down after cleaning failed node_uuid=%s reason=%s", task.node["uuid"], error_text(exc))
        return f"{message}. Also tearing down the ramdisk failed: {error_text(exc)}"
    return message


def timeout_message(node: NodeRecord) -> str:
    """Ironic's words for a ramdisk that stopped calling back, naming the step."""
    step = node.get("clean_step") or {}
    where = f" Failed on step {step_plan.step_id(step)}." if step else " The ramdisk never called back."
    return (
        "Timeout reached while cleaning the node. Please check if the ramdisk responsible for the cleaning "
        f"is running on the node.{where}"
    )


async def timed_out(ctx: FlowContext, task: Task) -> None:
    """The clean timeout (periodic.py): the node fails with the step it was on."""
    await fail(ctx, task, timeout_message(task.node))


def aborted_message(node: NodeRecord) -> str:
    step = node.get("clean_step") or {}
    message = "By request, the clean operation was aborted"
    if step:
        message += f' during or after the completion of step "{step_plan.step_id(step)}"'
    return message


async def abort(ctx: FlowContext, task: Task) -> None:
    """After ``abort`` moved the node from ``clean wait`` to ``clean failed``: stop the ramdisk."""
    await _tear_down_after_stop(ctx, task)


async def _tear_down_after_stop(ctx: FlowContext, task: Task) -> None:
    message = await _tear_down(task, aborted_message(task.node))
    await task.save_internal_info({}, remove=CLEANING_KEYS)
    await task.save_fields({"clean_step": {}, "last_error": message})


async def resume(ctx: FlowContext, task: Task) -> None:
    """Continue cleaning that another conductor (or a lost database) interrupted."""
    await _guarded(ctx, task, _resume(ctx, task))


async def _resume(ctx: FlowContext, task: Task) -> None:
    node = task.node
    info = node["driver_internal_info"]
    if node["provision_state"] == states.CLEANWAIT:
        if info.get("agent_url"):
            await _after_callback(ctx, task)  # ask the agent now, not at its next heartbeat
        return
    if node["provision_state"] != states.CLEANING:
        return
    if PLAN not in info:
        await _begin(ctx, task)  # nothing was planned yet: start over
        return
    index = info.get(INDEX)
    if index is None:
        if info.get(RAMDISK):
            # The ramdisk boot was under way: finish it without rebooting a machine already booting.
            await task.driver.deploy.prepare_cleaning(task, resume=True)
            await ctx.transition(task, "wait", note="resumed; waiting for the ramdisk")
            if task.node["driver_internal_info"].get("agent_url"):
                await _after_callback(ctx, task)
            return
        await _run_steps(ctx, task, 0)
        return
    plan = info.get(PLAN) or []
    step = plan[int(index)] if int(index) < len(plan) else None
    if step is not None and step.get("requires_ramdisk") and info.get("agent_url"):
        ordinal = sum(1 for s in plan[: int(index) + 1] if s.get("requires_ramdisk"))
        if await task.driver.deploy.adopt_clean_step(task, step, ordinal=ordinal):
            await ctx.transition(task, "wait", note="resumed; the agent already runs the step")
            await _after_callback(ctx, task)
            return
    await _run_steps(ctx, task, int(index))


async def unhold(ctx: FlowContext, task: Task) -> None:
    """After ``unhold`` moved the node from ``clean hold`` to ``clean wait``: the
    steps after the hold run now (an agent already up gets the in-band ones)."""
    await _guarded(ctx, task, _after_hold(ctx, task))


async def _after_hold(ctx: FlowContext, task: Task) -> None:
    index = int(task.node["driver_internal_info"].get(INDEX) or 0)
    await ctx.transition(task, "resume", note="unhold: cleaning goes on after the hold step")
    await _run_steps(ctx, task, index + 1)


def failed_step(node: NodeRecord) -> str:
    step = node.get("clean_step") or {}
    return step_plan.step_id(step) if step else ""
