"""A node's RAID configuration (API 1.12): the shape Ironic's RAID schema
(``ironic/drivers/raid_config_schema.json``) allows, checked by hand, and the
helpers the raid interfaces share.

The schema is data here (``LOGICAL_DISK_PROPERTIES``): its descriptions are
what ``GET /v1/drivers/{d}/raid/logical_disk_properties`` shows, and its
rules are checked by :func:`validate`. ``jsonschema`` is not one of Ferrum's
dependencies, and this schema is small and flat, so a hand check that names
the disk and the property beats pulling in a validator for it.

A configuration is ``{"logical_disks": [disk, ...]}`` with at least one
disk; each disk needs ``raid_level`` and ``size_gb`` and may carry only the
properties below; ``physical_disks`` needs ``controller``; at most one disk
is the root volume.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from services.common import errors, node_capabilities

RAID_LEVELS = ("JBOD", "0", "1", "2", "5", "6", "1+0", "5+0", "6+0")
DISK_TYPES = ("hdd", "ssd")
INTERFACE_TYPES = ("sata", "scsi", "sas")
MAX_SIZE = "MAX"

LOGICAL_DISK_PROPERTIES: Mapping[str, str] = {
    "raid_level": "RAID level for the logical disk. Valid values are 'JBOD', '0', '1', '2', '5', '6', '1+0', "
    "'5+0' and '6+0'. Required.",
    "size_gb": "Size in GiB (Integer) for the logical disk. Use 'MAX' as size_gb if this logical disk is "
    "supposed to use the rest of the space available. Required.",
    "volume_name": "Name of the volume to be created. If this is not specified, it will be auto-generated. Optional.",
    "is_root_volume": "Specifies whether this disk is a root volume. By default, this is False. Optional.",
    "share_physical_disks": "Specifies whether other logical disks can share physical disks with this logical "
    "disk. By default, this is False. Optional.",
    "disk_type": "The type of disk preferred. Valid values are 'hdd' and 'ssd'. If this is not specified, disk "
    "type will not be a selection criterion for choosing backing physical disks. Optional.",
    "interface_type": "The interface type of disk. Valid values are 'sata', 'scsi' and 'sas'. If this is not "
    "specified, interface type will not be a selection criterion for choosing backing physical disks. Optional.",
    "number_of_physical_disks": "Number of physical disks to use for this logical disk. By default, the driver "
    "uses the minimum number of disks required for that RAID level. Optional.",
    "controller": "Controller to use for this logical disk. If not specified, the driver will choose a suitable "
    "RAID controller on the bare metal node. Optional.",
    "physical_disks": "The physical disks to use for this logical disk. If not specified, the driver will choose "
    "suitable physical disks to use. Optional.",
}
REQUIRED = ("raid_level", "size_gb")


def logical_disk_properties() -> dict[str, str]:
    """Each property a logical disk may have, with its description."""
    return dict(LOGICAL_DISK_PROPERTIES)


def validate(config: Any) -> None:
    """InvalidParameterValue naming the first thing the schema refuses, or the
    second root volume, as Ironic's ``raid.validate_configuration``."""
    problem = _problem(config)
    if problem:
        raise errors.InvalidParameterValue(f"RAID config validation error: {problem}")
    roots = [d for d in config["logical_disks"] if d.get("is_root_volume")]
    if len(roots) > 1:
        raise errors.InvalidParameterValue(
            f"Raid config cannot have more than one root volume. {len(roots)} root volumes were specified"
        )


def _problem(config: Any) -> str:
    if not isinstance(config, dict):
        return f"{config!r:.100} is not of type 'object'"
    extra = sorted(set(config) - {"logical_disks"})
    if extra:
        return f"Additional properties are not allowed ({', '.join(map(repr, extra))} unexpected)"
    disks = config.get("logical_disks")
    if disks is None:
        return "'logical_disks' is a required property"
    if not isinstance(disks, list):
        return f"logical_disks: {disks!r:.100} is not of type 'array'"
    if not disks:
        return "logical_disks: [] should be non-empty"
    for position, disk in enumerate(disks):
        found = _disk_problem(disk)
        if found:
            return f"logical_disks[{position}]: {found}"
    return ""


def _disk_problem(disk: Any) -> str:
    if not isinstance(disk, dict):
        return f"{disk!r:.100} is not of type 'object'"
    extra = sorted(set(disk) - set(LOGICAL_DISK_PROPERTIES))
    if extra:
        return f"Additional properties are not allowed ({', '.join(map(repr, extra))} unexpected)"
    for name in REQUIRED:
        if name not in disk:
            return f"{name!r} is a required property"
    if "physical_disks" in disk and "controller" not in disk:
        return "'controller' is a dependency of 'physical_disks'"
    for name, value in disk.items():
        found = _value_problem(name, value)
        if found:
            return f"{name}: {found}"
    return ""


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _value_problem(name: str, value: Any) -> str:
    shown = f"{value!r:.100}"
    if name == "raid_level" and value not in RAID_LEVELS:
        return f"{shown} is not one of {list(RAID_LEVELS)}"
    if name == "size_gb" and not ((_is_int(value) and value >= 0) or value == MAX_SIZE):
        return f"{shown} is not a non-negative integer or 'MAX'"
    if name in ("volume_name", "controller") and not isinstance(value, str):
        return f"{shown} is not of type 'string'"
    if name in ("is_root_volume", "share_physical_disks") and not isinstance(value, bool):
        return f"{shown} is not of type 'boolean'"
    if name == "disk_type" and value not in DISK_TYPES:
        return f"{shown} is not one of {list(DISK_TYPES)}"
    if name == "interface_type" and value not in INTERFACE_TYPES:
        return f"{shown} is not one of {list(INTERFACE_TYPES)}"
    if name == "number_of_physical_disks" and not (_is_int(value) and value > 0):
        return f"{shown} is not a positive integer"
    if name == "physical_disks" and not _physical_disks_ok(value):
        return f"{shown} is not a list of strings, nor a list of at least two objects"
    return ""


def _physical_disks_ok(value: Any) -> bool:
    if not isinstance(value, list):
        return False
    if all(isinstance(item, str) for item in value):
        return True
    return len(value) >= 2 and all(isinstance(item, dict) for item in value)


def filter_target(
    node: Mapping[str, Any], *, create_root_volume: bool = True, create_nonroot_volumes: bool = True
) -> dict[str, Any]:
    """The node's target RAID config with root or non-root disks left out, as
    ``create_configuration`` was asked; MissingParameter when nothing is left."""
    target = node.get("target_raid_config") or {}
    if not target.get("logical_disks"):
        raise errors.MissingParameter(f"Node {node['uuid']} has no target RAID configuration.")
    disks = list(target["logical_disks"])
    skipped = []
    if not create_root_volume:
        disks = [d for d in disks if not d.get("is_root_volume")]
        skipped.append("skipping root volume")
    if not create_nonroot_volumes:
        disks = [d for d in disks if d.get("is_root_volume")]
        skipped.append("skipping non-root volumes")
    if not disks:
        raise errors.MissingParameter(
            f"Node {node['uuid']} has an empty target RAID configuration after {' and '.join(skipped)}."
        )
    return {**target, "logical_disks": disks}


def as_current(config: Mapping[str, Any], *, now: datetime | None = None) -> dict[str, Any]:
    """What ``raid_config`` records once a configuration is built: the logical
    disks and when (Ironic's ``update_raid_info``)."""
    return {**config, "last_updated": str(now or datetime.now(UTC))}


def properties_after(properties: Mapping[str, Any], built: Mapping[str, Any]) -> dict[str, Any]:
    """The node's ``properties`` once ``built`` is its RAID, as Ironic's
    ``update_raid_info``: the root volume's size becomes ``local_gb`` (unless
    ``MAX``), its ``root_device_hint`` the ``root_device``, and its level the
    ``raid_level`` capability, so scheduling and deploying use the new disk."""
    roots = [d for d in built.get("logical_disks") or () if isinstance(d, dict) and d.get("is_root_volume")]
    if not roots:
        return dict(properties)
    root, updated = roots[0], dict(properties)
    if _is_int(root.get("size_gb")):
        updated["local_gb"] = int(root["size_gb"])
    if "root_device_hint" in root:
        updated["root_device"] = root["root_device_hint"]
    updated["capabilities"] = node_capabilities.merged(
        properties.get("capabilities") or "", f"raid_level:{root.get('raid_level')}"
    )
    return updated
