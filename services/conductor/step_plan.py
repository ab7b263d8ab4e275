"""Planning clean and service steps: which steps the node's interfaces offer,
which run in automated cleaning, and whether a requested list is runnable.

Interfaces declare steps (``BaseInterface.get_clean_steps`` /
``get_service_steps``) as Ironic's ``@clean_step`` does: interface, step,
priority, abortable, argsinfo and requires_ramdisk. Automated cleaning runs
every step with a priority above 0, highest first; on a tie the interface
order below decides (Ironic's ``CLEANING_INTERFACE_PRIORITY``). Manual
cleaning and servicing run exactly the requested steps, in the requested
order, with their arguments; any priority is accepted, 0 included.

A requested list is checked whole before anything changes, and every
problem is reported at once in one 400 that lists what the node offers: an
interface that has no steps of that kind, a step nobody offers (or a step of
another kind, such as a deploy step asked for in cleaning), an argument the
step does not take, a missing required one, one of the wrong JSON type, or
an in-band step when the ramdisk is disabled. The conductor's own steps
(``hold``, ``power_on``, ``power_off``, ``reboot``: services/conductor/reserved_steps.py)
may be named on any of these interfaces. A step with ``execute_on_child_nodes``
runs on the node's children and is checked against each of them when it runs
(services/conductor/child_steps.py).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from services.common import errors
from services.conductor import reserved_steps
from services.conductor.drivers.base import Task

# Interfaces that may declare clean/service steps, and how ties are broken
# (higher first), as Ironic's CLEANING_INTERFACE_PRIORITY.
INTERFACE_PRIORITY: Mapping[str, int] = {
    "vendor": 7,
    "power": 6,
    "management": 5,
    "firmware": 4,
    "deploy": 3,
    "bios": 2,
    "raid": 1,
}
KINDS = ("clean", "service")
JSON_TYPES: Mapping[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "object": (dict,),
    "array": (list,),
}
STEP_KEYS = ("interface", "step", "priority", "abortable", "requires_ramdisk")


def offered(task: Task, kind: str) -> list[dict[str, Any]]:
    """Every ``kind`` step the node's interfaces offer, as they declare it."""
    if kind not in KINDS:
        raise ValueError(f"unknown step kind {kind!r}")
    found = []
    for interface in INTERFACE_PRIORITY:
        for step in getattr(getattr(task.driver, interface), f"get_{kind}_steps")(task):
            found.append({"abortable": False, "argsinfo": None, "requires_ramdisk": False, **step})
    return found


def _planned(step: Mapping[str, Any], *, priority: int, args: Mapping[str, Any]) -> dict[str, Any]:
    """The form a step takes in the plan (and in ``clean_step``/``service_step``)."""
    return {
        "interface": step["interface"],
        "step": step["step"],
        "priority": priority,
        "abortable": bool(step.get("abortable")),
        "requires_ramdisk": bool(step.get("requires_ramdisk")),
        "args": dict(args),
    }


def automated(task: Task) -> list[dict[str, Any]]:
    """Automated cleaning: the enabled clean steps (priority > 0), highest first."""
    enabled = [s for s in offered(task, "clean") if int(s.get("priority") or 0) > 0]
    enabled.sort(key=lambda s: (int(s["priority"]), INTERFACE_PRIORITY[s["interface"]]), reverse=True)
    return [_planned(s, priority=int(s["priority"]), args={}) for s in enabled]


def describe(steps: Sequence[Mapping[str, Any]]) -> str:
    """``deploy.erase_devices (priority 0), ...`` for messages."""
    if not steps:
        return "none"
    return ", ".join(
        f"{s['interface']}.{s['step']} (priority {s.get('priority', 0)})"
        for s in sorted(steps, key=lambda s: (s["interface"], s["step"]))
    )


def step_id(step: Mapping[str, Any]) -> str:
    return f"{step.get('interface')}.{step.get('step')}"


def requested(
    task: Task,
    kind: str,
    steps: Sequence[Mapping[str, Any]],
    *,
    disable_ramdisk: bool = False,
    other_kinds: Mapping[str, Sequence[Mapping[str, Any]]] | None = None,
) -> list[dict[str, Any]]:
    """The plan for manual cleaning or servicing: the requested steps in their
    order, each with its arguments; InvalidParameterValue naming every problem
    and the offered steps otherwise. ``other_kinds`` (e.g. the deploy steps)
    turns "unknown step" into "that is a deploy step" when it is one."""
    available = {step_id(s): s for s in offered(task, kind)}
    problems: list[str] = []
    plan: list[dict[str, Any]] = []
    for position, step in enumerate(steps, 1):
        ident = step_id(step)
        offer = available.get(ident)
        if step.get("interface") not in INTERFACE_PRIORITY:
            problems.append(
                f"step {position} ({ident}): {step.get('interface')!r} is not an interface with {kind} steps "
                f"(those are {', '.join(INTERFACE_PRIORITY)})"
            )
            continue
        if step.get("execute_on_child_nodes"):
            problems.extend(f"step {position} ({ident}): {p}" for p in _child_step_problems(step))
            plan.append(_for_children(step))
            continue
        if offer is None and reserved_steps.is_reserved(step):
            # hold, power_on, ...: the conductor runs these on any interface (1.85).
            problems.extend(f"step {position} ({ident}): {p}" for p in reserved_steps.argument_problems(step))
            plan.append(_planned({**step, "abortable": True}, priority=int(step.get("priority") or 0), args={}))
            continue
        if offer is None:
            problems.append(f"step {position} ({ident}): {_not_offered(ident, kind, other_kinds)}")
            continue
        args = step.get("args") or {}
        if not isinstance(args, Mapping):
            problems.append(f"step {position} ({ident}): args must be an object")
            continue
        problems.extend(f"step {position} ({ident}): {p}" for p in _argument_problems(offer, args))
        if disable_ramdisk and offer.get("requires_ramdisk"):
            problems.append(f"step {position} ({ident}): runs in the ramdisk, which disable_ramdisk switches off")
        plan.append(_planned(offer, priority=int(offer.get("priority") or 0), args=args))
    if problems:
        raise errors.InvalidParameterValue(
            f"Invalid {kind} steps for node {task.node['uuid']}: {'; '.join(problems)}. "
            f"The node's interfaces offer these {kind} steps: {describe(list(available.values()))}"
        )
    return plan


def _child_step_problems(step: Mapping[str, Any]) -> list[str]:
    """A step for the children is checked against each child when it runs there
    (services/conductor/child_steps.py), not against this node, which need not
    offer it (as Ironic); here only what no child could run."""
    if step.get("step") == reserved_steps.HOLD:
        return ["hold cannot run on child nodes"]
    limit = step.get("limit_child_node_execution") or []
    if not isinstance(limit, list) or not all(_is_uuid(ident) for ident in limit):
        return ["limit_child_node_execution must be a list of node UUIDs"]
    if reserved_steps.is_reserved(step):
        return reserved_steps.argument_problems(step)
    if not isinstance(step.get("args") or {}, Mapping):
        return ["args must be an object"]
    return []


def _is_uuid(value: Any) -> bool:
    try:
        uuid.UUID(str(value))
    except ValueError:
        return False
    return isinstance(value, str)


def _for_children(step: Mapping[str, Any]) -> dict[str, Any]:
    """A step for the children in the plan: as requested, and never in this node's ramdisk."""
    args = step.get("args") or {}
    return {
        **_planned(step, priority=int(step.get("priority") or 0), args=args if isinstance(args, Mapping) else {}),
        "abortable": False,
        "requires_ramdisk": False,
        "execute_on_child_nodes": True,
        "limit_child_node_execution": list(step.get("limit_child_node_execution") or []),
    }


async def check_arguments(task: Task, kind: str, plan: Sequence[Mapping[str, Any]]) -> None:
    """What each planned step's interface finds wrong with its arguments beyond
    their types (``step_argument_problems``: a BIOS setting the node does not
    have), refused as ``requested`` refuses, in one 400 listing the offered steps."""
    problems: list[str] = []
    for position, step in enumerate(plan, 1):
        if step.get("execute_on_child_nodes"):
            continue  # checked on each child when it runs there
        found = await getattr(task.driver, step["interface"]).step_argument_problems(task, step)
        problems.extend(f"step {position} ({step_id(step)}): {p}" for p in found)
    if problems:
        raise errors.InvalidParameterValue(
            f"Invalid {kind} steps for node {task.node['uuid']}: {'; '.join(problems)}. "
            f"The node's interfaces offer these {kind} steps: {describe(offered(task, kind))}"
        )


def _not_offered(ident: str, kind: str, other_kinds: Mapping[str, Sequence[Mapping[str, Any]]] | None) -> str:
    for other, steps in (other_kinds or {}).items():
        if any(step_id(s) == ident for s in steps):
            return f"this is a {other} step, not a {kind} step"
    return f"no interface of the node offers this {kind} step"


def _argument_problems(offer: Mapping[str, Any], args: Mapping[str, Any]) -> list[str]:
    argsinfo: Mapping[str, Any] = offer.get("argsinfo") or {}
    problems = []
    unexpected = sorted(set(args) - set(argsinfo))
    if unexpected:
        takes = ", ".join(sorted(argsinfo)) or "none"
        problems.append(f"unexpected arguments {', '.join(unexpected)} (it takes: {takes})")
    missing = sorted(name for name, info in argsinfo.items() if (info or {}).get("required") and name not in args)
    if missing:
        problems.append(f"missing required arguments {', '.join(missing)}")
    for name, value in args.items():
        wanted = ((argsinfo.get(name) or {}).get("type")) if name in argsinfo else None
        if isinstance(wanted, str) and wanted in JSON_TYPES and not _is_json_type(value, wanted):
            problems.append(f"argument {name} must be of type {wanted}, not {type(value).__name__}")
    return problems


def _is_json_type(value: Any, wanted: str) -> bool:
    if isinstance(value, bool) and wanted != "boolean":
        return False  # JSON true is not a number
    return isinstance(value, JSON_TYPES[wanted])


def still_offered(task: Task, kind: str, plan: Sequence[Mapping[str, Any]]) -> None:
    """Once the ramdisk reports its own steps: every planned in-band step must
    still be offered (a ramdisk older or newer than the catalogue may differ)."""
    available = {step_id(s) for s in offered(task, kind)}
    missing = [
        step_id(s)
        for s in plan
        if step_id(s) not in available and not reserved_steps.is_reserved(s) and not s.get("execute_on_child_nodes")
    ]
    if missing:
        raise errors.InvalidParameterValue(
            f"The ramdisk of node {task.node['uuid']} does not offer the {kind} steps {', '.join(missing)}; "
            f"it offers: {describe(offered(task, kind))}"
        )
