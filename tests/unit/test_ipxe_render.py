"""The renderer never raises: odd data, a failing reader and impossible SAN
set-ups all become error scripts with a reason an operator can act on."""

from __future__ import annotations

from typing import Any

import pytest

from services.common.db.bootdata import BootData
from services.ipxe.interpret import interpret_script
from services.ipxe.render import ScriptRenderer
from tests.unit.test_ipxe_scenarios import ISCSI_CONNECTOR, KERNEL, MAC, UUID, iscsi_target, node, render, settings


class FailingReader:
    """A reader whose database is gone."""

    async def read(self, *, mac: str | None = None, uuid: str | None = None) -> BootData | None:
        raise ConnectionError("connection refused")


async def test_database_failure_is_an_error_script() -> None:
    rendered = await ScriptRenderer(FailingReader(), settings()).render(mac=MAC)
    assert rendered.kind == "error" and "database error" in rendered.reason
    assert interpret_script(rendered.script, {}).kind == "error"


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (node("deploying", driver_info={"deploy_kernel": 123, "deploy_ramdisk": KERNEL}), "deploy_kernel"),
        (node("deploying", driver_info={"deploy_kernel": KERNEL, "deploy_ramdisk": "ftp://h/r"}), "http/https"),
        (
            node(
                "deploying",
                driver_info={"deploy_kernel": KERNEL, "deploy_ramdisk": KERNEL, "kernel_append_params": ["a"]},
            ),
            "must be a string",
        ),
        (node("active", deploy_interface="ramdisk", instance_info={"kernel": KERNEL}), "instance_info ramdisk"),
        (node("active", targets=(iscsi_target(0),)), "no iqn volume connector"),
        (
            node(
                "active",
                targets=(iscsi_target(0, target_portals="192.0.2.1:3260", target_portal=None),),
                connectors=ISCSI_CONNECTOR,
            ),
            "target_portal",
        ),
        (node("active", targets=(iscsi_target(0, target_lun=-1),), connectors=ISCSI_CONNECTOR), "target_lun"),
        (
            node("active", targets=(iscsi_target(0, target_portal="192.0.2.20:99999"),), connectors=ISCSI_CONNECTOR),
            "port",
        ),
        (
            node(
                "active",
                targets=({"uuid": "t", "volume_type": "nvme", "boot_index": 0, "volume_id": "v", "properties": {}},),
            ),
            "[nvme] cannot be booted",
        ),
        (
            node(
                "active",
                targets=(
                    {
                        "uuid": "t",
                        "volume_type": "fibre_channel",
                        "boot_index": 0,
                        "volume_id": "v",
                        "properties": {"target_wwn": "xyz"},
                    },
                ),
            ),
            "WWN",
        ),
        (
            node(
                "active",
                instance_info={"kernel": KERNEL, "ramdisk": KERNEL},
                targets=(
                    {
                        "uuid": "t",
                        "volume_type": "nfs",
                        "boot_index": 0,
                        "volume_id": "v",
                        "properties": {"nfs_server": "192.0.2.30", "nfs_path": "relative/path"},
                    },
                ),
            ),
            "NFS export path",
        ),
    ],
)
async def test_unbootable_data_gives_a_reason(data: BootData, reason: str) -> None:
    rendered = await render(data, {"mac": MAC})
    assert rendered.kind == "error" and reason in rendered.reason, rendered.reason
    assert rendered.node_uuid == UUID and f"set ferrum_node {UUID}" in rendered.script


async def test_a_boot_volume_recorded_by_the_deploy_is_booted_even_with_an_image_source() -> None:
    """Seed 004: a node whose deploy recorded ``boot_from_volume`` boots that
    volume; image_source does not turn it into a local boot."""
    data = node(
        "active",
        boot_mode="bios",
        instance_info={"image_source": "http://h/img.qcow2"},
        targets=(iscsi_target(0),),
        connectors=ISCSI_CONNECTOR,
    )
    assert data.node["driver_internal_info"]["boot_from_volume"] == iscsi_target(0)["uuid"]
    action = interpret_script((await render(data, {"mac": MAC})).script, {"mac": MAC})
    assert action.kind == "sanboot" and action.san_target.startswith("iscsi:192.0.2.20::3260:1:")


async def test_an_hba_booted_volume_node_boots_its_disk() -> None:
    """Scenarios 3 and 4: the HBA presents the boot volume as a disk, the deploy
    records no ``boot_from_volume``, and a network boot is sent to the disk."""
    data = node(
        "active",
        boot_mode="bios",
        instance_info={"image_source": "http://h/img.qcow2"},
        targets=(iscsi_target(0),),
        connectors=ISCSI_CONNECTOR,
        internal={"boot_from_volume_deploy": iscsi_target(0)["uuid"]},
    )
    assert (await render(data, {"mac": MAC})).kind == "local_disk"


async def test_ipv6_portal_and_default_port() -> None:
    props: dict[str, Any] = {"target_portal": "[2001:db8::20]"}
    data = node("active", targets=(iscsi_target(0, **props),), connectors=ISCSI_CONNECTOR)
    action = interpret_script((await render(data, {"mac": MAC})).script, {"mac": MAC})
    assert action.kind == "sanboot" and action.san_target.startswith("iscsi:[2001:db8::20]::3260:1:")


async def test_a_deploy_without_a_ramdisk_gets_the_instance_while_still_deploying() -> None:
    """The ramdisk deploy and a boot-from-volume deploy power the machine on
    before the node is ``active``; a fast iPXE must not get the deploy ramdisk."""
    volume = node("deploying", boot_mode="bios", targets=(iscsi_target(0),), connectors=ISCSI_CONNECTOR)
    action = interpret_script((await render(volume, {"mac": MAC})).script, {"mac": MAC})
    assert action.kind == "sanboot" and action.san_target.startswith("iscsi:192.0.2.20::3260:1:")
    instance = {"kernel": KERNEL + "?instance", "ramdisk": KERNEL + "?instance-initrd"}
    ramdisk = node("deploying", deploy_interface="ramdisk", instance_info=instance)
    action = interpret_script((await render(ramdisk, {"mac": MAC})).script, {"mac": MAC})
    assert action.kind == "kernel" and action.kernel_url == instance["kernel"]
    # An agent deploy in the same state still gets its deploy ramdisk.
    assert (await render(node("deploying"), {"mac": MAC})).kind == "deploy"
