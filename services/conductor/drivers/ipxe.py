"""The ``ipxe`` boot interface.

Ferrum renders iPXE scripts per request from node state (seed 003), so
preparing a boot writes no file anywhere: it only points the machine at the
network and checks that the renderer will have what it needs.
"""

from __future__ import annotations

from typing import Any

from services.common import errors
from services.common.boot_values import UnsafeValue, check_node_boot_values
from services.conductor.drivers import base, volumes

REQUIRED_DEPLOY_KEYS = ("deploy_kernel", "deploy_ramdisk")


class IpxeBoot(base.BootInterface):
    name = "ipxe"
    # What the renderer (services/ipxe/plan.py) can start: the deploy ramdisk and
    # ramdisk instances, and SAN boots from iSCSI, Fibre Channel (FCoE) and NFS roots.
    capabilities = frozenset(
        {
            "ipxe_boot",
            "pxe_boot",
            "ramdisk_boot",
            "iscsi_volume_boot",
            "fibre_channel_volume_boot",
            "nfs_volume_boot",
        }
    )

    def get_properties(self) -> dict[str, str]:
        return {
            "deploy_kernel": "URL of the deploy kernel. Required.",
            "deploy_ramdisk": "URL of the deploy ramdisk. Required.",
            "kernel_append_params": "Extra kernel arguments for the deploy ramdisk. Optional.",
        }

    async def validate(self, task: base.Task) -> None:
        info = task.node.get("driver_info") or {}
        # A node that boots its OS from a volume never runs the deploy ramdisk (seed 004).
        missing = (
            [k for k in REQUIRED_DEPLOY_KEYS if not info.get(k)] if task.driver.storage.should_write_image(task) else []
        )
        if missing:
            raise errors.MissingParameter(f"Node {task.node['uuid']} is missing driver_info: {', '.join(missing)}")
        if not any(p.get("pxe_enabled") for p in task.ports):
            raise errors.InvalidParameterValue(f"Node {task.node['uuid']} has no PXE-enabled port to boot from")

    async def prepare_ramdisk(self, task: base.Task, ramdisk_params: Any) -> None:
        """Point the machine at the network, once the renderer's rules say its
        values can boot: a value the api would refuse that got in anyway (direct
        SQL) fails the deploy here, before power-on, with a last_error, instead
        of an endless wait for a call-back from a machine that never boots."""
        try:
            check_node_boot_values(task.node.get("driver_info"), task.node.get("instance_info"))
        except UnsafeValue as exc:
            raise errors.InvalidParameterValue(f"Node {task.node['uuid']} cannot be network-booted: {exc}") from None
        await task.driver.management.set_boot_device(task, "pxe", persistent=False)

    async def prepare_instance(self, task: base.Task) -> None:
        """Boot the instance next: from its disk when the BMC can be told so.

        A whole-disk image boots straight from the disk, as Ironic's local boot
        does, so the first boot after a deploy never depends on the renderer
        having seen the node become active, and so does a node whose HBA
        presents its boot volume as a disk (seed 004, ``hba_boot``). A node
        that iPXE boots from its volume (``boot_from_volume``, scenarios 1, 2,
        5), or whose BMC can only network-boot, keeps booting from the network,
        and the renderer answers with the SAN, NFS or local-disk script for its
        state. So does a partition image (``is_whole_disk_image`` false): its
        instance kernel boots from the network with ``root=UUID=``.
        """
        devices = task.driver.management.get_supported_boot_devices(task)
        internal = task.node.get("driver_internal_info") or {}
        netboot = internal.get("is_whole_disk_image") is False or bool(internal.get(volumes.BOOT_FROM_VOLUME))
        if "disk" in devices and not netboot:
            await task.driver.management.set_boot_device(task, "disk", persistent=True)
        else:
            await task.driver.management.set_boot_device(task, "pxe", persistent=True)
