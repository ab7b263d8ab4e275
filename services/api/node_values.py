"""A node's writable values and the checks on them, shared by REST
(POST/PATCH /v1/nodes) and the native gRPC API, so both accept and refuse
exactly the same things."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any, cast

from services.api.network_data import validate_network_data
from services.api.validators import is_valid_name
from services.common import errors, states
from services.common.boot_values import UnsafeValue, check_node_boot_values
from services.common.db.nodes import INTERFACE_FIELDS, NodeRepository, is_uuid
from services.common.db.records import NodeRecord
from services.common.jsonutil import parse_datetimes

NODE_CREATE_KEYS = {
    "uuid",
    "name",
    "driver",
    "driver_info",
    "properties",
    "instance_info",
    "extra",
    "chassis_uuid",
    "resource_class",
    "conductor_group",
    "owner",
    "lessee",
    "description",
    "automated_clean",
    "network_data",
    "protected",
    "protected_reason",
    "retired",
    "retired_reason",
    "shard",
    "parent_node",
    "disable_power_off",
    "instance_name",
    *INTERFACE_FIELDS,
}
NODE_DICT_FIELDS = ("driver_info", "properties", "instance_info", "extra", "network_data")
NODE_READONLY = {
    "uuid",
    "created_at",
    "updated_at",
    "links",
    "provision_state",
    "target_provision_state",
    "power_state",
    "target_power_state",
    "reservation",
    "provision_updated_at",
    "last_error",
    "driver_internal_info",
    "maintenance_reason",
    "console_enabled",
    "inspection_started_at",
    "inspection_finished_at",
    "clean_step",
    "deploy_step",
    "service_step",
    "raid_config",
    "target_raid_config",
    "traits",
    "fault",
    "conductor",
    "allocation_uuid",
    "ports",
    "states",
    "portgroups",
    "volume",
    "boot_mode",
    "secure_boot",
    "health",
}
NODE_TIMESTAMPS = (
    "created_at",
    "updated_at",
    "provision_updated_at",
    "inspection_started_at",
    "inspection_finished_at",
    "reservation_expires_at",
)


def node_from_json(text: str) -> NodeRecord:
    """The node row a conductor sent back (``node_json``: the whole record, as
    ``dumps`` wrote it), with its timestamps datetimes again."""
    return cast(NodeRecord, parse_datetimes(json.loads(text), NODE_TIMESTAMPS))


def checked_node_changes(node: NodeRecord, changes: dict[str, Any]) -> dict[str, Any]:
    """A node patch's changes, checked against the node's state (REST PATCH and gRPC PatchNode alike)."""
    if (
        node["target_provision_state"]
        and node["provision_state"] not in states.PATCH_ALLOWED_WITH_TARGET
        and not (node["maintenance"] and set(changes) == {"instance_uuid"})
    ):
        raise errors.InvalidState(f"Node {node['uuid']} can not be updated while a state transition is in progress.")
    values = validate_node_values(changes, create=False)
    if "maintenance" in values and not values["maintenance"]:
        # Ironic's update_node: leaving maintenance by PATCH clears the reason and the fault.
        values["maintenance_reason"] = None
        values["fault"] = None
    if values.get("retired") and node["provision_state"] == states.AVAILABLE:
        # Ironic (1.61): an available node is moved to manageable before it is retired.
        raise errors.InvalidState(
            f"Cannot set retired=True for node {node['uuid']} in state {node['provision_state']}; "
            "move it to manageable first"
        )
    if values.get("protected") and node["provision_state"] not in (states.ACTIVE, states.RESCUE):
        raise errors.InvalidState(
            f"Node {node['uuid']} can only be made protected in provision states 'active' or 'rescue', "
            f"the current state is '{node['provision_state']}'"
        )
    for flag in ("protected", "retired"):
        _clear_reason_with_flag(node, values, flag)
    _sync_instance_name(node, values)
    return values


def _sync_instance_name(node: NodeRecord, values: dict[str, Any]) -> None:
    """Ironic 1.104: a changed ``instance_info`` with a ``display_name`` (what Nova
    writes) fills ``instance_name`` when the node has none and the same patch
    does not set it; a name set on its own is never overwritten this way."""
    if "instance_info" not in values or "instance_name" in values or node.get("instance_name"):
        return
    display = (values["instance_info"] or {}).get("display_name")
    if isinstance(display, str) and 1 <= len(display) <= 255:
        values["instance_name"] = display


async def linked_parent(nodes: NodeRepository, node: Mapping[str, Any], ident: str) -> str:
    """The UUID of the parent a node names (by UUID or name, REST 1.83), as Ironic's
    ``authorize_node_link``: a parent that does not exist or has another owner is
    the same 400, so nothing tells which. A node cannot be its own parent (Ferrum's
    check; Ironic stores it, and the node then hides itself from the list).
    ``node`` is a stored node or the values of one being created."""
    refused = errors.InvalidParameterValue(
        f"Unable to apply the requested parent_node '{ident}'. Requested value was invalid."
    )
    try:
        parent = await nodes.get_by_ident(ident)
    except errors.NotFound:
        raise refused from None
    if parent.get("owner") != node.get("owner") or str(parent["uuid"]) == str(node.get("uuid")):
        raise refused
    return str(parent["uuid"])


def _clear_reason_with_flag(node: NodeRecord, values: dict[str, Any], flag: str) -> None:
    """Ironic keeps a ``<flag>_reason`` only while the flag is set: unsetting the
    flag clears it, and a reason for an unset flag is a 400."""
    reason = f"{flag}_reason"
    if flag in values and not values[flag]:
        values[reason] = None
    if values.get(reason) and not values.get(flag, node.get(flag)):
        raise errors.InvalidParameterValue(f"The {reason} field can only be set when {flag} is True")


def validate_node_values(values: dict[str, Any], *, create: bool) -> dict[str, Any]:
    """Checked and normalised values (null flags to their defaults); 400 for the first bad one."""
    out = dict(values)
    if create and not isinstance(values.get("driver"), str):
        raise errors.InvalidParameterValue("Mandatory field missing: 'driver'")
    for key in NODE_DICT_FIELDS:
        if key in out and not isinstance(out[key], dict):
            if out[key] is None and not create:
                out[key] = {}
            else:
                raise errors.InvalidParameterValue(f"{key} must be a JSON object")
    if "network_data" in out:
        validate_network_data(out["network_data"])
    if "driver_info" in out or "instance_info" in out:
        # What the iPXE renderer would refuse can never boot: refused now, by the renderer's own rules.
        try:
            check_node_boot_values(out.get("driver_info"), out.get("instance_info"))
        except UnsafeValue as exc:
            raise errors.InvalidParameterValue(str(exc)) from None
    if out.get("name") is not None:
        name = out["name"]
        if not is_valid_name(name):
            raise errors.InvalidParameterValue(
                f"Cannot use name '{name}': names may contain only RFC 3986 unreserved characters and must not be a UUID."
            )
    for key in ("uuid", "instance_uuid", "chassis_uuid"):
        if out.get(key) is not None and (not isinstance(out[key], str) or not is_uuid(out[key])):
            raise errors.InvalidParameterValue(f"Expected a UUID for {key} but received {out[key]}.")
    for key in (
        "driver",
        "resource_class",
        "conductor_group",
        "owner",
        "lessee",
        "description",
        "protected_reason",
        "retired_reason",
        "shard",
        "parent_node",
        "instance_name",
        *INTERFACE_FIELDS,
    ):
        if key in out and out[key] is not None and not isinstance(out[key], str):
            raise errors.InvalidParameterValue(f"{key} must be a string")
    if out.get("conductor_group") is not None and not re.match(r"^[A-Za-z0-9_\-.]*$", out["conductor_group"]):
        raise errors.InvalidParameterValue("conductor_group may contain letters, digits, _, - and . only")
    if out.get("resource_class") is not None and len(out["resource_class"]) > 80:
        raise errors.InvalidParameterValue("resource_class is longer than 80 characters")
    if out.get("conductor_group") is not None and len(out["conductor_group"]) > 255:
        raise errors.InvalidParameterValue("conductor_group is longer than 255 characters")
    if out.get("parent_node") is not None and len(out["parent_node"]) > 36:
        raise errors.InvalidParameterValue("parent_node is longer than 36 characters")
    if out.get("instance_name") is not None and not 1 <= len(out["instance_name"]) <= 255:
        raise errors.InvalidParameterValue("instance_name must be 1 to 255 characters long")
    if out.get("shard") is not None and len(out["shard"]) > 255:
        raise errors.InvalidParameterValue("shard is longer than 255 characters")
    if out.get("description") is not None and len(out["description"]) > 4096:
        raise errors.InvalidParameterValue("description is longer than 4096 characters")
    for key in ("automated_clean", "protected", "retired", "maintenance", "disable_power_off"):
        if key in out and out[key] is not None and not isinstance(out[key], bool):
            raise errors.InvalidParameterValue(f"{key} must be a boolean")
    if "conductor_group" in out and out["conductor_group"] is None:
        out["conductor_group"] = ""
    for key in (
        "protected",
        "retired",
        "maintenance",
        "disable_power_off",
    ):  # NOT NULL flags: null means the default, false
        if key in out and out[key] is None:
            out[key] = False
    return out
