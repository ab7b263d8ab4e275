"""Deploy steps (API 1.69): planning the steps of one deploy and recording them.

The node's interfaces offer steps (``DeployInterface.get_deploy_steps``:
interface, step, priority, argsinfo). A user's ``deploy_steps`` may only name
offered steps; each overrides that step's priority and args, priority 0
disables it. The plan is the enabled steps by descending priority, kept in
``driver_internal_info.deploy_steps``. ``deploy.deploy`` is the core step:
the conductor runs it through ``DeployInterface.deploy``; the steps before it
run first, the ones after it run once a synchronous deploy returns (for the
agent-driven ``direct`` deploy the agent's heartbeats do that part). Every
step is shown in the node's ``deploy_step`` while it runs and recorded in
the node history, in order.

Deploy templates (1.55) whose names are in ``instance_info.traits`` add
their steps between the defaults and the user's, as in Ironic. Steps an
interface marks ``fixed`` (the agent-run steps of ``direct``) keep their
place: a template or user may name them only with their own priority and no
arguments. The conductor's own steps (``hold``, ``power_on``, ...:
services/conductor/reserved_steps.py) may be planned on any interface, before
``deploy.deploy`` only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from services.common import errors
from services.common.db.deploy_templates import DeployTemplateRepository
from services.conductor import reserved_steps
from services.conductor.drivers.base import Task

if TYPE_CHECKING:
    from services.conductor.flows.context import FlowContext

CORE_STEP = {"interface": "deploy", "step": "deploy", "priority": 100, "args": {}}


def offered(task: Task) -> list[dict[str, Any]]:
    """Every deploy step the node's interfaces offer (only the deploy interface has any today)."""
    return list(task.driver.deploy.get_deploy_steps(task))


async def template_steps(pool: Any, task: Task) -> list[dict[str, Any]]:
    """Steps of the deploy templates named by ``instance_info.traits`` (1.55),
    as Ironic applies them; two templates may not name the same step."""
    traits = task.node["instance_info"].get("traits") or []
    if not isinstance(traits, list):
        raise errors.InvalidParameterValue("instance_info traits must be a list of trait names")
    repo = DeployTemplateRepository(pool)
    found: dict[tuple[str, str], dict[str, Any]] = {}
    for name in sorted({t for t in traits if isinstance(t, str)}):
        try:
            template = await repo.get(name)
        except errors.NotFound:
            continue
        for step in template["steps"]:
            key = (step["interface"], step["step"])
            if key in found:
                raise errors.InvalidParameterValue(
                    f"Deploy templates {found[key]['template']} and {name} both name deploy step "
                    f"{key[0]}.{key[1]}; a step may come from one template only"
                )
            found[key] = {
                "interface": key[0],
                "step": key[1],
                "args": dict(step.get("args") or {}),
                "priority": step["priority"],
                "template": name,
            }
    return list(found.values())


def plan(
    task: Task, user_steps: list[dict[str, Any]], templates: list[dict[str, Any]] | None = None
) -> list[dict[str, Any]]:
    """The ordered steps of a deploy: offered defaults, then deploy template
    steps, then the user's steps (each overriding the one before); 400 for a
    step nobody offers."""
    available = {(s["interface"], s["step"]): s for s in offered(task)}
    chosen = {
        key: {"interface": key[0], "step": key[1], "priority": s["priority"], "args": {}}
        for key, s in available.items()
    }
    templates = templates or []
    reserved = {
        (s["interface"], s["step"]): {**s, "args": {}}
        for s in [*templates, *user_steps]
        if (s.get("interface"), s.get("step")) not in available and reserved_steps.is_reserved(s)
    }
    for source, requested in (("deploy template", templates), ("requested", user_steps)):
        unknown = [
            f"{s.get('interface')}.{s.get('step')}"
            for s in requested
            if (s.get("interface"), s.get("step")) not in available
            and (s.get("interface"), s.get("step")) not in reserved
        ]
        if unknown:
            raise errors.InvalidParameterValue(
                f"Unsupported {source} steps for node {task.node['uuid']}: {', '.join(unknown)}. The node's "
                f"interfaces offer: {', '.join(sorted(f'{i}.{n}' for i, n in available))}"
            )
    for key, step in reserved.items():
        problems = reserved_steps.argument_problems(step)
        if problems:
            raise errors.InvalidParameterValue(f"Deploy step {key[0]}.{key[1]}: {'; '.join(problems)}")
        chosen[key] = {"interface": key[0], "step": key[1], "priority": step["priority"], "args": {}}
    for s in [*templates, *user_steps]:
        if (s["interface"], s["step"]) in reserved:
            continue
        offer = available[(s["interface"], s["step"])]
        if offer.get("fixed") and (s["priority"] != offer["priority"] or s.get("args")):
            # The agent runs these at their place after deploy.deploy (direct deploy).
            raise errors.InvalidParameterValue(
                f"Deploy step {s['interface']}.{s['step']} runs at its fixed place (priority {offer['priority']}) "
                "with no arguments; it cannot be moved, disabled or given arguments"
            )
        chosen[(s["interface"], s["step"])].update(priority=s["priority"], args=dict(s.get("args") or {}))
    if chosen.get(("deploy", "deploy"), {}).get("priority", 0) == 0:
        raise errors.InvalidParameterValue("The deploy.deploy step is required and cannot be disabled (priority 0)")
    enabled = sorted(
        (s for s in chosen.values() if s["priority"] > 0), key=lambda s: (-s["priority"], s["interface"], s["step"])
    )
    core = chosen[("deploy", "deploy")]["priority"]
    late = [f"{s['interface']}.{s['step']}" for s in enabled if reserved_steps.is_reserved(s) and s["priority"] <= core]
    if late:
        # After deploy.deploy the agent (direct deploy) drives the node; Ferrum runs
        # the conductor's own steps before it only.
        raise errors.InvalidParameterValue(
            f"Deploy steps {', '.join(late)} must run before deploy.deploy: give them a priority above {core}"
        )
    return enabled


def split_at_deploy(planned: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], dict[str, Any], list[dict[str, Any]]]:
    """(steps before deploy.deploy, deploy.deploy itself, steps after it)."""
    for index, step in enumerate(planned):
        if (step["interface"], step["step"]) == ("deploy", "deploy"):
            return planned[:index], step, planned[index + 1 :]
    return [], dict(CORE_STEP), list(planned)


async def mark(ctx: FlowContext, task: Task, step: dict[str, Any]) -> None:
    """Show the step in ``deploy_step`` and record its start in the history (one statement)."""
    await ctx.save_with_event(
        task,
        {"deploy_step": dict(step)},
        event="deploy-step",
        message=f"deploy step {step['interface']}.{step['step']} (priority {step['priority']}) started",
    )


async def run_step(ctx: FlowContext, task: Task, step: dict[str, Any]) -> None:
    await mark(ctx, task, step)
    interface = getattr(task.driver, step["interface"])
    await interface.execute_deploy_step(task, step)


async def clear(task: Task) -> None:
    await task.save_fields({"deploy_step": {}})
