"""The ``direct`` deploy interface: the agent streams the image onto the disk.

Ironic's model (CONTRACT.md 5): the conductor boots the deploy ramdisk and
leaves the node in ``wait call-back``; the agent looks the node up, gets its
one-time token and heartbeats. Each heartbeat lets the conductor take the next
step: send ``write_image`` (the in-band deploy step, which also writes the
config drive), poll it, then read the partition UUIDs, switch the boot device
to the instance and power-cycle into it. No step blocks a conductor worker
while the agent works: progress is kept in ``driver_internal_info``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from services.common import errors, node_capabilities, states
from services.common.db.records import NodeRecord
from services.common.images.partition_layout import PartitionSizes
from services.conductor.drivers import base, ramdisk_boot
from services.conductor.drivers.agent_client import (
    AgentClient,
    agent_node,
    agent_port,
    client_for,
    command_error_text,
    command_failure,
)
from services.conductor.drivers.agent_steps import MANAGER_VERSION, AgentCleanSteps
from services.conductor.drivers.ramdisk_boot import AGENT_KEYS, CACHED_DEPLOY_STEPS

__all__ = ["AGENT_KEYS", "DirectDeploy", "command_error_text", "image_info"]

LOG = logging.getLogger(__name__)

HASH_ALGORITHMS = ("sha256", "sha512", "md5")
# A deploy that skips the image for a node whose OS is on its boot volume, and
# writes it onto an iSCSI or Fibre Channel volume the HBA presents (force_deployment).
VOLUME_DEPLOY_CAPABILITIES = ("boot_from_volume", "iscsi_volume_deploy", "fibre_channel_volume_deploy")


def is_partition_image(node: NodeRecord) -> bool:
    """Ironic's rule: an image with its own kernel and ramdisk (or marked so) is a
    partition image, written into a root partition the deploy makes."""
    info = node.get("instance_info") or {}
    if info.get("image_type") in ("partition", "whole-disk"):
        return bool(info["image_type"] == "partition")
    return bool(info.get("kernel") and info.get("ramdisk"))


def default_disk_label(node: NodeRecord) -> str:
    """Ironic's: gpt for a UEFI node, msdos otherwise (instance_info capabilities may say)."""
    uefi = node_capabilities.of_node(node).get("boot_mode") == "uefi" or node.get("boot_mode") == "uefi"
    return "gpt" if uefi else "msdos"


def validate_partition_image(node: NodeRecord) -> PartitionSizes:
    """A partition image netboots its kernel (no boot loader is installed) and needs Nova's sizes."""
    info = node.get("instance_info") or {}
    missing = [k for k in ("kernel", "ramdisk") if not info.get(k)]
    if missing:
        raise errors.MissingParameter(
            f"Node {node['uuid']}: a partition image boots by netboot, so instance_info needs "
            f"{' and '.join(missing)} (local boot of partition images needs a boot loader install, "
            "which Ferrum does not do)"
        )
    return PartitionSizes.from_instance_info(info, default_label=default_disk_label(node))


def image_info(node: NodeRecord) -> dict[str, Any]:
    """``image_info`` for the agent from instance_info (CONTRACT.md 5.4)."""
    info = node["instance_info"]
    source = info["image_source"]
    result: dict[str, Any] = {
        "id": source.rstrip("/").rsplit("/", 1)[-1],
        "urls": [info.get("image_url") or source],
        "disk_format": info.get("image_disk_format") or "",
        "container_format": info.get("image_container_format") or "bare",
        "stream_raw_images": True,
        "node_uuid": node["uuid"],
        "image_type": "whole-disk",
    }
    if info.get("image_checksum"):
        result["checksum"] = info["image_checksum"]
    if info.get("image_os_hash_algo") and info.get("image_os_hash_value"):
        result["os_hash_algo"] = info["image_os_hash_algo"]
        result["os_hash_value"] = info["image_os_hash_value"]
    if is_partition_image(node):
        sizes = validate_partition_image(node)
        result.update(
            image_type="partition",
            root_mb=sizes.root_mb,
            swap_mb=sizes.swap_mb,
            ephemeral_mb=sizes.ephemeral_mb,
            ephemeral_format=sizes.ephemeral_format,
            disk_label=sizes.label,
        )
    return result


class DirectDeploy(AgentCleanSteps, base.DeployInterface):
    name = "direct"
    capabilities = frozenset({"agent", "whole_disk_image", *VOLUME_DEPLOY_CAPABILITIES})

    def get_properties(self) -> dict[str, str]:
        return {}

    async def validate(self, task: base.Task) -> None:
        if not task.driver.storage.should_write_image(task):
            return  # the OS is on the boot volume: no image to check (seed 004)
        info = task.node.get("instance_info") or {}
        source = info.get("image_source")
        if not source:
            raise errors.MissingParameter(f"Node {task.node['uuid']} is missing instance_info: image_source")
        if not isinstance(source, str) or not source.startswith(("http://", "https://")):
            raise errors.InvalidParameterValue(
                f"instance_info image_source of node {task.node['uuid']} must be an http(s) URL"
            )
        algo, value = info.get("image_os_hash_algo"), info.get("image_os_hash_value")
        if algo or value:
            if algo not in HASH_ALGORITHMS or not value:
                raise errors.InvalidParameterValue(
                    f"instance_info of node {task.node['uuid']} needs image_os_hash_algo "
                    f"({', '.join(HASH_ALGORITHMS)}) together with image_os_hash_value"
                )
        elif not info.get("image_checksum"):
            raise errors.MissingParameter(
                f"Node {task.node['uuid']} needs instance_info image_checksum or "
                "image_os_hash_algo and image_os_hash_value: images are never written unverified"
            )
        if is_partition_image(task.node):
            validate_partition_image(task.node)

    async def deploy(self, task: base.Task) -> str | None:
        """Boot the ramdisk; the agent's heartbeats drive the rest.

        The boot request is recorded before it is sent. A conductor resuming
        this deploy after its owner died then never reboots a machine whose
        ramdisk may already be up (its agent may hold the one-time token): it
        only powers on a machine that is still off. A power request the dead
        conductor left queued at the BMC lands on top of that as a no-op.
        """
        if not task.driver.storage.should_write_image(task):
            await boot_volume_instance(task)
            return None
        await ramdisk_boot.boot_ramdisk(task, fresh=False)
        return states.DEPLOYWAIT

    def get_deploy_steps(self, task: base.Task) -> list[dict[str, Any]]:
        """Ironic's agent deploy steps; ``deploy.deploy`` boots the ramdisk and
        the agent's heartbeats then run write_image and the steps after it.
        A node that boots its OS from a volume has only ``deploy.deploy``."""
        if not task.driver.storage.should_write_image(task):
            return super().get_deploy_steps(task)
        return [
            {
                "interface": "deploy",
                "step": name,
                "priority": priority,
                "argsinfo": None,
                **({"fixed": True} if name != "deploy" else {}),
            }
            for name, priority in (
                ("deploy", 100),
                ("write_image", 80),
                ("prepare_instance_boot", 60),
                ("tear_down_agent", 40),
                ("switch_to_tenant_network", 30),
                ("boot_instance", 20),
            )
        ]

    def _client(self, task: base.Task) -> AgentClient:
        return client_for(task.node, self.options)

    async def heartbeat(self, task: base.Task, callback_url: str, agent_version: str) -> str | None:
        """One step of the deploy per heartbeat; ``resume`` once the image is on disk."""
        info = task.node["driver_internal_info"]
        client = self._client(task)
        phase = info.get("deploy_phase")
        if phase is None:
            running = await _write_image_command(client)
            if running is not None:
                # A conductor that died after sending write_image (before it could
                # record that) left the agent writing: adopt that command.
                await task.save_internal_info({"deploy_phase": "write_image", "agent_command_id": running.get("id")})
                LOG.info("adopted running image write node_uuid=%s command=%s", task.node["uuid"], running.get("id"))
                return self._outcome(task, running)
            versions = await self._refresh_deploy_steps(task, client)
            step = {
                "interface": "deploy",
                "step": "write_image",
                "priority": 80,
                "args": {
                    "image_info": image_info(task.node),
                    "configdrive": task.node["instance_info"].get("configdrive"),
                },
            }
            result = await client.execute(
                "deploy.execute_deploy_step",
                {
                    "step": step,
                    "node": agent_node(task.node),
                    "ports": [agent_port(p) for p in task.ports],
                    "deploy_version": versions,
                },
            )
            await task.save_internal_info(
                {"deploy_phase": "write_image", "agent_command_id": result.get("id"), "deploy_started_at": time.time()}
            )
            LOG.info("image write started node_uuid=%s command=%s", task.node["uuid"], result.get("id"))
            return self._outcome(task, result)
        if phase == "write_image":
            command_id = info.get("agent_command_id")
            result = await client.command(command_id) if command_id else {}
            return self._outcome(task, result)
        return None

    async def _refresh_deploy_steps(self, task: base.Task, client: AgentClient) -> dict[str, Any]:
        """Ironic's first-heartbeat ``refresh_steps``: read the agent's deploy
        steps and hardware manager versions, and check it offers write_image.

        The versions go back with every ``execute_deploy_step`` as
        ``deploy_version``: IPA refuses a step whose versions differ from its
        own (``CLEAN_VERSION_MISMATCH``)."""
        result = await client.run_sync(
            "deploy.get_deploy_steps", {"node": agent_node(task.node), "ports": [agent_port(p) for p in task.ports]}
        )
        groups = result.get("deploy_steps") if isinstance(result, dict) else None
        if not isinstance(groups, dict):
            raise errors.AgentError(f"The agent of node {task.node['uuid']} sent no deploy steps: {result!r:.300}")
        steps = [s for group in groups.values() if isinstance(group, list) for s in group if isinstance(s, dict)]
        if not any(s.get("interface") == "deploy" and s.get("step") == "write_image" for s in steps):
            raise errors.AgentError(
                f"The agent of node {task.node['uuid']} offers no deploy.write_image step "
                f"(it offers {sorted(str(s.get('step')) for s in steps)})"
            )
        versions = result.get(MANAGER_VERSION) or {}
        if not isinstance(versions, dict):
            raise errors.AgentError(f"The agent of node {task.node['uuid']} sent bad hardware manager versions")
        await task.save_internal_info({CACHED_DEPLOY_STEPS: steps, MANAGER_VERSION: versions})
        return versions

    def _outcome(self, task: base.Task, result: dict[str, Any]) -> str | None:
        failure = command_failure(result)
        if failure is not None:
            raise errors.ImageError(f"Writing the image failed: {failure}")
        if result.get("command_status") == "SUCCEEDED":
            return "resume"
        return None

    async def finish_deploy(self, task: base.Task) -> None:
        """After write_image: the agent steps Ironic runs, in order."""
        for step in self.FINISH_STEPS:
            await getattr(self, step)(task)

    FINISH_STEPS = ("prepare_instance_boot", "tear_down_agent", "boot_instance")

    async def prepare_instance_boot(self, task: base.Task) -> None:
        """Partition UUIDs from the agent, then the boot device for the instance."""
        uuids = await self._client(task).run_sync("standby.get_partition_uuids", {}) or {}
        await task.save_internal_info(
            {
                "is_whole_disk_image": not is_partition_image(task.node),
                "root_uuid_or_disk_id": uuids.get("root uuid"),
            }
        )
        await task.driver.boot.prepare_instance(task)

    async def tear_down_agent(self, task: base.Task) -> None:
        if task.node.get("disable_power_off"):
            # API 1.95: the agent keeps running until boot_instance reboots into the instance.
            return
        await self._power_off_through_agent(task, self._client(task))

    async def boot_instance(self, task: base.Task) -> None:
        if task.node.get("disable_power_off"):
            # API 1.95: the agent was not powered off (tear_down_agent), so reboot into the instance.
            await task.driver.power.reboot(task)
        else:
            await task.driver.power.set_power_state(task, states.POWER_ON)
        await task.save_fields({"power_state": states.POWER_ON})

    async def _power_off_through_agent(self, task: base.Task, client: AgentClient) -> None:
        """Ask the agent to sync and power off; fall back to a hard power off."""
        try:
            await client.run_sync("standby.sync", {})
            await client.execute("standby.power_off", {}, wait=False)
        except errors.AgentError as exc:
            LOG.info("agent power off failed, using the BMC node_uuid=%s reason=%s", task.node["uuid"], exc.message)
        deadline = time.monotonic() + float(self.options.get("agent_power_off_timeout", 30.0))
        while time.monotonic() < deadline:
            if await task.driver.power.get_power_state(task) == states.POWER_OFF:
                return
            await asyncio.sleep(0.5)
        LOG.info("soft power off timed out, forcing it node_uuid=%s", task.node["uuid"])
        await task.driver.power.set_power_state(task, states.POWER_OFF)

    async def tear_down(self, task: base.Task) -> str:
        if not task.node.get("disable_power_off"):  # API 1.95: cleaning's reboot ends the instance instead
            await task.driver.power.set_power_state(task, states.POWER_OFF)
            await task.save_fields({"power_state": states.POWER_OFF})
        await task.save_internal_info(
            {}, remove=(*AGENT_KEYS, "is_whole_disk_image", "root_uuid_or_disk_id", "deploy_started_at")
        )
        return "deleted"


async def boot_volume_instance(task: base.Task) -> None:
    """Seed 004's deploy without an image (scenarios 1, 2, 3, 5): the volumes
    are attached, so power off, point the next boot at the volume (iPXE's SAN
    or NFS script, or the disk the HBA presents) and power on."""
    await task.driver.power.set_power_state(task, states.POWER_OFF)
    await task.save_fields({"power_state": states.POWER_OFF})
    await task.driver.boot.prepare_instance(task)
    await task.driver.power.set_power_state(task, states.POWER_ON)
    await task.save_fields({"power_state": states.POWER_ON})


async def _write_image_command(client: AgentClient) -> dict[str, Any] | None:
    """This ramdisk's write_image command, if one was already sent (the agent
    keeps its commands until it reboots, and a reboot starts a new deploy)."""
    for command in await client.commands():
        if command.get("command_name") == "execute_deploy_step":
            return command
    return None
