"""Checks on a provision request's optional parts (config drive, clean and
deploy steps, rescue password, disable_ramdisk), shared by REST
``PUT .../states/provision`` and gRPC ``SetProvisionState``."""

from __future__ import annotations

import re
import uuid
from typing import Any, Protocol

from services.common import errors
from services.common.conductor_messages import is_step_order

DEPLOY_STEP_INTERFACES = ("bios", "deploy", "firmware", "management", "power", "raid")


def check_deploy_steps(deploy_steps: Any, verb: str, version: tuple[int, int]) -> list[dict[str, Any]]:
    """Ironic's deploy_steps (1.69): only with active/rebuild, each step
    {interface, step, args, priority}. Whether the node offers the step is the
    conductor's check (400 there too)."""
    if not deploy_steps:
        return []
    if version < (1, 69):
        raise errors.NotAcceptable("Request not acceptable. The minimal required API version should be 1.69")
    if verb not in ("active", "rebuild"):
        raise errors.InvalidParameterValue(
            '"deploy_steps" is only valid when setting target provision state to active or rebuild'
        )
    if not isinstance(deploy_steps, list):
        raise errors.InvalidParameterValue("deploy_steps must be a list of steps")
    for step in deploy_steps:
        if (
            not isinstance(step, dict)
            or set(step) != {"interface", "step", "args", "priority"}
            or step["interface"] not in DEPLOY_STEP_INTERFACES
            or not isinstance(step["step"], str)
            or not step["step"]
            or not isinstance(step["args"], dict)
            or isinstance(step["priority"], bool)
            or not isinstance(step["priority"], int)
            or not 0 <= step["priority"] <= 2**31 - 1
        ):
            raise errors.InvalidParameterValue(
                f'Invalid deploy step {step!r}: expected {{"interface": one of {", ".join(DEPLOY_STEP_INTERFACES)}, '
                '"step": name, "args": object, "priority": integer >= 0}'
            )
    keys = [(s["interface"], s["step"]) for s in deploy_steps]
    if len(set(keys)) != len(keys):
        raise errors.InvalidParameterValue("Duplicate deploy steps: each interface and step may appear once")
    return deploy_steps


CHILD_STEP_KEYS = {"execute_on_child_nodes", "limit_child_node_execution"}
CLEAN_STEP_KEYS = {"interface", "step", "args", "order", *CHILD_STEP_KEYS}


def _child_keys_problem(step: dict[str, Any]) -> str | None:
    """Ironic's clean and service step schema (with parent_node, API 1.83, but not
    gated by version): ``execute_on_child_nodes`` a boolean, and with it true,
    ``limit_child_node_execution`` a list of node UUIDs (which children run the
    step; the conductor skips one that is not a child of the node)."""
    run_on_children = step.get("execute_on_child_nodes", False)
    limit = step.get("limit_child_node_execution", [])
    if not isinstance(run_on_children, bool):
        return "execute_on_child_nodes must be a boolean"
    if not _is_string_list(limit):
        return "limit_child_node_execution must be a list of node UUIDs"
    if run_on_children:
        bad = [ident for ident in limit if not _is_uuid(ident)]
        if bad:
            return f"limit_child_node_execution must list node UUIDs, not {', '.join(bad)}"
    return None


def _is_uuid(value: str) -> bool:
    try:
        uuid.UUID(value)
    except ValueError:
        return False
    return True


def check_clean_steps(clean_steps: Any, verb: str) -> list[dict[str, Any]] | None:
    """clean_steps: required with ``clean`` and refused with any other verb;
    each step names its interface and step (args and order optional; order as
    Ironic's step schema has it: an integer >= 0 or a string of digits), and
    may be for the node's children (``execute_on_child_nodes``, as service steps)."""
    if clean_steps is not None and verb != "clean":
        raise errors.InvalidParameterValue('"clean_steps" is only valid when setting target provision state to clean')
    if verb == "clean" and not isinstance(clean_steps, list):
        raise errors.InvalidParameterValue('"clean_steps" is required when setting target provision state to clean')
    for step in clean_steps or ():
        if (
            not isinstance(step, dict)
            or not isinstance(step.get("interface"), str)
            or not isinstance(step.get("step"), str)
            or not isinstance(step.get("args", {}), dict)
            or set(step) - CLEAN_STEP_KEYS
            or not is_step_order(step.get("order", 0))
        ):
            raise errors.InvalidParameterValue(
                f'Invalid clean step {step!r}: expected {{"interface", "step", "args"?, "order"?: integer >= 0, '
                '"execute_on_child_nodes"?: boolean, "limit_child_node_execution"?: list of node UUIDs}'
            )
        problem = _child_keys_problem(step)
        if problem:
            raise errors.InvalidParameterValue(f"Invalid clean step {step!r}: {problem}")
    return clean_steps


SERVICE_STEP_INTERFACES = ("vendor", "power", "management", "firmware", "deploy", "bios", "raid")
SERVICE_STEP_KEYS = {"interface", "step", "args", "order", *CHILD_STEP_KEYS}


def _is_string_list(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(item, str) for item in value)


def check_service_steps(service_steps: Any, verb: str) -> list[dict[str, Any]] | None:
    """service_steps (1.87): required with ``service`` and refused with any other
    verb; Ironic's step schema (interface, step, args, order,
    execute_on_child_nodes, limit_child_node_execution; nothing else, so
    ``priority`` is refused). Whether the node offers each step is the
    conductor's check (400 there too)."""
    if service_steps is not None and verb != "service":
        raise errors.InvalidParameterValue(
            '"service_steps" is only valid when setting target provision state to service'
        )
    if verb != "service":
        return None
    if not isinstance(service_steps, list) or not service_steps:
        raise errors.InvalidParameterValue('"service_steps" is required when setting target provision state to service')
    for step in service_steps:
        if (
            not isinstance(step, dict)
            or step.get("interface") not in SERVICE_STEP_INTERFACES
            or not isinstance(step.get("step"), str)
            or not step["step"]
            or not isinstance(step.get("args", {}), dict)
            or set(step) - SERVICE_STEP_KEYS
            or not is_step_order(step.get("order", 0))
            or not isinstance(step.get("execute_on_child_nodes", False), bool)
            or not _is_string_list(step.get("limit_child_node_execution", []))
        ):
            raise errors.InvalidParameterValue(
                f"Invalid service_steps: {step!r} is not a step: expected "
                f'{{"interface": one of {", ".join(SERVICE_STEP_INTERFACES)}, "step": name, "args"?: object, '
                '"order"?: integer >= 0, "execute_on_child_nodes"?: boolean, '
                '"limit_child_node_execution"?: list of node UUIDs}'
            )
        problem = _child_keys_problem(step)
        if problem:
            raise errors.InvalidParameterValue(f"Invalid service_steps: {step!r}: {problem}")
    return service_steps


class NodeLookup(Protocol):
    async def get(self, node_uuid: str) -> Any: ...


async def check_child_step_nodes(nodes: NodeLookup, steps: list[Any] | None) -> None:
    """Every UUID a step for the children lists must be a node (404 otherwise), as
    Ironic looks each up when the step is requested. Whether it is a child of this
    node is the conductor's business when the step runs: one that is not is skipped."""
    for step in steps or ():
        if not isinstance(step, dict) or step.get("execute_on_child_nodes") is not True:
            continue
        limit = step.get("limit_child_node_execution")
        for ident in limit if isinstance(limit, list) else ():
            if isinstance(ident, str) and _is_uuid(ident):  # anything else is refused as malformed
                await nodes.get(ident)


def check_rescue_password(password: Any, verb: str) -> None:
    """rescue_password: a non-empty string with ``rescue``, nothing with any other verb."""
    if password is not None and verb != "rescue":
        raise errors.InvalidParameterValue(
            '"rescue_password" is only valid when setting target provision state to rescue'
        )
    if verb == "rescue" and not (isinstance(password, str) and password.strip()):
        raise errors.InvalidParameterValue(
            'A non-empty "rescue_password" is required when setting target provision state to rescue'
        )


DISABLE_RAMDISK_SINCE = {"clean": (1, 70), "service": (1, 108)}


def check_disable_ramdisk(value: Any, verb: str, version: tuple[int, int]) -> bool:
    """disable_ramdisk: a boolean, for manual cleaning (1.70) or servicing (1.108)
    only, as Ironic's check_allow_disable_ramdisk: too old a version is a 406,
    another verb a 400."""
    if value is None:
        return False
    if version < (1, 70):
        raise errors.NotAcceptable("disable_ramdisk is not acceptable in this API version (1.70 or newer)")
    if not isinstance(value, bool):
        raise errors.InvalidParameterValue("disable_ramdisk must be a boolean")
    if verb not in DISABLE_RAMDISK_SINCE:
        raise errors.InvalidParameterValue("disable_ramdisk is supported only with manual cleaning or servicing")
    since = DISABLE_RAMDISK_SINCE[verb]
    if version < since:
        raise errors.NotAcceptable(
            f"disable_ramdisk is not acceptable in this API version ({since[0]}.{since[1]} or newer for {verb})"
        )
    return value


def check_configdrive(configdrive: Any, verb: str, version: tuple[int, int]) -> None:
    """CONTRACT.md 3.1; the full builder and storage arrive with the config drive issue."""
    if not configdrive:
        return
    if verb not in ("active", "rebuild") or (verb == "rebuild" and version < (1, 35)):
        raise errors.ConfigDriveInvalid(
            "Adding a config drive is only supported when setting provision state to active, rebuild"
        )
    if isinstance(configdrive, dict):
        if version < (1, 56):
            raise errors.ConfigDriveInvalid("Invalid configdrive format: a dictionary needs API version 1.56")
        extra = set(configdrive) - {"meta_data", "network_data", "user_data", "vendor_data"}
        if extra:
            raise errors.ConfigDriveInvalid(f"Invalid configdrive format: unexpected keys {sorted(extra)}")
        if "vendor_data" in configdrive and version < (1, 59):
            raise errors.ConfigDriveInvalid("Invalid configdrive format: vendor_data needs API version 1.59")
        for key in ("meta_data", "network_data", "vendor_data"):
            if key in configdrive and not isinstance(configdrive[key], dict):
                raise errors.ConfigDriveInvalid(f"Invalid configdrive format: {key} must be an object")
        return
    if not isinstance(configdrive, str):
        raise errors.ConfigDriveInvalid("Invalid configdrive format: expected a string or an object")
    if "://" in configdrive:
        return
    if not re.fullmatch(r"[A-Za-z0-9+/=\s]+", configdrive):
        raise errors.ConfigDriveInvalid(
            "Invalid configdrive format: it is neither a JSON, nor a URL, nor a base64 string"
        )
