"""The agent's commands, named ``<extension>.<command>`` as IPA names them.

Each command is a coroutine taking the agent and its params. *Sync* commands
finish inside the POST; *async* ones run in the background and the conductor
polls ``GET /v1/commands/{id}`` (or posts with ``wait=true``). Params are
checked before anything runs: bad params answer 400 and change nothing.
A command that fails after it started is a FAILED result whose
``command_error`` has IPA's shape ``{type, code, message, details}``.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import io
import json
import logging
import os
import tarfile
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from services.agent import checksum, erase, hardware, imagewrite, partition_image, partitions
from services.agent import configdrive as configdrives
from services.agent.iscsi_target import IscsiTarget, TargetSpec
from services.common import errors, password_hash

if TYPE_CHECKING:
    from services.agent.agent import Agent

LOG = logging.getLogger(__name__)
HARDWARE_MANAGER = "GenericHardwareManager"
HARDWARE_MANAGER_VERSION = "1.2"


@dataclass
class CommandResult:
    """One command as ``GET /v1/commands/{id}`` shows it."""

    name: str
    params: dict[str, Any]
    id: str = field(default_factory=lambda: str(uuid.uuid4()))
    status: str = "RUNNING"
    result: Any = None
    error: dict[str, Any] | None = None
    progress: imagewrite.Progress | None = None
    created: float = field(default_factory=time.time)
    done: asyncio.Event = field(default_factory=asyncio.Event)

    def succeed(self, result: Any) -> None:
        self.status, self.result = "SUCCEEDED", result
        self.done.set()

    def fail(self, exc: BaseException) -> None:
        self.status = "FAILED"
        message = getattr(exc, "message", None) or str(exc) or type(exc).__name__
        self.error = {
            "type": type(exc).__name__,
            "code": getattr(exc, "http_status", 500),
            "message": message,
            "details": message,
        }
        self.done.set()

    def as_dict(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "id": self.id,
            "command_name": self.name,
            "command_status": self.status,
            "command_result": self.result,
            "command_error": self.error,
        }
        if self.progress is not None:
            body["deploy_progress"] = self.progress.as_dict()
        return body


Handler = Callable[["Agent", dict[str, Any], CommandResult], Awaitable[Any]]
Validator = Callable[["Agent", dict[str, Any]], None]


@dataclass(frozen=True)
class Command:
    handler: Handler
    is_async: bool
    validate: Validator | None = None


# ---- params checks (run before a command starts) -------------------------------------------


def _validate_prepare_image(agent: Agent, params: dict[str, Any]) -> None:
    image_info = params.get("image_info")
    checksum.validate_image_info(image_info, allow_md5=agent.allow_md5())
    assert isinstance(image_info, Mapping)
    image_type = image_info.get("image_type") or "whole-disk"
    if image_type not in ("whole-disk", "partition"):
        raise errors.InvalidParameterValue(f"image_type {str(image_type)[:32]!r} is not whole-disk or partition")
    if image_type == "partition":
        partition_image.sizes_from_image_info(dict(image_info), configdrive=bool(params.get("configdrive")))
    drive = params.get("configdrive")
    if drive is not None and not isinstance(drive, str):
        raise errors.InvalidParameterValue("configdrive must be a URL or a gzip+base64 string")


def _validate_deploy_step(agent: Agent, params: dict[str, Any]) -> None:
    step = params.get("step")
    if not isinstance(step, Mapping) or not step.get("step"):
        raise errors.InvalidParameterValue("execute_deploy_step needs a 'step' object with a 'step' name")
    name, interface = step["step"], step.get("interface", "deploy")
    if not isinstance(name, str) or not isinstance(interface, str):
        raise errors.InvalidParameterValue("the deploy step's 'step' and 'interface' must be strings")
    if interface != "deploy" or name not in DEPLOY_STEPS:
        raise errors.InvalidParameterValue(f"unknown deploy step {interface[:64]}.{name[:64]}")
    args = _step_args(step)
    if name == "write_image":
        _validate_prepare_image(agent, {"image_info": args.get("image_info"), "configdrive": args.get("configdrive")})


def _step_args(step: Mapping[str, Any]) -> Mapping[str, Any]:
    """A step's ``args``: absent or null means none; anything but an object is refused."""
    args = step.get("args")
    if args is None:
        return {}
    if not isinstance(args, Mapping):
        raise errors.InvalidParameterValue("the step's 'args' must be an object")
    return args


# ---- deploy -------------------------------------------------------------------------------

DEPLOY_STEPS: dict[str, dict[str, Any]] = {
    "write_image": {
        "step": "write_image",
        "priority": 0,
        "interface": "deploy",
        "reboot_requested": False,
        "argsinfo": {
            "image_info": {"description": "image to write", "required": True},
            "configdrive": {"description": "config drive (URL or gzip+base64)", "required": False},
        },
    },
}


async def get_deploy_steps(agent: Agent, params: dict[str, Any], cmd: CommandResult) -> Any:
    agent.remember_node(params.get("node"))
    return {
        "deploy_steps": {HARDWARE_MANAGER: list(DEPLOY_STEPS.values())},
        "hardware_manager_version": {HARDWARE_MANAGER: HARDWARE_MANAGER_VERSION},
    }


async def execute_deploy_step(agent: Agent, params: dict[str, Any], cmd: CommandResult) -> Any:
    agent.remember_node(params.get("node"))
    step = dict(params["step"])
    args = _step_args(step)
    result = await _prepare_image(agent, args["image_info"], args.get("configdrive"), cmd)
    return {"deploy_result": {"result": result}, "deploy_step": step}


# ---- standby ------------------------------------------------------------------------------


async def prepare_image(agent: Agent, params: dict[str, Any], cmd: CommandResult) -> Any:
    return await _prepare_image(agent, params["image_info"], params.get("configdrive"), cmd)


async def _prepare_image(agent: Agent, image_info: dict[str, Any], configdrive: str | None, cmd: CommandResult) -> str:
    disk = await agent.root_disk()
    progress = imagewrite.Progress(image_id=str(image_info.get("id")))
    cmd.progress = agent.progress = progress
    agent.heartbeat_soon()  # progress heartbeats run on their own, shorter interval
    try:
        slots = agent.options.write_slots
        if slots is not None and slots.locked():
            progress.stage = "queued"
        async with slots if slots is not None else contextlib.nullcontext():
            progress.started = time.monotonic()
            if image_info.get("image_type") == "partition":
                return await _prepare_partition_image(agent, image_info, configdrive, disk, progress)
            written = await imagewrite.write_image(
                agent.session,
                image_info,
                disk,
                progress=progress,
                allow_md5=agent.allow_md5(),
                tmp_dir=agent.options.tmp_dir,
                block_size=agent.options.write_block_size,
                depth=agent.options.write_depth,
                direct_io=agent.options.direct_io,
                conversion_slots=agent.options.conversion_slots,
                qcow2_stream=agent.options.qcow2_stream,
                tls=agent.tls,
            )
        LOG.info(
            "image written image=%s device=%s format=%s method=%s bytes=%d rate=%.0f",
            written.image_id,
            disk.name,
            written.format,
            written.method,
            written.bytes_written,
            progress.rate(),
        )
        configdrive = configdrive or image_info.get("configdrive")
        if configdrive:
            progress.stage = "configdrive"
            placement = await configdrives.write_config_drive(agent.session, disk.path, configdrive, tls=agent.tls)
            LOG.info("config drive written device=%s placement=%s", disk.name, placement)
        agent.partition_info = await partitions.partition_uuids(disk.path, disk.name)
    except BaseException:
        progress.stage, progress.finished = "failed", time.monotonic()
        raise
    progress.stage, progress.finished = "done", time.monotonic()
    root_uuid = agent.partition_info.get("root uuid")
    message = f"image ({written.image_id}) written to device {disk.name} root_uuid={root_uuid}"
    efi = agent.partition_info.get("efi system partition uuid")
    return message + (f" efi_system_partition_uuid={efi}" if efi else "")


async def _prepare_partition_image(
    agent: Agent, image_info: dict[str, Any], configdrive: str | None, disk: Any, progress: imagewrite.Progress
) -> str:
    try:
        done = await partition_image.write_partition_image(
            agent, image_info, configdrive or image_info.get("configdrive"), disk, progress
        )
        agent.root_fs_uuid = done.root_uuid
        agent.partition_info = {
            **await partitions.partition_uuids(disk.path, disk.name),
            "root uuid": done.root_uuid,
        }
    except BaseException:
        progress.stage, progress.finished = "failed", time.monotonic()
        raise
    progress.stage, progress.finished = "done", time.monotonic()
    LOG.info(
        "partition image written image=%s device=%s partitions=%s root_uuid=%s",
        done.written.image_id,
        disk.name,
        ",".join(f"{p.role}:{p.number}" for p in done.layout.partitions),
        done.root_uuid,
    )
    return f"image ({done.written.image_id}) written to device {disk.name} root_uuid={done.root_uuid}"


async def get_partition_uuids(agent: Agent, params: dict[str, Any], cmd: CommandResult) -> Any:
    disk = await agent.root_disk()
    info = await partitions.partition_uuids(disk.path, disk.name)
    if agent.root_fs_uuid:  # a partition image: its root file system, as IPA reports it
        info["root uuid"] = agent.root_fs_uuid
    agent.partition_info = info
    return {k: v for k, v in info.items() if k != "label"}


async def _sync_disks(agent: Agent) -> None:
    def sync_all() -> None:
        for disk in agent.options.disks:
            try:
                fd = os.open(disk.path, os.O_RDONLY)
            except OSError:
                continue
            try:
                os.fsync(fd)
            finally:
                os.close(fd)

    await asyncio.to_thread(sync_all)


async def sync(agent: Agent, params: dict[str, Any], cmd: CommandResult) -> Any:
    await _sync_disks(agent)
    return None


async def power_off(agent: Agent, params: dict[str, Any], cmd: CommandResult) -> Any:
    await _sync_disks(agent)
    agent.schedule_power_action("power_off")
    return None


async def run_image(agent: Agent, params: dict[str, Any], cmd: CommandResult) -> Any:
    await _sync_disks(agent)
    agent.schedule_power_action("reboot")
    return None


# ---- clean --------------------------------------------------------------------------------

CLEAN_STEPS: dict[str, dict[str, Any]] = {
    "erase_devices_metadata": {
        "step": "erase_devices_metadata",
        "priority": 99,
        "interface": "deploy",
        "reboot_requested": False,
        "abortable": True,
    },
    # Whole-disk erase is opt-in (priority 0), as most Ironic deployments configure it.
    "erase_devices": {
        "step": "erase_devices",
        "priority": 0,
        "interface": "deploy",
        "reboot_requested": False,
        "abortable": True,
    },
}


def _validate_clean_step(agent: Agent, params: dict[str, Any]) -> None:
    step = params.get("step")
    name = step.get("step") if isinstance(step, Mapping) else step
    if not isinstance(name, str) or name not in CLEAN_STEPS:
        raise errors.InvalidParameterValue(f"unknown clean step {str(name)[:64]!r}")


async def get_clean_steps(agent: Agent, params: dict[str, Any], cmd: CommandResult) -> Any:
    agent.remember_node(params.get("node"))
    return {
        "clean_steps": {HARDWARE_MANAGER: list(CLEAN_STEPS.values())},
        "hardware_manager_version": {HARDWARE_MANAGER: HARDWARE_MANAGER_VERSION},
    }


async def execute_clean_step(agent: Agent, params: dict[str, Any], cmd: CommandResult) -> Any:
    step = dict(params["step"])
    action = erase.erase_metadata if step["step"] == "erase_devices_metadata" else erase.erase_all
    for disk in agent.options.disks:
        await asyncio.to_thread(action, disk.path)
    agent.progress = None
    agent.partition_info = {}
    return {"clean_result": None, "clean_step": step}


# ---- rescue -------------------------------------------------------------------------------


def _validate_finalize_rescue(agent: Agent, params: dict[str, Any]) -> None:
    password = params.get("rescue_password")
    if not isinstance(password, str) or not password:
        raise errors.InvalidParameterValue("finalize_rescue needs a non-empty 'rescue_password' string")
    hashed = params.get("hashed", False)
    if not isinstance(hashed, bool):
        raise errors.InvalidParameterValue("finalize_rescue's 'hashed' must be a boolean")
    if hashed and not password_hash.is_hashed(password):
        raise errors.InvalidParameterValue("finalize_rescue got 'hashed': true but no SHA-crypt hash")


async def finalize_rescue(agent: Agent, params: dict[str, Any], cmd: CommandResult) -> Any:
    """IPA's rescue.finalize_rescue: give the rescue login the password hash
    (an older conductor may send clear text with ``hashed`` false; it is hashed
    here, so clear text never reaches the login), then stop calling back: the
    node is the tenant's now."""
    password = params["rescue_password"]
    hashed = password if params.get("hashed") else password_hash.hash_password(password, "sha512")
    hook = agent.options.set_rescue_password
    if hook is None:
        raise errors.AgentError("this agent has no rescue login to hand the password to")
    await hook(hashed)
    agent.stop_callbacks("rescue")
    return None


# ---- iscsi (seed 002's deploy: the conductor writes the disk) ----------------------------------

ISCSI_STRINGS = ("iqn", "key", "chap_username", "chap_password", "initiator_iqn")


def _validate_start_iscsi_target(agent: Agent, params: dict[str, Any]) -> None:
    for name in ISCSI_STRINGS:
        value = params.get(name)
        if not isinstance(value, str) or not value or len(value) > 255:
            raise errors.InvalidParameterValue(f"start_iscsi_target needs a non-empty '{name}' string")
    if params.get("callback", "pass_deploy_info") not in ("pass_deploy_info", "heartbeat"):
        raise errors.InvalidParameterValue("start_iscsi_target's 'callback' must be pass_deploy_info or heartbeat")
    if agent.iscsi_target is not None:
        raise errors.InvalidParameterValue("an iSCSI target is already running: stop it first")


async def start_iscsi_target(agent: Agent, params: dict[str, Any], cmd: CommandResult) -> Any:
    """Serve the root disk (root device hints apply) as an iSCSI target only
    the conductor can log in to, then call back with where it is. A failure
    is reported the same way (``error``), so the deploy fails at once instead
    of at its timeout."""
    agent.remember_node(params.get("node"))
    style = str(params.get("callback") or "pass_deploy_info")
    report: dict[str, Any] = {"key": params["key"], "iqn": params["iqn"]}
    try:
        disk = await agent.root_disk()
        target = IscsiTarget(
            TargetSpec(
                iqn=params["iqn"],
                backing_path=disk.path,
                chap_username=params["chap_username"],
                chap_password=params["chap_password"],
                initiator_iqn=params["initiator_iqn"],
                listen_host=agent.options.iscsi_listen_host or agent.options.listen_host,
                portal_port=agent.options.iscsi_portal_port,
            ),
            work_dir=agent.options.tmp_dir or None,
        )
        portal = await target.start()
    except Exception as exc:
        report["error"] = getattr(exc, "message", None) or str(exc) or type(exc).__name__
        await agent.pass_deploy_info(report, style)
        raise
    agent.iscsi_target = target
    report.update(address=agent.advertise_host, port=agent.options.iscsi_advertise_port or portal.port)
    LOG.info("iscsi target up iqn=%s device=%s portal=%s:%s", params["iqn"], disk.name, portal.address, portal.port)
    await agent.pass_deploy_info(report, style)
    return {"iscsi_target_iqn": params["iqn"], "address": report["address"], "port": report["port"]}


async def stop_iscsi_target(agent: Agent, params: dict[str, Any], cmd: CommandResult) -> Any:
    await agent.stop_iscsi_target()
    await _sync_disks(agent)
    return None


# ---- image / poll -------------------------------------------------------------------------


async def install_bootloader(agent: Agent, params: dict[str, Any], cmd: CommandResult) -> Any:
    # A whole-disk image carries its own boot loader (seed 001: the image is just blocks).
    return None


async def get_hardware_info(agent: Agent, params: dict[str, Any], cmd: CommandResult) -> Any:
    disks = await asyncio.to_thread(hardware.describe_disks, agent.options.disks)
    return hardware.inventory(
        disks,
        agent.options.macs,
        hostname=agent.options.hostname,
        ipv4_address=agent.advertise_host,
        facts=agent.options.hardware,
    )


async def collect_system_logs(agent: Agent, params: dict[str, Any], cmd: CommandResult) -> Any:
    """IPA's log bundle (base64 of a gzipped tar). The agent has no system to
    collect from, so the bundle holds what it knows: its status, inventory
    and command history, which is what a failed deploy needs explained."""
    disks = await asyncio.to_thread(hardware.describe_disks, agent.options.disks)
    files = {
        "status.json": agent.status(),
        "node.json": {
            "node_uuid": agent.node_uuid,
            "last_error": agent.last_error,
            "deploy_progress": agent.progress.as_dict() if agent.progress else None,
        },
        "inventory.json": hardware.inventory(disks, agent.options.macs, hostname=agent.options.hostname),
        "commands.json": [c.as_dict() for c in agent.command_results() if c is not cmd],
    }

    def bundle() -> str:
        out = io.BytesIO()
        with tarfile.open(fileobj=out, mode="w:gz") as tar:
            for name, content in files.items():
                data = json.dumps(content, indent=2, default=str).encode()
                info = tarfile.TarInfo(name)
                info.size, info.mtime = len(data), int(time.time())
                tar.addfile(info, io.BytesIO(data))
        return base64.b64encode(out.getvalue()).decode()

    return {"system_logs": await asyncio.to_thread(bundle)}


COMMANDS: dict[str, Command] = {
    "deploy.get_deploy_steps": Command(get_deploy_steps, is_async=False),
    "deploy.execute_deploy_step": Command(execute_deploy_step, is_async=True, validate=_validate_deploy_step),
    "standby.prepare_image": Command(prepare_image, is_async=True, validate=_validate_prepare_image),
    "standby.get_partition_uuids": Command(get_partition_uuids, is_async=False),
    "standby.sync": Command(sync, is_async=False),
    "standby.power_off": Command(power_off, is_async=True),
    "standby.run_image": Command(run_image, is_async=True),
    "image.install_bootloader": Command(install_bootloader, is_async=True),
    "poll.get_hardware_info": Command(get_hardware_info, is_async=False),
    "log.collect_system_logs": Command(collect_system_logs, is_async=False),
    "clean.get_clean_steps": Command(get_clean_steps, is_async=False),
    "rescue.finalize_rescue": Command(finalize_rescue, is_async=False, validate=_validate_finalize_rescue),
    "clean.execute_clean_step": Command(execute_clean_step, is_async=True, validate=_validate_clean_step),
    "iscsi.start_iscsi_target": Command(start_iscsi_target, is_async=True, validate=_validate_start_iscsi_target),
    "iscsi.stop_iscsi_target": Command(stop_iscsi_target, is_async=False),
}
