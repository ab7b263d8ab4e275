"""Clean and service steps run on a node's children (``execute_on_child_nodes``,
with API 1.83's ``parent_node``), as Ironic's ``execute_step_on_child_nodes``.

The parent's flow (services/conductor/flows/clean.py, service.py) hands such a
step here instead of running it on the parent. It runs on every child of the
parent, oldest first, or only on those whose UUIDs ``limit_child_node_execution``
lists: a listed UUID that is not a child of this parent is skipped, as Ironic's
query (``parent_node`` and ``uuid in``) skips it. Each child is locked on its
own (a locked child is tried again a few times, then the step fails), runs the
step with its own driver, and keeps its provision state: only the step's effect
reaches it. The reserved ``power_on``/``power_off``/``reboot`` steps power the
child. A child's step must finish at once: one that answers "wait" fails the
parent's step, unless ``permit_child_node_step_async_result`` lets it go on.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from services.common import errors, states
from services.common.config import ConductorConfig
from services.common.db.outage import is_unavailable
from services.conductor import related_nodes, reserved_steps, step_plan
from services.conductor.drivers.base import Task
from services.conductor.flows.context import error_text

KEYS = ("execute_on_child_nodes", "limit_child_node_execution")
WAIT_STATES: Mapping[str, str] = {"clean": states.CLEANWAIT, "service": states.SERVICEWAIT}


class ChildStepFailed(errors.FerrumError):
    """The step failed on one of the children; the parent's flow fails with this message."""


def on_children(step: Mapping[str, Any]) -> bool:
    """Whether the step is for the node's children rather than the node."""
    return bool(step.get("execute_on_child_nodes"))


async def targets(task: Task, step: Mapping[str, Any]) -> list[str]:
    """The children the step runs on: all of them, or those listed that are children."""
    if task.child_nodes is None:
        raise RuntimeError("child node steps need a locked task")
    children = await task.child_nodes()
    wanted = {str(ident).lower() for ident in step.get("limit_child_node_execution") or ()}
    return [child for child in children if child in wanted] if wanted else children


async def run(config: ConductorConfig, task: Task, kind: str, step: Mapping[str, Any]) -> list[str]:
    """Run ``step`` on the parent's children, one after the other; the children it
    ran on. The first child that fails stops it, with an error naming the child
    and the step (the parent's flow fails with it)."""
    ident = step_plan.step_id(step)
    done: list[str] = []
    for child in await targets(task, step):
        try:
            await _run_locked(config, task, kind, step, child)
        except Exception as exc:
            if is_unavailable(exc):
                raise
            raise ChildStepFailed(f"{kind} step {ident} failed on child node {child}: {error_text(exc)}") from exc
        done.append(child)
    return done


async def _run_locked(config: ConductorConfig, task: Task, kind: str, step: Mapping[str, Any], child: str) -> None:
    purpose = f"{kind} step {step_plan.step_id(step)} for parent node {task.node['uuid']}"
    async with related_nodes.locked(config, task, child, purpose) as child_task:
        await _run_one(config, child_task, kind, step)


async def _run_one(config: ConductorConfig, task: Task, kind: str, step: Mapping[str, Any]) -> None:
    """The step on one locked child: checked against what the child offers, then run."""
    own = {k: v for k, v in step.items() if k not in KEYS}
    if reserved_steps.is_reserved(own):
        if own["step"] == reserved_steps.HOLD:  # step_plan refuses it when the step is requested
            raise errors.InvalidParameterValue("hold cannot run on child nodes")
        await reserved_steps.run_power_step(config, task, own)
        return
    planned = step_plan.requested(task, kind, [{**own, "args": own.get("args") or {}}])
    await step_plan.check_arguments(task, kind, planned)
    execute = getattr(getattr(task.driver, own["interface"]), f"execute_{kind}_step")
    result = await execute(task, planned[0])
    if result is None:
        return
    if result == WAIT_STATES[kind] and config.permit_child_node_step_async_result:
        return
    raise errors.InvalidParameterValue(
        f"the step answered {result!r}: a step run on a child node must finish at once "
        "(permit_child_node_step_async_result allows it to go on in the background)"
    )
