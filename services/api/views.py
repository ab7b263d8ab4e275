"""Rendering stored rows as Ironic API documents, version-gated and masked
(secrets at any depth and credentials in URLs: :mod:`services.common.secret_masking`)."""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

from services.common import errors, states
from services.common.db.records import NodeRecord
from services.common.db.rows import iso
from services.common.secret_masking import MASK, mask_dict, mask_text, mask_value

INSTANCE_SECRETS = ("configdrive", "image_url")  # masked whole whenever set, as Ironic does

# Field -> microversion it appeared in (CONTRACT.md 1.5), for fields Ferrum stores.
NODE_FIELD_VERSIONS: dict[str, tuple[int, int]] = {
    "uuid": (1, 1),
    "created_at": (1, 1),
    "updated_at": (1, 1),
    "links": (1, 1),
    "driver": (1, 1),
    "driver_info": (1, 1),
    "properties": (1, 1),
    "instance_info": (1, 1),
    "instance_uuid": (1, 1),
    "extra": (1, 1),
    "chassis_uuid": (1, 1),
    "power_state": (1, 1),
    "target_power_state": (1, 1),
    "provision_state": (1, 1),
    "target_provision_state": (1, 1),
    "provision_updated_at": (1, 1),
    "maintenance": (1, 1),
    "maintenance_reason": (1, 1),
    "last_error": (1, 1),
    "reservation": (1, 1),
    "console_enabled": (1, 1),
    "driver_internal_info": (1, 3),
    "name": (1, 5),
    "inspection_started_at": (1, 6),
    "inspection_finished_at": (1, 6),
    "clean_step": (1, 7),
    "raid_config": (1, 12),
    "target_raid_config": (1, 12),
    "network_interface": (1, 20),
    "resource_class": (1, 21),
    "boot_interface": (1, 31),
    "console_interface": (1, 31),
    "deploy_interface": (1, 31),
    "inspect_interface": (1, 31),
    "management_interface": (1, 31),
    "power_interface": (1, 31),
    "raid_interface": (1, 31),
    "vendor_interface": (1, 31),
    "storage_interface": (1, 33),
    "traits": (1, 37),
    "rescue_interface": (1, 38),
    "bios_interface": (1, 40),
    "fault": (1, 42),
    "deploy_step": (1, 44),
    "conductor_group": (1, 46),
    "automated_clean": (1, 47),
    "protected": (1, 48),
    "protected_reason": (1, 48),
    "conductor": (1, 49),
    "owner": (1, 50),
    "description": (1, 51),
    "allocation_uuid": (1, 52),
    # Stored already; hidden (and 406 in fields/create/patch) until the maximum reaches them.
    "retired": (1, 61),
    "retired_reason": (1, 61),
    "lessee": (1, 65),
    "network_data": (1, 66),
    "boot_mode": (1, 75),
    "secure_boot": (1, 75),
    "shard": (1, 82),
    "parent_node": (1, 83),
    "firmware_interface": (1, 86),
    "service_step": (1, 87),
    "disable_power_off": (1, 95),
    "instance_name": (1, 104),
    "health": (1, 109),
}
NODE_LIST_FIELDS = ("instance_uuid", "maintenance", "power_state", "provision_state", "uuid", "name")
PORT_FIELD_VERSIONS: dict[str, tuple[int, int]] = {
    "uuid": (1, 1),
    "address": (1, 1),
    "node_uuid": (1, 1),
    "extra": (1, 1),
    "created_at": (1, 1),
    "updated_at": (1, 1),
    "links": (1, 1),
    "internal_info": (1, 18),
    "local_link_connection": (1, 19),
    "pxe_enabled": (1, 19),
    "portgroup_uuid": (1, 24),
    "physical_network": (1, 34),
    "is_smartnic": (1, 53),
    "name": (1, 88),
    "description": (1, 97),
    "vendor": (1, 100),
    "category": (1, 101),
    "available_for_dynamic_portgroup": (1, 111),
}
PORT_LIST_FIELDS = ("uuid", "address")
_TIMESTAMPS = ("created_at", "updated_at", "provision_updated_at", "inspection_started_at", "inspection_finished_at")


def mask_secrets(info: dict[str, Any] | None) -> dict[str, Any]:
    """driver_info, driver_internal_info: every secret at any depth (the key rule that also encrypts
    them at rest, services/common/secret_keys.py; :mod:`services.common.secret_masking`)."""
    return mask_dict(info or {})


def mask_instance_info(info: dict[str, Any] | None) -> dict[str, Any]:
    """instance_info: secrets at any depth, and the config drive and image URL whole."""
    masked = mask_dict(info or {})
    for key in INSTANCE_SECRETS:
        if masked.get(key):
            masked[key] = MASK
    return masked


def links(base: str, resource: str, ident: str) -> list[dict[str, str]]:
    return [
        {"href": f"{base}/v1/{resource}/{ident}", "rel": "self"},
        {"href": f"{base}/{resource}/{ident}", "rel": "bookmark"},
    ]


def check_fields(fields: Iterable[str], known: dict[str, tuple[int, int]], version: tuple[int, int]) -> list[str]:
    """Validate ?fields=: unknown -> 400, too new for the version -> 406."""
    result = []
    for name in fields:
        if name not in known:
            raise errors.InvalidParameterValue(f'Field(s) "{name}" are not valid')
        if known[name] > version:
            raise errors.NotAcceptable(f"Field {name} is not supported at API version {version[0]}.{version[1]}")
        result.append(name)
    return result


class ShownNode(NodeRecord, total=False):
    """A node row as the REST API shows it: with ``allocation_uuid`` (1.52), which
    ``NodesApi.with_allocations`` adds where a request needs it."""

    allocation_uuid: str | None


# How node_document renders each field; anything not named here is copied as stored.
_PLAIN, _LINKS, _TIME, _MASKED, _INSTANCE, _ERROR, _BOOL, _CONDUCTOR, _STEP = range(9)
_NODE_FIELD_KINDS = {
    "links": _LINKS,
    **dict.fromkeys(_TIMESTAMPS, _TIME),
    "driver_info": _MASKED,
    "driver_internal_info": _MASKED,
    "instance_info": _INSTANCE,
    "last_error": _ERROR,
    "console_enabled": _BOOL,
    "conductor": _CONDUCTOR,
    **dict.fromkeys(("clean_step", "deploy_step", "service_step"), _STEP),
}


# The links a full node document carries to its sub-resources, with the version that added each.
_NODE_SUBRESOURCES = (("ports", (1, 1)), ("states", (1, 14)), ("portgroups", (1, 24)), ("volume", (1, 32)))


class _NodePlan(NamedTuple):
    """How ``node_document`` renders the fields shown at one version."""

    keys: tuple[str, ...]  # every field shown, in document order
    special: tuple[tuple[str, int], ...]  # the fields not copied as stored, with how each is rendered
    subresources: tuple[str, ...]  # the sub-resource links of a full document


@functools.cache
def _node_plan(version: tuple[int, int]) -> _NodePlan:
    """The fields shown at ``version`` and how each is rendered, worked out once
    per version: a list of 200 nodes otherwise repeats the version check and
    the dispatch for all ~70 fields of every node (issue 22's list profile)."""
    keys = tuple(key for key, since in NODE_FIELD_VERSIONS.items() if since <= version)
    return _NodePlan(
        keys=keys,
        special=tuple((key, _NODE_FIELD_KINDS[key]) for key in keys if key in _NODE_FIELD_KINDS),
        subresources=tuple(name for name, since in _NODE_SUBRESOURCES if version >= since),
    )


def node_document(
    row: NodeRecord,
    *,
    base: str,
    version: tuple[int, int],
    fields: Iterable[str] | None = None,
    conductor: str | None = None,
    full: bool = True,
) -> dict[str, Any]:
    """One node as Ironic returns it at ``version``.

    Every shown field is first copied as stored, in document order, then the
    dozen that need rendering are replaced in place, which keeps their position:
    an enrolled node's document at 1.78 took 11.8-12.9 us against 13.5-14.5 us
    for a loop that dispatched on every field (min-median of interleaved timeit
    runs, issue 22). The list's other costs are the collector
    (:func:`services.runtime.freeze_startup_heap`), decoding and JSON.
    """
    plan = _node_plan(version)
    columns: Mapping[str, Any] = row  # the plan reads columns by name
    get = columns.get
    # chassis_uuid, allocation_uuid (NodesApi.with_allocations), ... are shown as stored.
    doc: dict[str, Any] = {key: get(key) for key in plan.keys}
    for key, kind in plan.special:
        if kind == _TIME:
            value = doc[key]
            if value is not None:
                doc[key] = value.isoformat()
        elif kind == _LINKS:
            doc[key] = links(base, "nodes", row["uuid"])
        elif kind == _MASKED:
            doc[key] = mask_secrets(columns[key])
        elif kind == _INSTANCE:
            doc[key] = mask_instance_info(columns[key])
        elif kind == _ERROR:
            last_error = doc[key]
            if last_error:
                doc[key] = mask_text(last_error)
        elif kind == _BOOL:
            doc[key] = bool(doc[key])
        elif kind == _CONDUCTOR:
            doc[key] = conductor
        else:  # _STEP: step arguments may carry passwords
            step = doc[key]
            doc[key] = mask_value(step) if step else {}
    if "provision_state" in doc:
        doc["provision_state"] = provision_state_for_version(doc["provision_state"], version)
    if full:
        own, bookmark = f"{base}/v1/nodes/{row['uuid']}/", f"{base}/nodes/{row['uuid']}/"
        for name in plan.subresources:
            doc[name] = [{"href": own + name, "rel": "self"}, {"href": bookmark + name, "rel": "bookmark"}]
    if fields is not None:
        wanted = set(fields) | {"links"}
        doc = {k: v for k, v in doc.items() if k in wanted}
    return doc


def provision_state_for_version(state: str | None, version: tuple[int, int]) -> str | None:
    """Ironic's update_state_in_older_versions, for the node and its /states alike:
    ``available`` is shown as None (NOSTATE) below 1.2, ``inspect wait`` as
    ``inspecting`` below 1.39."""
    if version < (1, 2) and state == states.AVAILABLE:
        return None
    if version < (1, 39) and state == states.INSPECTWAIT:
        return states.INSPECTING
    return state


def node_states_document(row: NodeRecord, version: tuple[int, int]) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "console_enabled": bool(row.get("console_enabled")),
        "last_error": mask_text(row["last_error"]) if row["last_error"] else row["last_error"],
        "power_state": row["power_state"],
        "provision_state": provision_state_for_version(row["provision_state"], version),
        "provision_updated_at": iso(row["provision_updated_at"]),
        "target_power_state": row["target_power_state"],
        "target_provision_state": row["target_provision_state"],
    }
    if version >= (1, 12):
        doc["raid_config"] = row["raid_config"]
        doc["target_raid_config"] = row["target_raid_config"]
    if version >= (1, 75):
        doc["boot_mode"] = row.get("boot_mode")
        doc["secure_boot"] = row.get("secure_boot")
    return doc


def port_document(
    row: Mapping[str, Any],  # a PortRecord, with portgroup_uuid where ports.with_portgroup_uuids added it
    *,
    base: str,
    version: tuple[int, int],
    fields: Iterable[str] | None = None,
) -> dict[str, Any]:
    doc: dict[str, Any] = {}
    for key, since in PORT_FIELD_VERSIONS.items():
        if since > version:
            continue
        if key == "links":
            doc[key] = links(base, "ports", row["uuid"])
        elif key in ("created_at", "updated_at"):
            doc[key] = iso(row.get(key))
        elif key == "portgroup_uuid":
            doc[key] = row.get("portgroup_uuid")  # filled in by ports.with_portgroup_uuids
        else:
            doc[key] = row.get(key)
    if fields is not None:
        doc = {k: v for k, v in doc.items() if k in set(fields) | {"links"}}
    return doc
