"""The deploy flow: ``deploying`` -> (``wait call-back`` -> agent) -> ``active``.

Three entry points, each under the node's lock:
- ``start``: the first half after the deploy verb (config drive, volumes,
  the steps before ``deploy.deploy``, then ``deploy.deploy``, which for the
  agent deploys boots the ramdisk and ends in ``wait call-back``);
- ``continue_after_callback``: one step of the agent's part, after a
  heartbeat (send write_image or poll it; once the image is written, the
  steps after it: prepare_instance_boot, tear_down_agent, boot_instance);
- ``resume``: the same flow picked up by another conductor (or after a
  database outage) from what the node recorded.

Progress lives in ``driver_internal_info``: ``deploy_phase`` is absent until
the agent is sent write_image, ``write_image`` while it writes, and
``finishing`` with ``finish_step`` naming the step after the write that is
running. Every step is safe to repeat: storing the config drive again keeps
the URL, power on is idempotent, a repeated write_image adopts the command the
agent is already running, and a finish step restarts from its beginning.
"""

from __future__ import annotations

import logging
from typing import Any

from services.common import states
from services.common.db.outage import is_unavailable
from services.conductor import deploy_steps as steps
from services.conductor import reserved_steps
from services.conductor.drivers import ramdisk_boot, volumes
from services.conductor.drivers.base import Task
from services.conductor.drivers.direct import AGENT_KEYS
from services.conductor.flows.context import FlowContext, error_text, guarded

LOG = logging.getLogger(__name__)

PHASE = "deploy_phase"
FINISH_STEP = "finish_step"
FINISHING = "finishing"
HELD_AT = "deploy_held_at"


async def start(ctx: FlowContext, task: Task) -> None:
    await guarded(ctx, task, "Deploy", _first_half(ctx, task))


async def _first_half(ctx: FlowContext, task: Task, *, after_hold: int | None = None) -> None:
    if after_hold is None:
        stored = await ctx.configdrives.store(task)
        if stored is not None and stored != task.node["instance_info"].get("configdrive"):
            await task.save_fields({"instance_info": {**task.node["instance_info"], "configdrive": stored}})
        await task.driver.storage.attach_volumes(task)
        await volumes.record(task)
        await task.driver.deploy.prepare(task)
    planned = task.node["driver_internal_info"].get("deploy_steps") or steps.plan(task, [])
    before, core, after = steps.split_at_deploy(planned)
    for index in range(0 if after_hold is None else after_hold + 1, len(before)):
        step = before[index]
        if reserved_steps.is_reserved(step):
            await steps.mark(ctx, task, step)
            if step["step"] == reserved_steps.HOLD:
                await task.save_internal_info({HELD_AT: index})
                await ctx.transition(task, "hold", note="deploy step hold: waiting for unhold")
                return
            await reserved_steps.run_power_step(ctx.config, task, step)
            continue
        await steps.run_step(ctx, task, step)
    await steps.mark(ctx, task, core)
    result = await task.driver.deploy.deploy(task)
    if result == states.DEPLOYWAIT:
        # The agent's heartbeats run the steps after deploy.deploy.
        await steps.clear(task)
        await ctx.transition(task, "wait")
        if task.node["driver_internal_info"].get("agent_url"):
            # The agent already heartbeated while we were still deploying (a
            # fast boot): take the first step now instead of a heartbeat later.
            await _agent_step(ctx, task)
        return
    for step in after:
        await steps.run_step(ctx, task, step)
    if not task.driver.deploy.prepares_instance_boot:
        await task.driver.boot.prepare_instance(task)
    await volumes.drop_force_deployment(task)
    await ctx.transition(task, "done", changes={"deploy_step": {}}, release=True)  # the flow's last write


async def unhold(ctx: FlowContext, task: Task) -> None:
    """After ``unhold`` moved the node from ``deploy hold`` to ``wait call-back``:
    the deploy goes on with the step after the hold."""
    index = int(task.node["driver_internal_info"].get(HELD_AT) or 0)
    await task.save_internal_info({}, remove=(HELD_AT,))
    await ctx.transition(task, "resume", note="unhold: the deploy goes on after the hold step")
    await guarded(ctx, task, "Deploy", _first_half(ctx, task, after_hold=index))


async def continue_after_callback(ctx: FlowContext, task: Task) -> None:
    """The next step for a locked node in ``wait call-back`` whose agent called."""
    await guarded(ctx, task, "Deploy", _agent_step(ctx, task))


async def _agent_step(ctx: FlowContext, task: Task) -> None:
    deploy = task.driver.deploy
    info = task.node["driver_internal_info"]
    if info.get(PHASE) is None:  # this call sends write_image: show it as the running step
        await steps.mark(ctx, task, planned_step(task, "write_image"))
    event = await deploy.heartbeat(task, info.get("agent_url", ""), info.get("agent_version", ""))
    if event != "resume":
        return
    await ctx.transition(task, "resume")
    await _finish(ctx, task, from_step=None)


async def _finish(ctx: FlowContext, task: Task, *, from_step: str | None) -> None:
    """The steps after the image write, each recorded before it runs (so a
    conductor that adopts the node restarts the step, not the deploy)."""
    deploy = task.driver.deploy
    names = list(getattr(deploy, "FINISH_STEPS", ()))
    if from_step in names:
        names = names[names.index(from_step) :]
    for name in names:
        await task.save_internal_info({PHASE: FINISHING, FINISH_STEP: name})
        await steps.mark(ctx, task, planned_step(task, name))
        await getattr(deploy, name)(task)
    await task.save_internal_info({}, remove=(*(k for k in AGENT_KEYS if k != "deploy_progress"), FINISH_STEP))
    await volumes.drop_force_deployment(task)
    await ctx.transition(task, "done", changes={"deploy_step": {}}, release=True)  # the flow's last write


async def abort(ctx: FlowContext, task: Task) -> None:
    """After ``abort`` moved the node from ``wait call-back`` to ``deploy failed`` (REST 1.110):
    power the ramdisk off and forget its agent, and stop there. As Ironic does, no
    cleaning follows, so the operator can look at the machine or deploy again."""
    step = task.node.get("deploy_step") or {}
    message = "By request, the deploy operation was aborted"
    if step:
        message += f' during or after the completion of step "{step.get("interface")}.{step.get("step")}"'
    try:
        await ramdisk_boot.power_off_ramdisk(task)
    except Exception as exc:
        if is_unavailable(exc):
            raise
        LOG.warning("tear down after deploy abort failed node_uuid=%s reason=%s", task.node["uuid"], error_text(exc))
        message += f". Also tearing down the ramdisk failed: {error_text(exc)}"
    await task.save_internal_info({}, remove=(PHASE, FINISH_STEP))
    await task.save_fields({"deploy_step": {}, "last_error": message})
    await ctx.record_event(task.node, "abort", message, severity="WARNING")


async def resume(ctx: FlowContext, task: Task) -> None:
    """Continue a deploy that another conductor (or a lost database) interrupted."""
    await guarded(ctx, task, "Deploy", _resume(ctx, task))


async def _resume(ctx: FlowContext, task: Task) -> None:
    node = task.node
    info = node["driver_internal_info"]
    state = node["provision_state"]
    if state == states.DEPLOYWAIT:
        if info.get("agent_url"):
            await _agent_step(ctx, task)  # poll the agent now, not at its next heartbeat
        return
    if state != states.DEPLOYING:
        return
    if info.get(PHASE) in (FINISHING, "write_image"):
        # The image is on the disk ("resume" only follows a finished write).
        await _finish(ctx, task, from_step=info.get(FINISH_STEP))
        return
    if info.get("agent_url"):
        # The ramdisk is up and called back, so deploy.deploy had run: go on waiting for it.
        await steps.clear(task)
        await ctx.transition(task, "wait", note="resumed after take-over; the agent is already running")
        await _agent_step(ctx, task)
        return
    # The first half was cut short: run it again from the top. Each step is
    # safe to repeat; deploy.deploy powers on a machine whose ramdisk boot was
    # already requested only if it is still off (DirectDeploy.deploy), so an
    # agent already booting keeps its token.
    await _first_half(ctx, task)


def planned_step(task: Task, name: str) -> dict[str, Any]:
    """The step as planned for this deploy (its priority), else the interface's default."""
    for step in task.node["driver_internal_info"].get("deploy_steps") or []:
        if step.get("interface") == "deploy" and step.get("step") == name:
            return {k: step[k] for k in ("interface", "step", "priority", "args") if k in step}
    return {"interface": "deploy", "step": name, "priority": 0, "args": {}}
