"""Deciding what a node boots, from its provision state (seed 003).

Pure functions: boot data in, a :class:`Plan` (template name + validated
values) out, or :class:`Refusal` with the reason an operator needs. Every
value put into the plan went through :mod:`services.ipxe.safety` first.

- ramdisk states (deploying, cleaning, inspecting, rescuing, servicing and
  their waits) → the deploy (or rescue) kernel and ramdisk from driver_info;
- active → boot from volume when a boot_index 0 target exists and no image
  was written; the instance kernel/ramdisk (or boot ISO) for the ``ramdisk``
  deploy interface; else the local disk;
- anything else → Refusal.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from services.common import node_capabilities, states
from services.common.boot_values import check_append_params
from services.common.db.bootdata import BootData
from services.common.db.records import BootNodeRecord
from services.ipxe import safety

RAMDISK_STATES = frozenset(
    {
        states.DEPLOYING,
        states.DEPLOYWAIT,
        states.CLEANING,
        states.CLEANWAIT,
        states.INSPECTING,
        states.INSPECTWAIT,
        states.RESCUING,
        states.RESCUEWAIT,
        states.SERVICING,
        states.SERVICEWAIT,
    }
)
RESCUE_STATES = frozenset({states.RESCUING, states.RESCUEWAIT})
INSPECT_STATES = frozenset({states.INSPECTING, states.INSPECTWAIT})


class Refusal(Exception):
    """The node cannot be booted from the network now; ``reason`` says why."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class PlanOptions:
    """Renderer-wide settings the plan needs (from IpxeConfig + the api URL)."""

    api_url: str
    kernel_append_params: str
    default_boot_mode: str = "uefi"
    timeout_ms: int = 60_000
    retries: int = 10
    agent_ca_file: str = ""  # ipa-cafile: the CA the agent verifies an https api with


@dataclass(frozen=True)
class Plan:
    kind: str  # deploy | local_disk | ramdisk | san
    template: str
    values: Mapping[str, Any] = field(default_factory=dict)


def boot_mode(node: BootNodeRecord, default: str) -> str:
    """bios or uefi: the node's boot_mode, its capabilities, instance_info, else the default."""
    candidates: list[Any] = [node.get("boot_mode")]
    candidates.append(node_capabilities.of_node(node).get("boot_mode"))
    candidates.append((node.get("instance_info") or {}).get("deploy_boot_mode"))
    for value in candidates:
        if isinstance(value, str) and value.strip().lower() in ("bios", "uefi"):
            return value.strip().lower()
    return default


def _booting_instance(node: BootNodeRecord) -> bool:
    """The deploy powers the instance on while the node is still ``deploying``
    (it becomes ``active`` once the deploy returns): a machine that
    network-boots its instance asks now, and must get the instance, not the
    deploy ramdisk. That is the last step of an agent deploy of a partition
    image (its kernel), and the whole of a deploy that runs no ramdisk: the
    ``ramdisk`` deploy interface's instance, and a node that boots its OS from
    a volume (``boot_from_volume``, recorded before the power on)."""
    if node.get("provision_state") != states.DEPLOYING:
        return False
    internal = node.get("driver_internal_info") or {}
    if node.get("deploy_interface") == "ramdisk" or internal.get("boot_from_volume"):
        return True
    return internal.get("deploy_phase") == "finishing" and internal.get("finish_step") == "boot_instance"


def plan_boot(data: BootData, *, mac: str | None, options: PlanOptions) -> Plan:
    """What the node with ``data`` should boot; ``mac`` is the NIC it asked with, if known."""
    node = data.node
    state = node.get("provision_state")
    mode = boot_mode(node, options.default_boot_mode)
    common = {
        "uuid": node["uuid"],
        "name": safety.sanitize_text(node.get("name") or "-", limit=64),
        "state": safety.sanitize_text(state),
        "boot_mode": mode,
        "timeout_ms": options.timeout_ms,
        "retries": options.retries,
    }
    if state in RAMDISK_STATES and not _booting_instance(node):
        return Plan("deploy", "deploy.ipxe.j2", {**common, **_ramdisk_values(data, mac, options)})
    if state == states.DEPLOYING:
        return _active_plan(data, common, options)
    if state == states.ACTIVE:
        return _active_plan(data, common, options)
    raise Refusal(
        f"node {node['uuid']} is in provision state [{safety.sanitize_text(state)}], "
        "which does not boot from the network"
    )


def _append_params(configured: Any, default: str, *, field: str) -> str:
    """Per-node kernel_append_params replace the default; ``%default%`` splices it in."""
    return check_append_params(configured, default, field=field)


def _ramdisk_values(data: BootData, mac: str | None, options: PlanOptions) -> dict[str, Any]:
    node = data.node
    info = node.get("driver_info") or {}
    rescue = node.get("provision_state") in RESCUE_STATES and info.get("rescue_kernel")
    kernel_key, ramdisk_key = ("rescue_kernel", "rescue_ramdisk") if rescue else ("deploy_kernel", "deploy_ramdisk")
    for key in (kernel_key, ramdisk_key):
        if not info.get(key):
            raise Refusal(f"node {node['uuid']} has no driver_info {key} to boot its ramdisk")
    kernel_url = safety.check_url(info[kernel_key], field=f"driver_info {kernel_key}")
    ramdisk_url = safety.check_url(info[ramdisk_key], field=f"driver_info {ramdisk_key}")
    append = _append_params(
        info.get("kernel_append_params"), options.kernel_append_params, field="driver_info kernel_append_params"
    )
    if not options.api_url:
        raise Refusal("the renderer does not know the api URL for the agent (set FERRUM_IPXE_API_URL)")
    api_url = safety.check_url(options.api_url, field="the api URL")
    args = ["selinux=0", "troubleshoot=0", "text", append, f"ipa-api-url={api_url}", f"ipa-node-uuid={node['uuid']}"]
    if options.agent_ca_file:
        args.append(f"ipa-cafile={options.agent_ca_file}")
    if node.get("provision_state") in INSPECT_STATES:
        args.append(f"ipa-inspection-callback-url={api_url.rstrip('/')}/v1/continue_inspection")
    # With the MAC known, BOOTIF names the NIC the agent must use; asked by
    # UUID, the template lets iPXE fill in the NIC it booted from.
    return {
        "kernel_url": kernel_url,
        "ramdisk_url": ramdisk_url,
        "initrd_name": "deploy_ramdisk",
        "kernel_args": safety.check_kernel_args(" ".join(a for a in args if a), field="kernel arguments"),
        "bootif": mac.replace(":", "-") if mac else "",
        "purpose": "rescue" if rescue else "deploy",
    }


def _active_plan(data: BootData, common: dict[str, Any], options: PlanOptions) -> Plan:
    node = data.node
    boot_target = next((t for t in data.volume_targets if t.get("boot_index") == 0), None)
    internal = node.get("driver_internal_info") or {}
    if boot_target is not None and internal.get("boot_from_volume"):
        # The conductor recorded at deploy that iPXE boots this volume (seed 004
        # scenarios 1, 2, 5); through an HBA (3, 4) the machine boots it as a disk.
        return _san_plan(data, boot_target, common, options)
    if node.get("deploy_interface") == "ramdisk":
        return _instance_ramdisk_plan(node, common, options)
    if internal.get("is_whole_disk_image") is False:
        return _partition_image_plan(node, internal, common, options)
    return Plan("local_disk", "local_disk.ipxe.j2", common)


def _partition_image_plan(
    node: BootNodeRecord, internal: Mapping[str, Any], common: dict[str, Any], options: PlanOptions
) -> Plan:
    """A partition image netboots its own kernel and ramdisk with its root file
    system by UUID (Ironic's ``root={{ ROOT }} ro text``)."""
    instance = node.get("instance_info") or {}
    for key in ("kernel", "ramdisk"):
        if not instance.get(key):
            raise Refusal(f"node {node['uuid']} holds a partition image but has no instance_info {key} to boot")
    root = str(internal.get("root_uuid_or_disk_id") or "")
    if not _ROOT_UUID.match(root):
        raise Refusal(f"node {node['uuid']} holds a partition image but its root file system UUID is unknown")
    append = _append_params(
        instance.get("kernel_append_params"), options.kernel_append_params, field="instance_info kernel_append_params"
    )
    args = safety.check_kernel_args(f"root=UUID={root} ro text {append}".strip(), field="kernel arguments")
    return _instance_kernel_plan(instance, common, args, "partition image instance")


_ROOT_UUID = re.compile(r"^[0-9A-Fa-f-]{4,64}$")


def _instance_ramdisk_plan(node: BootNodeRecord, common: dict[str, Any], options: PlanOptions) -> Plan:
    instance = node.get("instance_info") or {}
    if instance.get("boot_iso"):
        iso = safety.check_url(instance["boot_iso"], field="instance_info boot_iso")
        return Plan("ramdisk", "ramdisk.ipxe.j2", {**common, "boot_iso_url": iso, "purpose": "instance boot ISO"})
    for key in ("kernel", "ramdisk"):
        if not instance.get(key):
            raise Refusal(f"node {node['uuid']} uses the ramdisk deploy but has no instance_info {key}")
    append = _append_params(
        instance.get("kernel_append_params"), options.kernel_append_params, field="instance_info kernel_append_params"
    )
    extra = safety.check_kernel_args(
        instance.get("ramdisk_kernel_arguments"), field="instance_info ramdisk_kernel_arguments"
    )
    args = safety.check_kernel_args(
        " ".join(a for a in ("root=/dev/ram0", "text", append, extra) if a), field="kernel arguments"
    )
    return _instance_kernel_plan(instance, common, args, "ramdisk instance")


def _instance_kernel_plan(instance: Mapping[str, Any], common: dict[str, Any], args: str, purpose: str) -> Plan:
    """The instance's own kernel and ramdisk (instance_info) with ``args``."""
    return Plan(
        "ramdisk",
        "ramdisk.ipxe.j2",
        {
            **common,
            "boot_iso_url": "",
            "kernel_url": safety.check_url(instance["kernel"], field="instance_info kernel"),
            "ramdisk_url": safety.check_url(instance["ramdisk"], field="instance_info ramdisk"),
            "kernel_args": args,
            "initrd_name": "ramdisk",
            "purpose": purpose,
        },
    )


def _iscsi_uris(props: Mapping[str, Any], *, field: str) -> str:
    """``iscsi:<host>::<port>:<lun hex>:<iqn>``, space-joined for multipath portals."""
    portals = props.get("target_portals") or ([props["target_portal"]] if props.get("target_portal") else [])
    iqns = props.get("target_iqns") or ([props["target_iqn"]] if props.get("target_iqn") else [])
    luns = props.get("target_luns") or [props.get("target_lun", 0)]
    if not portals or not iqns or not isinstance(portals, list) or not isinstance(iqns, list):
        raise Refusal(f"{field} needs target_portal(s) and target_iqn(s)")
    uris = []
    for index, portal in enumerate(portals[:8]):
        iqn = safety.check_iqn(iqns[min(index, len(iqns) - 1)], field=f"{field} target_iqn")
        lun = safety.check_lun(
            luns[min(index, len(luns) - 1)] if isinstance(luns, list) else luns, field=f"{field} target_lun"
        )
        host, port = safety.check_portal(portal, field=f"{field} target_portal")
        uris.append(f"iscsi:{host}::{port}:{lun:x}:{iqn}")
    return " ".join(uris)


def _fcp_uri(props: Mapping[str, Any], *, field: str) -> str:
    wwn = props.get("target_wwn")
    if isinstance(wwn, list):
        wwn = wwn[0] if wwn else None
    lun = safety.check_lun(props.get("target_lun", 0), field=f"{field} target_lun")
    return f"fcp:{safety.check_wwn(wwn, field=f'{field} target_wwn')}:{lun:x}"


def _chap(props: Mapping[str, Any], *, field: str) -> tuple[str, str]:
    if str(props.get("auth_method") or "").upper() != "CHAP":
        return "", ""
    return (
        safety.check_chap(props.get("auth_username"), field=f"{field} auth_username"),
        safety.check_chap(props.get("auth_password"), field=f"{field} auth_password"),
    )


def _san_plan(data: BootData, boot_target: Mapping[str, Any], common: dict[str, Any], options: PlanOptions) -> Plan:
    node = data.node
    volume_type = boot_target.get("volume_type")
    volume_id = safety.sanitize_text(boot_target.get("volume_id"), limit=64)
    if volume_type == "nfs":
        return _nfs_plan(node, boot_target, {**common, "volume_id": volume_id}, options)
    hooks = []
    extra_drive = 0x81
    for target in data.volume_targets:
        props = target.get("properties") or {}
        where = f"volume target {safety.sanitize_text(target.get('uuid'))}"
        if target.get("volume_type") == "iscsi":
            uris = _iscsi_uris(props, field=where)
            username, password = _chap(props, field=where)
        elif target.get("volume_type") == "fibre_channel":
            uris, username, password = _fcp_uri(props, field=where), "", ""
        elif target is boot_target:
            raise Refusal(f"boot volume type [{safety.sanitize_text(volume_type)}] cannot be booted by iPXE")
        else:
            continue
        if target is boot_target:
            drive = 0x80
        else:
            drive, extra_drive = extra_drive, extra_drive + 1
        hooks.append({"drive": f"0x{drive:x}", "uris": uris, "username": username, "password": password})
    hooks.sort(key=lambda hook: hook["drive"] != "0x80")
    iqns = [c for c in data.volume_connectors if c.get("type") == "iqn"]
    initiator = safety.check_iqn(iqns[0]["connector_id"], field="volume connector iqn") if iqns else ""
    if volume_type == "iscsi" and not initiator:
        raise Refusal(f"node {node['uuid']} boots from an iSCSI volume but has no iqn volume connector")
    return Plan(
        "san",
        "san.ipxe.j2",
        {
            **common,
            "volume_id": volume_id,
            "hooks": hooks,
            "boot_hook": hooks[0],
            "initiator_iqn": initiator,
            "any_chap": any(h["username"] for h in hooks),
        },
    )


def _nfs_plan(node: BootNodeRecord, target: Mapping[str, Any], common: dict[str, Any], options: PlanOptions) -> Plan:
    """NFS root: the instance kernel and ramdisk with ``root=/dev/nfs nfsroot=..``."""
    props = target.get("properties") or {}
    instance = node.get("instance_info") or {}
    for key in ("kernel", "ramdisk"):
        if not instance.get(key):
            raise Refusal(f"node {node['uuid']} boots from NFS but has no instance_info {key}")
    if instance.get("nfs_root"):  # seed 004: the NFS root given with the instance wins
        nfsroot = safety.check_nfs_root(instance["nfs_root"])
    else:
        nfsroot = safety.check_nfs(props.get("nfs_server"), props.get("nfs_path"), props.get("nfs_options"))
    append = _append_params(
        instance.get("kernel_append_params"), options.kernel_append_params, field="instance_info kernel_append_params"
    )
    args = safety.check_kernel_args(f"root=/dev/nfs nfsroot={nfsroot} ip=dhcp rw {append}", field="kernel arguments")
    return Plan(
        "san",
        "ramdisk.ipxe.j2",
        {
            **common,
            "boot_iso_url": "",
            "kernel_url": safety.check_url(instance["kernel"], field="instance_info kernel"),
            "ramdisk_url": safety.check_url(instance["ramdisk"], field="instance_info ramdisk"),
            "kernel_args": args,
            "initrd_name": "ramdisk",
            "purpose": safety.sanitize_text(f"NFS root {nfsroot}"),
        },
    )
