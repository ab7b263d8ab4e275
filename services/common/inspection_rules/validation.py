"""Whether an inspection rule document is acceptable (Ironic's schema plus
``validate_rule``): shape, phase, priority, and every operation's arguments.
Problems are collected and reported together, with Ironic's wording."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from services.common import errors
from services.common.inspection_rules.operations import ACTIONS, CONDITIONS, check_args, parse_operator

PHASES = ("main",)
RULE_FIELDS = frozenset(("uuid", "description", "phase", "priority", "sensitive", "conditions", "actions"))
MULTIPLE = ("any", "all", "first", "last")
MAX_PRIORITY = 9999


def validate_rule(rule: Any, *, built_in: bool = False) -> None:
    """Raise InvalidParameterValue naming everything wrong with ``rule``."""
    if not isinstance(rule, Mapping):
        raise errors.InvalidParameterValue("Validation failed for inspection rule: the rule must be an object")
    problems = _shape_problems(rule)
    if problems:
        raise errors.InvalidParameterValue(f"Validation failed for inspection rule: {'; '.join(problems)}")
    phase = rule.get("phase") or "main"
    if phase not in PHASES:
        problems.append(f"Invalid phase: {phase}. Valid phases are: {', '.join(PHASES)}")
    priority = rule.get("priority") or 0
    if not built_in and priority < 0:
        problems.append("Priority cannot be negative for user-defined rules.")
    if not built_in and priority > MAX_PRIORITY:
        problems.append(f"Priority must be between 0 and {MAX_PRIORITY} for user-defined rules.")
    for kind, table, items in (
        ("condition", CONDITIONS, rule.get("conditions") or []),
        ("action", ACTIONS, rule["actions"]),
    ):
        for item in items:
            try:
                name, _ = parse_operator(item["op"])
            except errors.InvalidParameterValue as exc:
                problems.append(exc.message)
                continue
            if name not in table or (kind == "action" and item["op"].strip() != name):
                problems.append(f"Unsupported {kind} operator: {item['op']}")
                continue
            try:
                check_args(table[name], item.get("args", {}))
            except errors.InvalidParameterValue as exc:
                problems.append(f"Invalid parameters for {kind} operator {name}: {exc.message}")
    if len(problems) == 1:
        raise errors.InvalidParameterValue(problems[0])
    if problems:
        raise errors.InvalidParameterValue(f"Multiple validation errors occurred: {'; '.join(problems)}")


def _shape_problems(rule: Mapping[str, Any]) -> list[str]:
    """Ironic's create_request_body schema, checked by hand."""
    problems = []
    unknown = sorted(set(rule) - RULE_FIELDS)
    if unknown:
        problems.append(f"Additional properties are not allowed ({', '.join(unknown)})")
    for key, kinds, label in (
        ("uuid", (str, type(None)), "a string or null"),
        ("description", (str, type(None)), "a string or null"),
        ("phase", (str, type(None)), "a string or null"),
        ("sensitive", (bool, type(None)), "a boolean or null"),
    ):
        if key in rule and not isinstance(rule[key], kinds):
            problems.append(f"{key} must be {label}")
    if isinstance(rule.get("description"), str) and len(rule["description"]) > 255:
        problems.append("description is longer than 255 characters")
    if isinstance(rule.get("phase"), str) and len(rule["phase"]) > 16:
        problems.append("phase is longer than 16 characters")
    priority = rule.get("priority", 0)
    if isinstance(priority, bool) or not isinstance(priority, int):
        problems.append("priority must be an integer")
    actions = rule.get("actions")
    if not isinstance(actions, list) or not actions:
        problems.append("actions is required: a list of at least one action")
    conditions = rule.get("conditions", [])
    if conditions is not None and not isinstance(conditions, list):
        problems.append("conditions must be a list")
    for kind, items in (("condition", conditions or []), ("action", actions if isinstance(actions, list) else [])):
        for item in items:
            problems.extend(_operation_problems(kind, item))
    return problems


def _operation_problems(kind: str, item: Any) -> list[str]:
    if not isinstance(item, Mapping) or not isinstance(item.get("op"), str):
        return [f"every {kind} must be an object with an 'op' string, not {item!r:.100}"]
    problems = []
    if "args" in item and not isinstance(item["args"], (dict, list)):
        problems.append(f"the args of {kind} {item['op']!r} must be an object or a list")
    if "loop" in item and not isinstance(item["loop"], (dict, list)):
        problems.append(f"the loop of {kind} {item['op']!r} must be an object or a list")
    if kind == "condition" and "multiple" in item and item["multiple"] not in MULTIPLE:
        problems.append(f"multiple of condition {item['op']!r} must be one of {', '.join(MULTIPLE)}")
    return problems
