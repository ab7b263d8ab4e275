"""Boot data shared by the iPXE golden, interpreter and injection tests (plus a check of it)."""

from __future__ import annotations

from typing import Any, cast

from services.common.config import Settings, load_settings
from services.common.db.bootdata import BootData
from services.common.db.records import BootNodeRecord
from services.ipxe.reader import StaticReader
from services.ipxe.render import RenderedScript, ScriptRenderer

UUID = "1be26c0e-7a3c-4b5d-9e8f-0123456789ab"
MAC, MAC2 = "52:54:00:12:34:56", "52:54:00:12:34:57"
API = "http://192.0.2.1:6385"
KERNEL, RAMDISK = "http://192.0.2.9/ipa.kernel", "http://192.0.2.9/ipa.initramfs"
INITIATOR = "iqn.2004-10.org.example:node-1"
TARGET_IQN = "iqn.2010-10.org.openstack:volume-7"


def settings(**ipxe: Any) -> Settings:
    return load_settings({}, overrides={"ipxe": {"api_url": API, **ipxe}})


def node(
    state: str,
    *,
    boot_mode: str | None = None,
    driver_info: dict[str, Any] | None = None,
    instance_info: dict[str, Any] | None = None,
    deploy_interface: str = "direct",
    targets: tuple[dict[str, Any], ...] = (),
    connectors: tuple[dict[str, Any], ...] = (),
    name: Any = "rack1-node1",
    internal: dict[str, Any] | None = None,
    **fields: Any,
) -> BootData:
    info = {"deploy_kernel": KERNEL, "deploy_ramdisk": RAMDISK} if driver_info is None else driver_info
    if internal is None:
        # What the conductor records when a deploy goes to iPXE-boot the boot volume (seed 004).
        boot = next((t for t in targets if t.get("boot_index") == 0), None)
        internal = {"boot_from_volume": boot["uuid"]} if boot is not None else {}
    row: dict[str, Any] = {
        "uuid": UUID,
        "name": name,
        "driver": "fake-hardware",
        "boot_interface": "ipxe",
        "deploy_interface": deploy_interface,
        "storage_interface": "noop",
        "driver_info": info,
        "driver_internal_info": internal or {},
        "instance_info": instance_info or {},
        "properties": {},
        "provision_state": state,
        "target_provision_state": None,
        "boot_mode": boot_mode,
        **fields,
    }
    ports = ({"address": MAC, "pxe_enabled": True}, {"address": MAC2, "pxe_enabled": True})
    node = cast(BootNodeRecord, row)  # every column the renderer reads, and the test's extra ones
    return BootData(node=node, ports=ports, volume_targets=targets, volume_connectors=connectors)


def iscsi_target(boot_index: int = 0, **props: Any) -> dict[str, Any]:
    base = {"target_portal": "192.0.2.20:3260", "target_iqn": TARGET_IQN, "target_lun": 1}
    return {
        "uuid": f"00000000-0000-0000-0000-00000000000{boot_index}",
        "volume_type": "iscsi",
        "boot_index": boot_index,
        "volume_id": f"vol-{boot_index}",
        "properties": {**base, **props},
    }


ISCSI_CONNECTOR = ({"type": "iqn", "connector_id": INITIATOR},)

# name -> (boot data, selector)
SCENARIOS: dict[str, tuple[BootData, dict[str, str]]] = {
    "deploying-bios-by-mac": (node("deploying", boot_mode="bios"), {"mac": MAC}),
    "wait-call-back-uefi-by-uuid": (node("wait call-back", boot_mode="uefi"), {"uuid": UUID}),
    "inspecting-uefi": (
        node(
            "inspecting",
            driver_info={
                "deploy_kernel": KERNEL,
                "deploy_ramdisk": RAMDISK,
                "kernel_append_params": "%default% ipa-debug=1",
            },
        ),
        {"mac": MAC2},
    ),
    "rescuing-bios": (
        node(
            "rescuing",
            properties={"capabilities": "boot_mode:bios"},
            driver_info={
                "deploy_kernel": KERNEL,
                "deploy_ramdisk": RAMDISK,
                "rescue_kernel": "http://192.0.2.9/rescue.kernel",
                "rescue_ramdisk": "http://192.0.2.9/rescue.initramfs",
            },
        ),
        {"mac": MAC},
    ),
    "active-whole-disk-bios": (node("active", boot_mode="bios"), {"mac": MAC}),
    "active-whole-disk-uefi": (node("active", boot_mode="uefi"), {"mac": MAC}),
    "active-ramdisk-uefi": (
        node(
            "active",
            deploy_interface="ramdisk",
            instance_info={
                "kernel": "http://192.0.2.9/app.kernel",
                "ramdisk": "http://192.0.2.9/app.initramfs",
                "ramdisk_kernel_arguments": "app.mode=edge",
            },
        ),
        {"mac": MAC},
    ),
    "active-ramdisk-iso-bios": (
        node(
            "active",
            boot_mode="bios",
            deploy_interface="ramdisk",
            instance_info={"boot_iso": "http://192.0.2.9/app.iso"},
        ),
        {"mac": MAC},
    ),
    "active-iscsi-chap-bios": (
        node(
            "active",
            boot_mode="bios",
            internal={"boot_from_volume": "x"},
            targets=(
                iscsi_target(0, auth_method="CHAP", auth_username="node1", auth_password="s3cret-Pw"),
                iscsi_target(
                    1, target_portal="192.0.2.21:3261", target_lun=10, target_iqn="iqn.2010-10.org.openstack:volume-8"
                ),
            ),
            connectors=ISCSI_CONNECTOR,
        ),
        {"mac": MAC},
    ),
    "active-iscsi-multipath-uefi": (
        node(
            "active",
            boot_mode="uefi",
            targets=(
                iscsi_target(
                    0,
                    target_portal=None,
                    target_iqn=None,
                    target_lun=None,
                    target_portals=["192.0.2.20:3260", "192.0.2.21:3260"],
                    target_iqns=[TARGET_IQN, TARGET_IQN],
                    target_luns=[2, 2],
                ),
            ),
            connectors=ISCSI_CONNECTOR,
        ),
        {"mac": MAC},
    ),
    "active-fcoe-uefi": (
        node(
            "active",
            boot_mode="uefi",
            targets=(
                {
                    "uuid": "00000000-0000-0000-0000-0000000000fc",
                    "volume_type": "fibre_channel",
                    "boot_index": 0,
                    "volume_id": "vol-fc",
                    "properties": {"target_wwn": "2000001f16bcfe2f", "target_lun": 0},
                },
            ),
        ),
        {"mac": MAC},
    ),
    "active-nfs-root-bios": (
        node(
            "active",
            boot_mode="bios",
            instance_info={"kernel": "http://192.0.2.9/nfs.kernel", "ramdisk": "http://192.0.2.9/nfs.initramfs"},
            targets=(
                {
                    "uuid": "00000000-0000-0000-0000-0000000000f5",
                    "volume_type": "nfs",
                    "boot_index": 0,
                    "volume_id": "vol-nfs",
                    "properties": {
                        "nfs_server": "192.0.2.30",
                        "nfs_path": "/exports/node1",
                        "nfs_options": "vers=4,tcp",
                    },
                },
            ),
        ),
        {"mac": MAC},
    ),
    "manageable-error": (node("manageable"), {"mac": MAC}),
    "unknown-mac-error": (node("deploying"), {"mac": "52:54:00:ff:ff:ff"}),
}


async def render(data: BootData, selector: dict[str, str], **ipxe: Any) -> RenderedScript:
    renderer = ScriptRenderer(StaticReader([data]), settings(**ipxe))
    return await renderer.render(mac=selector.get("mac"), uuid=selector.get("uuid"))


async def test_static_reader_finds_scenarios_by_mac_and_uuid() -> None:
    """The scenarios above are what the golden, interpreter and injection tests use."""
    data = SCENARIOS["deploying-bios-by-mac"][0]
    reader = StaticReader([data])
    assert await reader.read(mac=MAC2) is data and await reader.read(uuid=UUID) is data
    assert await reader.read(mac="52:54:00:00:00:00") is None and await reader.read(uuid="x") is None
