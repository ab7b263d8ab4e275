"""The ``iscsi`` deploy interface (seed 002): the ramdisk exposes its disk, the
conductor writes the image.

For machines whose ramdisk should never fetch images itself (no route from
the ramdisk to the image store, or an image held only on the conductor's
side). The flow, on the agent's heartbeats as in ``direct``:

1. ``deploy`` makes a per-deploy key and target IQN and boots the ramdisk.
2. The first heartbeat sends ``iscsi.start_iscsi_target``: the agent serves
   the chosen root disk through ``tgtd``, only to this conductor's initiator
   name and with CHAP credentials derived from the key.
3. The agent calls back with ``{address, port, key, iqn, error}``: by
   ``POST /v1/nodes/{uuid}/vendor_passthru/pass_deploy_info`` (the seed's
   way) or in its next heartbeat (``driver_info['iscsi_callback']``).
   ``agent_callbacks.pass_deploy_info`` checks the key in constant time.
4. The next step logs in from the conductor (libiscsi inside qemu-img, see
   ``iscsi_writer``), writes the cached image and the config drive, and tells
   the agent to stop the target; the deploy key is forgotten.
5. Then the steps ``direct`` runs: partition UUIDs, power off, boot the instance.

A conductor that dies mid-write leaves ``deploy_phase`` at ``iscsi_write``
and the target up; the conductor that takes the node over writes again.
"""

from __future__ import annotations

import logging
import secrets
import time
from typing import Any

from services.common import errors
from services.common.db.records import NodeRecord
from services.conductor import iscsi_configdrive, iscsi_partitions, iscsi_writer
from services.conductor.drivers import base
from services.conductor.drivers.agent_client import AgentClient, agent_node, command_error_text
from services.conductor.drivers.capabilities import check_capability
from services.conductor.drivers.direct import (
    VOLUME_DEPLOY_CAPABILITIES,
    DirectDeploy,
    is_partition_image,
    validate_partition_image,
)
from services.conductor.image_cache import image_ref

LOG = logging.getLogger(__name__)

KEY = "iscsi_deploy_key"
IQN = "iscsi_target_iqn"
PORTAL = "iscsi_portal"
ERROR = "iscsi_deploy_error"
ISCSI_KEYS = (KEY, IQN, PORTAL, ERROR, "iscsi_write_started_at")
CALLBACK_STYLES = ("pass_deploy_info", "heartbeat")
IQN_PREFIX = "iqn.2008-10.org.openstack"
DEFAULT_INITIATOR_IQN = "iqn.2026-11.io.ferrum:conductor"


def initiator_iqn(options: dict[str, Any]) -> str:
    """The initiator name the target admits: one for every conductor of the
    deployment (configured, else Ferrum's), because the conductor that takes
    a node over mid-write must log in to the target the first one asked for.
    CHAP, per deploy, is what keeps everyone else out."""
    return str(options.get("iscsi_initiator_iqn") or DEFAULT_INITIATOR_IQN)


def ramdisk_error(error: str) -> str:
    return f"The deploy ramdisk could not expose its disk over iSCSI: {error}"


def callback_style(node: NodeRecord, options: dict[str, Any]) -> str:
    return str(
        (node.get("driver_info") or {}).get("iscsi_callback") or options.get("iscsi_callback") or CALLBACK_STYLES[0]
    )


class IscsiDeploy(DirectDeploy):
    name = "iscsi"
    capabilities = frozenset({"agent", "whole_disk_image", "iscsi_deploy", *VOLUME_DEPLOY_CAPABILITIES})

    def get_properties(self) -> dict[str, str]:
        return {
            "iscsi_callback": "How the ramdisk reports its exposed disk: pass_deploy_info (default) or "
            "heartbeat. Optional."
        }

    async def validate(self, task: base.Task) -> None:
        """Seed 002's checks: the node has ports (the ramdisk finds it by MAC),
        the image and its checksum are usable by the conductor, the callback
        style is known. Partition images are refused until the iSCSI deploy
        writes them."""
        await super().validate(task)
        if not task.driver.storage.should_write_image(task):
            return  # the OS is on the boot volume (seed 004)
        uuid = task.node["uuid"]
        if not task.ports:
            raise errors.MissingParameter(f"Node {uuid} has no ports: the deploy ramdisk finds its node by MAC")
        info = task.node.get("instance_info") or {}
        image_ref(info)
        fmt = info.get("image_disk_format")
        if fmt and fmt not in iscsi_writer.FORMATS:
            raise errors.InvalidParameterValue(
                f"The iscsi deploy of node {uuid} writes raw and qcow2 images, not image_disk_format {fmt!r}"
            )
        if check_capability(task.driver.boot, "virtual_media_boot") and task.media is not None:
            # The floppy tells the ramdisk where to call back (pass_deploy_info); through
            # iPXE the renderer's kernel line does, and it refuses to boot without it.
            try:
                task.media.api_url()
            except errors.FerrumError as exc:
                raise errors.InvalidParameterValue(
                    f"Node {uuid}: its ramdisk could not call back to pass_deploy_info: {exc.message}"
                ) from None
        style = callback_style(task.node, self.options)
        if style not in CALLBACK_STYLES:
            raise errors.InvalidParameterValue(
                f"driver_info iscsi_callback of node {uuid} is {style!r}; use one of {', '.join(CALLBACK_STYLES)}"
            )

    async def deploy(self, task: base.Task) -> str | None:
        """A new deploy key and target IQN, then the ramdisk boot. A resumed
        deploy whose ramdisk boot was already requested keeps them (its agent
        may already serve the target under that IQN)."""
        info = task.node["driver_internal_info"]
        if not task.driver.storage.should_write_image(task):
            return await super().deploy(task)
        if not (info.get(KEY) and info.get("ramdisk_boot_requested")):
            await task.save_internal_info(
                {KEY: secrets.token_urlsafe(32), IQN: f"{IQN_PREFIX}:{task.node['uuid']}.{secrets.token_hex(4)}"},
                remove=(PORTAL, ERROR, "iscsi_write_started_at"),
            )
        return await super().deploy(task)

    async def heartbeat(self, task: base.Task, callback_url: str, agent_version: str) -> str | None:
        info = task.node["driver_internal_info"]
        client = self._client(task)
        phase = info.get("deploy_phase")
        if phase is None:
            await self._start_target(task, client)
            return None
        if phase == "iscsi_target":
            if info.get(ERROR):
                await task.save_internal_info({}, remove=ISCSI_KEYS)
                raise errors.ImageError(ramdisk_error(info[ERROR]))
            if not info.get(PORTAL):
                command_id = info.get("agent_command_id")
                result = await client.command(command_id) if command_id else {}
                if result.get("command_status") == "FAILED":
                    raise errors.ImageError(
                        "The deploy ramdisk could not expose its disk over iSCSI: "
                        + command_error_text(result.get("command_error"))
                    )
                return None  # the agent has not called back yet
            await task.save_internal_info({"deploy_phase": "iscsi_write", "iscsi_write_started_at": time.time()})
            phase = "iscsi_write"
        if phase == "iscsi_write":
            await self._write(task, client)
            return "resume"
        return None

    async def _start_target(self, task: base.Task, client: AgentClient) -> None:
        info = task.node["driver_internal_info"]
        if not info.get(KEY) or not info.get(IQN):
            raise errors.ImageError("The iSCSI deploy lost its deploy key: deploy the node again")
        username, password = iscsi_writer.chap_credentials(info[KEY], task.node["uuid"])
        result = await client.execute(
            "iscsi.start_iscsi_target",
            {
                "iqn": info[IQN],
                "key": info[KEY],
                "chap_username": username,
                "chap_password": password,
                "initiator_iqn": initiator_iqn(self.options),
                "callback": callback_style(task.node, self.options),
                "node": agent_node(task.node),
            },
        )
        await task.save_internal_info({"deploy_phase": "iscsi_target", "agent_command_id": result.get("id")})
        LOG.info("iscsi target requested node_uuid=%s iqn=%s", task.node["uuid"], info[IQN])

    def _login(self, task: base.Task) -> iscsi_writer.IscsiLogin:
        info = task.node["driver_internal_info"]
        portal = info[PORTAL]
        username, password = iscsi_writer.chap_credentials(info[KEY], task.node["uuid"])
        return iscsi_writer.IscsiLogin(
            address=str(portal["address"]),
            port=int(portal.get("port") or iscsi_writer.DEFAULT_PORT),
            iqn=info[IQN],
            username=username,
            password=password,
            initiator_iqn=initiator_iqn(self.options),
            stall_timeout=float(self.options.get("iscsi_stall_timeout") or iscsi_writer.IscsiLogin.stall_timeout),
        )

    async def _write(self, task: base.Task, client: AgentClient) -> None:
        """The image, then the config drive, then the target down and the key forgotten.

        A failure also takes the target down (the agent stays up, so the deploy
        can be retried from ``deploy failed``) and forgets the key."""
        if task.image_cache is None:
            raise errors.ImageError("This conductor has no image cache for iSCSI deploys")
        login = self._login(task)
        info = task.node["instance_info"]
        declared = str(info.get("image_disk_format") or "")
        try:
            if is_partition_image(task.node):
                await self._write_partitions(task, login, declared)
                await self._stop_target(task, client)
                return
            async with task.image_cache.image(image_ref(info)) as path:
                written = await iscsi_writer.write_image(path, login, declared_format=declared)
            iso = await _configdrive_iso(task)
            if iso is not None:
                placement = await iscsi_configdrive.write_config_drive(login, iso, written.disk_size)
                LOG.info(
                    "config drive written over iSCSI node_uuid=%s partition=%s created=%s",
                    task.node["uuid"],
                    placement.partition_number,
                    placement.created,
                )
        except BaseException:
            await self._stop_target(task, client)
            raise
        await self._stop_target(task, client)
        await task.save_internal_info({"iscsi_write": iscsi_writer.describe(written)})

    async def _write_partitions(self, task: base.Task, login: iscsi_writer.IscsiLogin, declared: str) -> None:
        """Root, swap, ephemeral and config drive (Nova's sizes), then the root
        file system's UUID for the netboot kernel line."""
        assert task.image_cache is not None
        info = task.node["instance_info"]
        sizes = validate_partition_image(task.node)
        iso = await _configdrive_iso(task)
        started = time.monotonic()
        async with task.image_cache.image(image_ref(info)) as path:
            result = await iscsi_partitions.write_partition_image(
                login, sizes, path, declared_format=declared, configdrive=iso
            )
        if not result.root_uuid:
            raise errors.ImageError("The root partition holds no file system with a UUID after the write")
        await task.save_internal_info(
            {
                "is_whole_disk_image": False,
                "root_uuid_or_disk_id": result.root_uuid,
                "iscsi_write": {
                    "format": result.image_format,
                    "bytes": result.image_size,
                    "disk_bytes": result.layout.disk_size,
                    "seconds": round(time.monotonic() - started, 3),
                    # "config_drive", not the role's name: "configdrive" keys are masked as secrets.
                    "partitions": {
                        p.role.replace("configdrive", "config_drive"): p.number for p in result.layout.partitions
                    },
                    "disk_label": result.layout.label,
                },
            }
        )

    async def prepare_instance_boot(self, task: base.Task) -> None:
        """A whole-disk image: as ``direct``. A partition image: its root UUID
        is already known, and it boots the instance kernel by netboot."""
        if not is_partition_image(task.node):
            await super().prepare_instance_boot(task)
            return
        await task.driver.boot.prepare_instance(task)

    async def _stop_target(self, task: base.Task, client: AgentClient) -> None:
        try:
            await client.run_sync("iscsi.stop_iscsi_target", {})
        except errors.AgentError as exc:
            LOG.warning("stopping the iscsi target failed node_uuid=%s reason=%s", task.node["uuid"], exc.message)
        await task.save_internal_info({}, remove=ISCSI_KEYS)

    async def tear_down(self, task: base.Task) -> str:
        await task.save_internal_info({}, remove=(*ISCSI_KEYS, "iscsi_write"))
        return await super().tear_down(task)


async def _configdrive_iso(task: base.Task) -> bytes | None:
    """The node's config drive as ISO bytes, read the conductor's way (configdrive_store.py)."""
    if not task.node["instance_info"].get("configdrive"):
        return None
    if task.read_configdrive is None:
        raise errors.ConfigDriveError("This conductor cannot read config drives (no configdrive store)")
    return await task.read_configdrive(task)
