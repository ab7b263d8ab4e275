"""Which flow continues a node found in which state.

Called for a node this conductor just adopted (its holder died, or this
conductor restarted, or the database came back under running work). The
node is locked by this conductor. A node in a state no flow owns only gets
its power state read from the BMC, so what the database says matches the
machine after a take-over.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping

from services.common import states
from services.conductor.drivers.base import Task
from services.conductor.flows import clean, deploy, inspect, power, rescue, service, teardown, verify
from services.conductor.flows.context import FlowContext, error_text

LOG = logging.getLogger(__name__)

Flow = Callable[[FlowContext, Task], Awaitable[None]]

RESUMES: Mapping[str, Flow] = {
    states.DEPLOYING: deploy.resume,
    states.DEPLOYWAIT: deploy.resume,
    states.DELETING: teardown.resume,
    states.CLEANING: clean.resume,
    states.CLEANWAIT: clean.resume,
    states.VERIFYING: verify.resume,
    states.INSPECTING: inspect.resume,
    states.INSPECTWAIT: inspect.resume,
    states.ADOPTING: rescue.resume,
    states.RESCUING: rescue.resume,
    states.UNRESCUING: rescue.resume,
    states.RESCUEWAIT: rescue.resume,
    states.SERVICING: service.resume,
}


async def resume(ctx: FlowContext, task: Task, *, reason: str) -> None:
    node = task.node
    state = node["provision_state"]
    flow = RESUMES.get(state)
    if node["maintenance"] and flow is not None and state != states.DEPLOYWAIT:
        # An operator stopped this node on purpose: do not drive its hardware.
        await ctx.record_event(node, "resume-skipped", f"{reason}; node in maintenance, {state} not resumed")
        return
    if flow is not None:
        LOG.warning("resuming node_uuid=%s state=%s reason=%s", node["uuid"], state, reason)
        await ctx.record_event(
            node, "flow-resume", f'{reason}; resuming "{state}" on {ctx.hostname}', severity="WARNING"
        )
        await flow(ctx, task)
        return
    if node["target_power_state"]:
        LOG.warning(
            "resuming power change node_uuid=%s target=%s reason=%s", node["uuid"], node["target_power_state"], reason
        )
        await power.resume(ctx, task)
        return
    await sync_power_state(ctx, task, reason=reason)


async def sync_power_state(ctx: FlowContext, task: Task, *, reason: str) -> None:
    """Record what the BMC says (an adopted node may have been powered on or
    off by its dead conductor after the database last heard of it)."""
    try:
        actual = await task.driver.power.get_power_state(task)
    except Exception as exc:  # noqa: BLE001 - an unreachable BMC is power sync's business, not take-over's
        LOG.warning("power state after take-over unknown node_uuid=%s reason=%s", task.node["uuid"], error_text(exc))
        return
    if actual != task.node["power_state"]:
        await ctx.save_with_event(
            task,
            {"power_state": actual},
            event="power-sync",
            message=f"{reason}; power state read from the BMC: {task.node['power_state']} -> {actual}",
            severity="WARNING",
            event_type="power",
        )
