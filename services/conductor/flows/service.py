"""Servicing (``service`` verb, API 1.87): steps on an ``active`` node without
redeploying it, such as BIOS settings through Redfish.

``servicing`` runs the requested steps (checked when requested, see
services/conductor/step_plan.py) in their order, each shown in
``service_step`` and recorded in the history, and the node returns to
``active``. A failed step leaves it in ``service failed`` with the step and
the error in last_error; ``service`` again retries, ``abort`` returns it to
``active``. The steps Ferrum ships run out of band (the BMC), so the
instance keeps running: no ramdisk is booted. A step that finishes later
returns ``service wait``; the service timeout (periodic.py) fails a node
left there.

Progress lives in ``driver_internal_info``: ``service_steps`` (the plan) and
``service_step_index`` (the step running). Resuming runs the plan again from
the recorded step (every service step is safe to repeat: applying the same
settings again changes nothing). A step with ``execute_on_child_nodes`` runs
on the node's children instead (services/conductor/child_steps.py).
"""

from __future__ import annotations

from collections.abc import Awaitable

from services.common import states
from services.common.db.outage import is_unavailable
from services.common.db.records import NodeRecord
from services.conductor import child_steps, reserved_steps, step_plan
from services.conductor.drivers.base import Task
from services.conductor.flows.context import FlowContext, error_text

PLAN = "service_steps"
INDEX = "service_step_index"
DISABLE_RAMDISK = "service_disable_ramdisk"  # REST 1.108: the plan was checked to need no ramdisk
SERVICE_KEYS = (PLAN, INDEX, DISABLE_RAMDISK)


async def start(ctx: FlowContext, task: Task) -> None:
    await _guarded(ctx, task, _run(ctx, task, 0))


async def _guarded(ctx: FlowContext, task: Task, work: Awaitable[None]) -> None:
    try:
        await work
    except Exception as exc:
        if is_unavailable(exc):
            raise
        step = task.node.get("service_step") or {}
        what = f"Service step {step_plan.step_id(step)} failed" if step else "Servicing failed"
        await fail(ctx, task, f"{what} on node {task.node['uuid']}: {error_text(exc)}")


async def _run(ctx: FlowContext, task: Task, first: int) -> None:
    await task.driver.power.validate(task)
    plan = task.node["driver_internal_info"].get(PLAN) or []
    for index in range(first, len(plan)):
        step = plan[index]
        await task.save_internal_info({INDEX: index})
        await task.save_fields({"service_step": dict(step)})
        await ctx.record_event(
            task.node, "service-step", f"service step {step_plan.step_id(step)} started", event_type="service"
        )
        if child_steps.on_children(step):
            children = await child_steps.run(ctx.config, task, "service", step)
            await ctx.record_event(
                task.node,
                "service-step",
                f"service step {step_plan.step_id(step)} finished on child nodes: {', '.join(children) or 'none'}",
                event_type="service",
            )
            continue
        if reserved_steps.is_reserved(step):
            if step["step"] == reserved_steps.HOLD:
                await ctx.transition(task, "hold", note="service step hold: waiting for unhold")
                return
            await reserved_steps.run_power_step(ctx.config, task, step)
            continue
        result = await getattr(task.driver, step["interface"]).execute_service_step(task, step)
        if result == states.SERVICEWAIT:
            await ctx.transition(task, "wait", note=f"service step {step_plan.step_id(step)} finishes later")
            return
        await ctx.record_event(
            task.node, "service-step", f"service step {step_plan.step_id(step)} finished", event_type="service"
        )
    disabled = bool(task.node["driver_internal_info"].get(DISABLE_RAMDISK))
    await task.save_internal_info({}, remove=SERVICE_KEYS)
    names = ", ".join(step_plan.step_id(s) for s in plan) or "none"
    note = f"servicing finished (steps: {names})" + (" (ramdisk disabled)" if disabled else "")
    await ctx.transition(task, "done", changes={"service_step": {}}, note=note)


async def fail(ctx: FlowContext, task: Task, message: str) -> None:
    await task.save_internal_info({}, remove=SERVICE_KEYS)
    if task.node["provision_state"] in (states.SERVICING, states.SERVICEWAIT):
        await ctx.transition(task, "fail", last_error=message, changes={"service_step": {}})
    else:
        await task.save_fields({"service_step": {}, "last_error": message})


async def timed_out(ctx: FlowContext, task: Task) -> None:
    step = task.node.get("service_step") or {}
    await fail(
        ctx,
        task,
        f"Timeout reached while servicing node {task.node['uuid']}"
        + (f". Failed on step {step_plan.step_id(step)}." if step else "."),
    )


def aborted_message(node: NodeRecord) -> str:
    """Ironic's ``last_error`` after an aborted service, naming the step it stopped at."""
    step = node.get("service_step") or {}
    return "By request, the service operation was aborted" + (
        f' during or after the completion of step "{step_plan.step_id(step)}"' if step else ""
    )


async def abort(ctx: FlowContext, task: Task) -> None:
    """After ``abort`` in ``service wait`` (now ``service failed``): back to ``active``, as Ironic."""
    message = aborted_message(task.node)
    await task.save_internal_info({}, remove=SERVICE_KEYS)
    await ctx.transition(task, "abort", last_error=message, changes={"service_step": {}})


async def abort_failed(ctx: FlowContext, task: Task) -> None:
    """After ``abort`` in ``service failed`` (already ``active``): the step's error gives way to
    the abort's, and the servicing leftovers go, as Ironic's do_node_service_abort does."""
    message = aborted_message(task.node)
    await task.save_internal_info({}, remove=SERVICE_KEYS)
    await task.save_fields({"service_step": {}, "last_error": message})


async def unhold(ctx: FlowContext, task: Task) -> None:
    """After ``unhold`` moved the node from ``service hold`` to ``service wait``:
    the steps after the hold run now."""
    index = int(task.node["driver_internal_info"].get(INDEX) or 0)
    await ctx.transition(task, "resume", note="unhold: servicing goes on after the hold step")
    await _guarded(ctx, task, _run(ctx, task, index + 1))


async def resume(ctx: FlowContext, task: Task) -> None:
    """Continue servicing from the recorded step (a ``service wait`` node keeps waiting)."""
    node: NodeRecord = task.node
    if node["provision_state"] != states.SERVICING:
        return
    index = node["driver_internal_info"].get(INDEX)
    await _guarded(ctx, task, _run(ctx, task, int(index or 0)))
