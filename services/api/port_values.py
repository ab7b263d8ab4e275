"""A port's writable values and the checks on them, shared by REST
(POST/PATCH /v1/ports) and the native gRPC API."""

from __future__ import annotations

from typing import Any

from services.api.validators import normalize_mac
from services.common import errors
from services.common.db.nodes import is_uuid

PORT_CREATE_KEYS = {
    "address",
    "node_uuid",
    "extra",
    "pxe_enabled",
    "local_link_connection",
    "physical_network",
    "uuid",
    "is_smartnic",
    "portgroup_uuid",
    "name",
    "description",
    "vendor",
    "category",
    "available_for_dynamic_portgroup",
}
# Ironic's PORT_SCHEMA lengths for the free-text fields of 1.97, 1.100 and 1.101.
PORT_TEXT_LIMITS = {"description": 255, "vendor": 32, "category": 80}
VTEP_REMOVED = (1, 105)  # Ironic removed the OVN VTEP form again
LOCAL_LINK_KEYS = ("port_id", "switch_id", "hostname", "switch_info", "network_type")
# An OVN VTEP switch's port (1.90): port_id with both of these instead of switch_id.
VTEP_KEYS = ("vtep-logical-switch", "vtep-physical-switch")
VTEP_SINCE = (1, 90)
NAME_MAX = 255


def check_local_link_connection(llc: dict[str, Any], version: tuple[int, int] | None) -> None:
    """Ironic's LOCAL_LINK_CONN_SCHEMA: string values of known keys, and either
    empty, port_id with switch_id, port_id with hostname (smart NIC), or
    network_type "unmanaged" (1.64) alone; network_type is "managed" or "unmanaged"."""
    vtep = [k for k in VTEP_KEYS if k in llc]
    if vtep and (version is None or version >= VTEP_REMOVED):
        # 1.105 removed what 1.90 added; None is the native gRPC API, which speaks the newest semantics.
        raise errors.InvalidParameterValue(
            "Invalid local_link_connection: OVN VTEP switches (vtep-logical-switch, vtep-physical-switch) "
            "are not supported from API version 1.105"
        )
    if vtep:
        check_vtep_connection(llc, version)
        return
    unknown = set(llc) - set(LOCAL_LINK_KEYS)
    if unknown:
        raise errors.InvalidParameterValue(
            f"Invalid local_link_connection: unexpected keys {sorted(unknown)}; allowed are {', '.join(LOCAL_LINK_KEYS)}"
        )
    for key, value in llc.items():
        if not isinstance(value, str):
            raise errors.InvalidParameterValue(f"Invalid local_link_connection: {key} must be a string")
    if "network_type" in llc:
        if version is not None and version < (1, 64):  # None: the native gRPC API, not versioned
            raise errors.NotAcceptable("network_type in local_link_connection requires API version 1.64 or newer")
        if llc["network_type"] not in ("managed", "unmanaged"):
            raise errors.InvalidParameterValue(
                f"Invalid local_link_connection: network_type must be 'managed' or 'unmanaged', not {llc['network_type']!r}"
            )
    if llc and not (
        llc.get("network_type") == "unmanaged" or ("port_id" in llc and ("switch_id" in llc or "hostname" in llc))
    ):
        raise errors.InvalidParameterValue(
            "Invalid local_link_connection: it needs port_id and switch_id, port_id and hostname (smart NIC), "
            "or network_type 'unmanaged'"
        )


def check_vtep_connection(llc: dict[str, Any], version: tuple[int, int] | None) -> None:
    """Ironic's OVN VTEP schema (1.90): exactly port_id, vtep-logical-switch and
    vtep-physical-switch, all strings; 406 below 1.90."""
    if version is not None and version < VTEP_SINCE:
        raise errors.NotAcceptable(
            f"vtep-logical-switch and vtep-physical-switch in local_link_connection require API version "
            f"{VTEP_SINCE[0]}.{VTEP_SINCE[1]} or newer"
        )
    wanted = {"port_id", *VTEP_KEYS}
    if set(llc) != wanted or not all(isinstance(v, str) and v for v in llc.values()):
        raise errors.InvalidParameterValue(
            "Invalid local_link_connection: an OVN VTEP switch port needs exactly port_id, "
            "vtep-logical-switch and vtep-physical-switch, each a non-empty string"
        )


def validate_port_values(values: dict[str, Any], version: tuple[int, int] | None = None) -> dict[str, Any]:
    """Checked values with the MAC normalised; ``version`` None is the unversioned gRPC API."""
    out = dict(values)
    if "address" in out:
        out["address"] = normalize_mac(out["address"])
    for key in ("extra", "local_link_connection"):
        if key in out and not isinstance(out[key], dict):
            raise errors.InvalidParameterValue(f"{key} must be a JSON object")
    if "local_link_connection" in out:
        check_local_link_connection(out["local_link_connection"], version)
    name = out.get("name")
    if name is not None and (not isinstance(name, str) or not 1 <= len(name) <= NAME_MAX):
        raise errors.InvalidParameterValue(f"Invalid port name {name!r}: a string of 1 to {NAME_MAX} characters")
    if "pxe_enabled" in out and not isinstance(out["pxe_enabled"], bool):
        raise errors.InvalidParameterValue("pxe_enabled must be a boolean")
    if "is_smartnic" in out and not isinstance(out["is_smartnic"], bool):
        raise errors.InvalidParameterValue("is_smartnic must be a boolean")
    for key, limit in PORT_TEXT_LIMITS.items():
        value = out.get(key)
        if value is not None and (not isinstance(value, str) or len(value) > limit):
            raise errors.InvalidParameterValue(f"{key} must be a string of at most {limit} characters")
    if "available_for_dynamic_portgroup" in out and not isinstance(out["available_for_dynamic_portgroup"], bool):
        raise errors.InvalidParameterValue("available_for_dynamic_portgroup must be a boolean")
    if out.get("physical_network") is not None and not isinstance(out["physical_network"], str):
        raise errors.InvalidParameterValue("physical_network must be a string")
    if "node_uuid" in out and (not isinstance(out["node_uuid"], str) or not is_uuid(out["node_uuid"])):
        raise errors.InvalidParameterValue(f"Expected a UUID for node_uuid but received {out['node_uuid']}.")
    if "uuid" in out and (not isinstance(out["uuid"], str) or not is_uuid(out["uuid"])):
        raise errors.InvalidParameterValue(f"Expected a UUID but received {out['uuid']}.")
    return out
