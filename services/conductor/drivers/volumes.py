"""Boot from volume (seed 004): what a node's volumes, capabilities and
instance_info say about how it is deployed and how it boots.

The scenarios, by the node's declared capabilities and its boot volume (the
volume target with ``boot_index`` 0):

1. ``iscsi_boot``: iPXE logs in to an iSCSI LUN and boots it (``sanboot``).
2. ``fibre_channel_boot``: iPXE boots an FCoE LUN.
3. ``hba_boot``: the machine's own HBA presents the LUN as a local disk and
   the firmware boots it; the OS is already on it.
4. ``hba_boot`` with ``instance_info.force_deployment``: as 3, but the agent
   first writes the image onto that LUN, found by a root device hint made
   from the target's WWN or serial.
5. ``nfs_boot``: iPXE boots the instance kernel with its root on NFS
   (``instance_info.nfs_root``, else the target's ``nfs_server``/``nfs_path``).

In 1, 2, 3 and 5 no image is written: the deploy only attaches the volumes,
points the boot at them and powers on. These rules live here, in one place,
for the storage interfaces (validate, should_write_image), the deploy
interfaces (skip the write) and the boot interfaces (where the next boot goes),
as Ironic keeps them in deploy_utils.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from services.common import errors, node_capabilities
from services.common.boot_values import UnsafeValue, check_nfs, check_nfs_root
from services.common.db.records import NodeRecord, NodeVolumeTarget
from services.conductor.drivers.base import Task

# The node capability that allows booting a volume of each type through the
# network (seed 004 spells Fibre Channel "fiberchannel_boot"; Ironic code and
# docs use "fibre_channel_boot": both are read).
NETBOOT_FLAGS: Mapping[str, tuple[str, ...]] = {
    "iscsi": ("iscsi_boot",),
    "fibre_channel": ("fibre_channel_boot", "fiberchannel_boot"),
    "nfs": ("nfs_boot",),
}
HBA_BOOT = "hba_boot"
# Which volume connector types can reach a target of each volume type.
INITIATORS: Mapping[str, tuple[str, ...]] = {"iscsi": ("iqn",), "fibre_channel": ("wwpn", "wwnn")}
VOLUME_TYPES = ("iscsi", "fibre_channel", "nfs")

BOOT_FROM_VOLUME = "boot_from_volume"  # the boot target's UUID while the node netboots it (the renderer reads it)
BOOT_FROM_VOLUME_DEPLOY = "boot_from_volume_deploy"  # the target an image is written to (scenario 4)
ROOT_DEVICE_HINT = "volume_root_device"  # the hint the agent gets instead of properties.root_device
INTERNAL_KEYS = (BOOT_FROM_VOLUME, BOOT_FROM_VOLUME_DEPLOY, ROOT_DEVICE_HINT)


def boot_volume(task: Task) -> NodeVolumeTarget | None:
    """The volume target with boot_index 0, if any."""
    return next((t for t in task.volume_targets if t.get("boot_index") == 0), None)


def hba_boot(node: NodeRecord) -> bool:
    return node_capabilities.flag(node, HBA_BOOT)


def force_deployment(node: NodeRecord) -> bool:
    return node_capabilities.is_true((node.get("instance_info") or {}).get("force_deployment", False))


def without_image(task: Task) -> bool:
    """Ironic's ``should_write_image`` rule, negated: a boot volume and no image to write
    (no image_source, or one that only force_deployment would write)."""
    if boot_volume(task) is None:
        return False
    return not force_deployment(task.node)


def netboots_volume(task: Task) -> bool:
    """Scenarios 1, 2 and 5: the boot interface starts the boot volume over the network."""
    return boot_volume(task) is not None and not hba_boot(task.node)


def boot_option(task: Task) -> str:
    """How the instance boots: ``netboot`` through iPXE (1, 2, 5), ``local`` through the HBA (3, 4)."""
    return "local" if hba_boot(task.node) else "netboot"


def _connector_types(task: Task) -> set[str]:
    return {str(c.get("type")) for c in task.volume_connectors}


def _where(target: Mapping[str, Any]) -> str:
    return f"volume target {target.get('uuid')} (boot_index {target.get('boot_index')})"


def validate(task: Task) -> None:
    """Refuse (400, naming the field) what cannot boot: initiators that do not
    match their targets, capabilities without a boot volume or the reverse,
    an image that would be written nowhere. Nothing to check without volumes."""
    node = task.node
    uuid = node["uuid"]
    boot = boot_volume(task)
    flags = {name for names in NETBOOT_FLAGS.values() for name in names if node_capabilities.flag(node, name)}
    if hba_boot(node):
        flags.add(HBA_BOOT)
    if boot is None:
        if flags:
            raise errors.InvalidParameterValue(
                f"Node {uuid} declares the capability {', '.join(sorted(flags))} but has no volume target "
                "with boot_index 0 to boot from"
            )
        if force_deployment(node):
            raise errors.InvalidParameterValue(
                f"Node {uuid} has instance_info force_deployment but no boot volume (boot_index 0) to write to"
            )
    connectors = _connector_types(task)
    for target in task.volume_targets:
        volume_type = str(target.get("volume_type") or "")
        if not target.get("volume_id"):
            raise errors.MissingParameter(f"Node {uuid}: {_where(target)} has no volume_id")
        wanted = INITIATORS.get(volume_type)
        if wanted and not connectors.intersection(wanted):
            raise errors.InvalidParameterValue(
                f"Node {uuid}: {_where(target)} is of type {volume_type!r}, which needs a volume connector of "
                f"type {' or '.join(wanted)}; the node's connectors are of type "
                f"{', '.join(sorted(connectors)) or 'none'}"
            )
    if boot is not None:
        _validate_boot_volume(task, boot)


def _validate_boot_volume(task: Task, boot: Mapping[str, Any]) -> None:
    node = task.node
    uuid = node["uuid"]
    volume_type = str(boot.get("volume_type") or "")
    if volume_type not in VOLUME_TYPES:
        raise errors.InvalidParameterValue(
            f"Node {uuid}: the boot volume ({_where(boot)}) is of type {volume_type!r}; a node boots "
            f"from {', '.join(VOLUME_TYPES)} volumes"
        )
    allowed = NETBOOT_FLAGS[volume_type]
    hba = hba_boot(node) and volume_type != "nfs"
    if not hba and not any(node_capabilities.flag(node, name) for name in allowed):
        also = " or hba_boot:true (the HBA presents it as a disk)" if volume_type != "nfs" else ""
        raise errors.InvalidParameterValue(
            f"Node {uuid} has a boot volume of type {volume_type!r} ({_where(boot)}) but its properties "
            f"capabilities do not allow booting it: set {allowed[0]}:true{also}"
        )
    info = node.get("instance_info") or {}
    if force_deployment(node):
        if not hba:
            raise errors.InvalidParameterValue(
                f"Node {uuid}: instance_info force_deployment writes the image onto the boot volume through "
                "the machine's HBA (seed 004, scenario 4), so it needs the capability hba_boot:true"
            )
        if not info.get("image_source"):
            raise errors.MissingParameter(
                f"Node {uuid}: instance_info force_deployment needs image_source, the image to write"
            )
        root_device_hint(boot, node_uuid=uuid)
    elif info.get("image_source"):
        raise errors.InvalidParameterValue(
            f"Node {uuid} boots from its volume ({_where(boot)}) and writes no image, but instance_info "
            "has image_source: remove it to boot the volume as it is, or set force_deployment:true on an "
            "hba_boot node to write the image onto the volume"
        )
    chosen = info.get("boot_option")
    if chosen and chosen != boot_option(task):
        raise errors.InvalidParameterValue(
            f"Node {uuid}: instance_info boot_option is {chosen!r}, but its boot volume boots by "
            f"{boot_option(task)!r} ({'the HBA' if hba else 'iPXE'})"
        )
    if volume_type == "nfs":
        nfs_root(node, boot)
        missing = [k for k in ("kernel", "ramdisk") if not info.get(k)]
        if missing:
            raise errors.MissingParameter(
                f"Node {uuid} boots an NFS root, which needs instance_info {' and '.join(missing)} "
                "(the kernel that mounts it)"
            )


def nfs_root(node: NodeRecord, target: Mapping[str, Any]) -> str:
    """``server:/path[,options]``: instance_info ``nfs_root`` (seed 004), else the
    target's ``nfs_server``, ``nfs_path`` and ``nfs_options`` properties,
    checked by the rules the renderer applies before it writes them into a script."""
    given = (node.get("instance_info") or {}).get("nfs_root")
    props = target.get("properties") or {}
    try:
        if given:
            return check_nfs_root(given)
        if not props.get("nfs_server") or not props.get("nfs_path"):
            raise errors.MissingParameter(
                f"Node {node['uuid']} boots an NFS root but has neither instance_info nfs_root nor the boot "
                "volume's properties nfs_server and nfs_path"
            )
        return check_nfs(props["nfs_server"], props["nfs_path"], props.get("nfs_options"))
    except UnsafeValue as exc:
        field = "instance_info nfs_root" if given else f"the boot volume's NFS properties ({_where(target)})"
        raise errors.InvalidParameterValue(f"Node {node['uuid']}: {field}: {exc}") from None


def root_device_hint(target: Mapping[str, Any], *, node_uuid: str) -> dict[str, str]:
    """How the agent finds the LUN the HBA presents: the target's WWN, else its serial."""
    props = target.get("properties") or {}
    wwn = props.get("target_wwn")
    if isinstance(wwn, list):
        wwn = wwn[0] if wwn else None
    if wwn:
        text = str(wwn).lower().replace(":", "")
        return {"wwn": text if text.startswith("0x") else f"0x{text}"}
    serial = props.get("serial") or props.get("volume_serial")
    if serial:
        return {"serial": str(serial)}
    raise errors.MissingParameter(
        f"Node {node_uuid}: writing an image onto the boot volume ({_where(target)}) needs its properties "
        "target_wwn or serial, so the agent can tell the LUN from the local disks"
    )


async def record(task: Task) -> None:
    """What the renderer and the agent read, for the deploy that starts:
    ``boot_from_volume`` while iPXE boots the volume, ``boot_from_volume_deploy``
    and the root device hint while an image is written onto it; and
    instance_info ``boot_option`` when the user did not set it."""
    boot = boot_volume(task)
    values: dict[str, Any] = {}
    if boot is not None and netboots_volume(task):
        values[BOOT_FROM_VOLUME] = boot["uuid"]
    if boot is not None and force_deployment(task.node) and hba_boot(task.node):
        values[BOOT_FROM_VOLUME_DEPLOY] = boot["uuid"]
        values[ROOT_DEVICE_HINT] = root_device_hint(boot, node_uuid=task.node["uuid"])
    internal = task.node.get("driver_internal_info") or {}
    stale = tuple(k for k in INTERNAL_KEYS if k in internal and k not in values)
    if stale or any(internal.get(k) != v for k, v in values.items()):
        await task.save_internal_info(values, remove=stale)
    info = task.node.get("instance_info") or {}
    if boot is not None and not info.get("boot_option"):
        await task.save_fields({"instance_info": {**info, "boot_option": boot_option(task)}})


async def forget(task: Task) -> None:
    """Drop what ``record`` kept (tear down)."""
    if any(k in (task.node.get("driver_internal_info") or {}) for k in INTERNAL_KEYS):
        await task.save_internal_info({}, remove=INTERNAL_KEYS)


async def drop_force_deployment(task: Task) -> None:
    """Seed 004: ``force_deployment`` is gone from instance_info before the node is active."""
    info = task.node.get("instance_info") or {}
    if "force_deployment" in info:
        await task.save_fields({"instance_info": {k: v for k, v in info.items() if k != "force_deployment"}})
