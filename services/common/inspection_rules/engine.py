"""Evaluating inspection rules on one node's inventory (Ironic's
``apply_rules``): rules by priority, highest first; a rule applies when all
its conditions hold (none: always); its actions then run in order on a
``RuleTarget``, which the caller persists. A ``fail`` action, or an action
that cannot run, raises ``InspectionRuleFailure``: the inspection fails.

Conditions and actions take interpolated arguments (interpolation.py) and
may ``loop`` over a list (conditions combine the results with ``multiple``:
any, all, first, last). Sensitive values read as ``***`` unless the rule is
``sensitive`` and masking is ``sensitive``, as Ironic's ``mask_secrets``.
"""

from __future__ import annotations

import asyncio
import ipaddress
import itertools
import logging
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from services.common import errors, node_capabilities
from services.common.inspection_rules.interpolation import NodeView, interpolate, masked
from services.common.inspection_rules.operations import ACTIONS, CONDITIONS, named_args, parse_operator, split_path

LOG = logging.getLogger(__name__)
MASK_MODES = ("always", "never", "sensitive")


class InspectionRuleFailure(errors.FerrumError):
    """A rule's ``fail`` action, or an action that could not run: the inspection fails."""


@dataclass
class RuleTarget:
    """What rules read and change; the caller saves ``node``, ``ports``,
    ``traits`` and ``plugin_data`` afterwards."""

    node: dict[str, Any]
    inventory: Mapping[str, Any]
    plugin_data: dict[str, Any] = field(default_factory=dict)
    ports: dict[str, dict[str, Any]] = field(default_factory=dict)  # by port uuid
    traits: list[str] = field(default_factory=list)
    log: list[str] = field(default_factory=list)  # what ``log`` actions wrote, for the history


async def apply_rules(
    rules: Sequence[Mapping[str, Any]],
    target: RuleTarget,
    *,
    mask_secrets: str = "always",
    session: aiohttp.ClientSession | None = None,
) -> list[str]:
    """Run every applicable rule; returns the uuids (or indexes) of the rules that applied."""
    if mask_secrets not in MASK_MODES:
        raise errors.InvalidParameterValue(f"mask_secrets must be one of {', '.join(MASK_MODES)}")
    applied = []
    ordered = sorted(enumerate(rules), key=lambda pair: -int(pair[1].get("priority") or 0))
    for index, rule in ordered:
        mask = mask_secrets == "always" or (mask_secrets == "sensitive" and not rule.get("sensitive"))
        if not _applies(rule, target, mask):
            continue
        for action in rule.get("actions") or []:
            await _run_action(action, target, mask, session)
        applied.append(str(rule.get("uuid") or index))
    return applied


def _context(target: RuleTarget, mask: bool, item: Any = None) -> dict[str, Any]:
    inventory, plugin_data = (
        (masked(target.inventory), masked(target.plugin_data)) if mask else (target.inventory, target.plugin_data)
    )
    context: dict[str, Any] = {"node": NodeView(target.node), "inventory": inventory, "plugin_data": plugin_data}
    if item is not None:
        context["item"] = item
    return context


def _loop_items(operation: Mapping[str, Any]) -> list[Any] | None:
    loop = operation.get("loop")
    if loop is None or loop == []:
        return None
    return list(loop) if isinstance(loop, list) else [loop]


def _applies(rule: Mapping[str, Any], target: RuleTarget, mask: bool) -> bool:
    return all(_condition_holds(condition, target, mask) for condition in rule.get("conditions") or [])


def _condition_holds(condition: Mapping[str, Any], target: RuleTarget, mask: bool) -> bool:
    name, inverted = parse_operator(condition["op"])
    items = _loop_items(condition)
    if items is None:
        return _check(name, condition, _context(target, mask), in_loop=False) != inverted
    results = [_check(name, condition, _context(target, mask, item), in_loop=True) != inverted for item in items]
    multiple = condition.get("multiple") or "any"
    if multiple == "all":
        return all(results)
    if multiple == "first":
        return any(results) or results[0]
    if multiple == "last":
        return results[-1]
    return any(results)


def _arguments(
    name: str, table: Mapping[str, Any], operation: Mapping[str, Any], context: Mapping[str, Any], in_loop: bool
) -> dict[str, Any]:
    signature = table[name]
    args = named_args(signature, operation.get("args") or {})
    for key, value in args.items():
        if in_loop or key in signature.formatted:
            args[key] = interpolate(value, context, op=name)
    return args


def _check(name: str, condition: Mapping[str, Any], context: Mapping[str, Any], *, in_loop: bool) -> bool:
    args = _arguments(name, CONDITIONS, condition, context, in_loop)
    try:
        return CHECKS[name](args, in_loop)
    except (TypeError, ValueError, re.error) as exc:
        raise InspectionRuleFailure(
            f"Inspection rule condition {condition['op']!r} could not be checked: {exc}"
        ) from exc


def _compare(args: Mapping[str, Any], in_loop: bool, relation: Callable[[Any, Any], bool]) -> bool:
    values = args["values"]
    if not isinstance(values, list):
        raise ValueError("'values' must be a list")
    if args.get("force_strings") or in_loop:
        values = [str(v) for v in values]
    return all(relation(a, b) for a, b in itertools.pairwise(values))


def _is_true(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)):
        return bool(value)
    return isinstance(value, str) and value.lower() in ("yes", "true")


def _is_false(value: Any) -> bool:
    if isinstance(value, bool):
        return not value
    if isinstance(value, (int, float)):
        return not bool(value)
    if isinstance(value, str):
        return value.lower() in ("no", "false")
    return value is None


def _full_match(args: Mapping[str, Any]) -> bool:
    regex = str(args["regex"])
    return re.match(regex if regex.endswith("$") else regex + "$", str(args["value"])) is not None


CHECKS: Mapping[str, Callable[[Mapping[str, Any], bool], bool]] = {
    "eq": lambda a, loop: _compare(a, loop, lambda x, y: x == y),
    "lt": lambda a, loop: _compare(a, loop, lambda x, y: x < y),
    "gt": lambda a, loop: _compare(a, loop, lambda x, y: x > y),
    "is-empty": lambda a, _: str(a["value"]) in ("", "None", "[]", "{}"),
    "in-net": lambda a, _: ipaddress.ip_address(str(a["address"])) in ipaddress.ip_network(str(a["subnet"])),
    "matches": lambda a, _: _full_match(a),
    "contains": lambda a, _: re.search(str(a["regex"]), str(a["value"])) is not None,
    "one-of": lambda a, _: a["value"] in (a.get("values") or []),
    "is-none": lambda a, _: a["value"] is None,
    "is-true": lambda a, _: _is_true(a["value"]),
    "is-false": lambda a, _: _is_false(a["value"]),
}


async def _run_action(
    action: Mapping[str, Any], target: RuleTarget, mask: bool, session: aiohttp.ClientSession | None
) -> None:
    name, _ = parse_operator(action["op"])
    items = _loop_items(action)
    for item in items if items is not None else [None]:
        args = _arguments(name, ACTIONS, action, _context(target, mask, item), items is not None)
        try:
            await _act(name, args, target, session)
        except InspectionRuleFailure:
            raise
        except (errors.FerrumError, KeyError, TypeError, ValueError, aiohttp.ClientError, TimeoutError) as exc:
            text = getattr(exc, "message", None) or str(exc) or type(exc).__name__
            raise InspectionRuleFailure(f"Inspection rule action {name!r} failed: {text}") from exc


def _parent(root: dict[str, Any], path: list[str], *, create: bool) -> dict[str, Any]:
    for key in path[:-1]:
        child = root.get(key)
        if not isinstance(child, dict):
            if not create:
                raise KeyError("/".join(path))
            child = root[key] = {}
        root = child
    return root


def _set(root: dict[str, Any], path: Any, value: Any) -> None:
    keys = split_path(path)
    _parent(root, keys, create=True)[keys[-1]] = value


def _extend(root: dict[str, Any], path: Any, value: Any, unique: bool) -> None:
    keys = split_path(path)
    parent = _parent(root, keys, create=True)
    current = parent.setdefault(keys[-1], [])
    if not isinstance(current, list):
        raise ValueError(f"{'/'.join(keys)} is not a list")
    if not (unique and value in current):
        current.append(value)


def _delete(root: dict[str, Any], path: Any, *, prune: bool = False) -> None:
    keys = split_path(path)
    parents = [root]
    for key in keys[:-1]:
        child = parents[-1].get(key)
        if not isinstance(child, dict):
            return
        parents.append(child)
    parents[-1].pop(keys[-1], None)
    if prune:  # unset-plugin-data drops parents left empty
        for key, parent in zip(reversed(keys[:-1]), reversed(parents[:-1]), strict=False):
            if parent.get(key) == {}:
                parent.pop(key)


def _capabilities(target: RuleTarget) -> dict[str, str]:
    properties = target.node.setdefault("properties", {})
    return node_capabilities.parse(properties.get("capabilities"))


def _save_capabilities(target: RuleTarget, caps: Mapping[str, str]) -> None:
    target.node["properties"]["capabilities"] = ",".join(f"{k}:{v}" for k, v in caps.items())


def _port(target: RuleTarget, port_id: Any) -> dict[str, Any]:
    port = target.ports.get(str(port_id))
    if port is None:
        raise errors.NotFound(f"Port {port_id} could not be found on node {target.node.get('uuid')}")
    return port


async def _act(name: str, args: dict[str, Any], target: RuleTarget, session: aiohttp.ClientSession | None) -> None:
    if name == "fail":
        raise InspectionRuleFailure(str(args["msg"]))
    if name == "log":
        level = str(args.get("level") or "info").upper()
        LOG.log(
            getattr(logging, level, logging.INFO),
            "inspection rule node_uuid=%s: %s",
            target.node.get("uuid"),
            args["msg"],
        )
        target.log.append(str(args["msg"]))
    elif name == "set-attribute":
        _set(target.node, args["path"], args["value"])
    elif name == "extend-attribute":
        _extend(target.node, args["path"], args["value"], bool(args.get("unique")))
    elif name == "del-attribute":
        _delete(target.node, args["path"])
    elif name == "set-capability":
        caps = _capabilities(target)
        caps[str(args["name"])] = str(args["value"])
        _save_capabilities(target, caps)
    elif name == "unset-capability":
        caps = _capabilities(target)
        caps.pop(str(args["name"]), None)
        _save_capabilities(target, caps)
    elif name == "add-trait":
        if args["name"] not in target.traits:
            target.traits.append(str(args["name"]))
    elif name == "remove-trait":
        if args["name"] in target.traits:
            target.traits.remove(args["name"])
    elif name == "set-plugin-data":
        _set(target.plugin_data, args["path"], args["value"])
    elif name == "extend-plugin-data":
        _extend(target.plugin_data, args["path"], args["value"], bool(args.get("unique")))
    elif name == "unset-plugin-data":
        _delete(target.plugin_data, args["path"], prune=True)
    elif name == "set-port-attribute":
        _set(_port(target, args["port_id"]), args["path"], args["value"])
    elif name == "extend-port-attribute":
        _extend(_port(target, args["port_id"]), args["path"], args["value"], bool(args.get("unique")))
    elif name == "del-port-attribute":
        _delete(_port(target, args["port_id"]), args["path"])
    elif name == "api-call":
        await _api_call(args, session)


async def _api_call(args: Mapping[str, Any], session: aiohttp.ClientSession | None) -> None:
    """GET ``url``, retrying 429 and 5xx answers with backoff, as Ironic's api-call action."""
    retries, backoff = int(args.get("retries", 3)), float(args.get("backoff_factor", 0.3))
    timeout = aiohttp.ClientTimeout(total=float(args.get("timeout", 5)))
    own = session is None
    client = session or aiohttp.ClientSession()
    try:
        for attempt in range(retries + 1):
            async with client.get(str(args["url"]), headers=args.get("headers"), timeout=timeout) as response:
                if response.status < 400:
                    return
                if response.status not in (429, 500, 502, 503, 504) or attempt == retries:
                    raise InspectionRuleFailure(f"api-call to {args['url']} answered {response.status}")
            await asyncio.sleep(backoff * (2**attempt))
    finally:
        if own:
            await client.close()
