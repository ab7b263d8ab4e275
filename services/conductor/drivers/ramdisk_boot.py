"""Booting the agent ramdisk, for every operation that needs it.

Deploying, cleaning, inspecting and rescuing all start the same way: forget
the previous agent (a new ramdisk brings a new one-time token and callback
URL), point the machine at the ramdisk, and power it on. The boot request is
recorded before it is sent, so a conductor that resumes the operation after
its owner died never reboots a machine whose ramdisk may already be up (its
agent may hold the token): it only powers on a machine that is still off.
"""

from __future__ import annotations

import time

from services.common import states
from services.conductor.drivers.base import Task

# driver_internal_info keys owned by one ramdisk boot; a new boot starts without them.
AGENT_KEYS = (
    "agent_secret_token",
    "agent_url",
    "agent_version",
    "agent_last_heartbeat",
    "deploy_phase",
    "agent_command_id",
    "deploy_progress",
    "agent_hardware",
    "agent_verify_ca",
    "ramdisk_boot_requested",
    "agent_cached_deploy_steps",
)
BOOT_REQUESTED = "ramdisk_boot_requested"
# The deploy steps the booted agent offered (direct.py reads them on its first heartbeat).
CACHED_DEPLOY_STEPS = "agent_cached_deploy_steps"


async def forget_agent(task: Task) -> None:
    """Drop what the last ramdisk left (token, URL, command), before a new boot or after one."""
    await task.save_internal_info({}, remove=AGENT_KEYS)


async def boot_ramdisk(task: Task, *, fresh: bool) -> None:
    """Boot the node into the agent ramdisk.

    ``fresh`` starts a new boot (the last agent's token and URL are
    forgotten); a resumed operation passes False and keeps what the agent of
    the boot in flight may already have sent.
    """
    if fresh:
        await forget_agent(task)
    await task.driver.boot.prepare_ramdisk(task, {})
    powered = await task.driver.power.get_power_state(task) == states.POWER_ON
    if task.node["driver_internal_info"].get(BOOT_REQUESTED):
        if not powered:
            await task.driver.power.set_power_state(task, states.POWER_ON)
    else:
        await task.save_internal_info({BOOT_REQUESTED: time.time()})
        if powered:
            await task.driver.power.reboot(task)
        else:
            await task.driver.power.set_power_state(task, states.POWER_ON)
    await task.save_fields({"power_state": states.POWER_ON})


async def power_off_ramdisk(task: Task) -> None:
    """End a ramdisk boot: power off, undo the boot preparation, forget the agent.

    A node with ``disable_power_off`` (API 1.95) is rebooted after the boot
    preparation is undone instead, as Ironic's tear_down_inband_cleaning: the
    ramdisk stops running and the machine never loses power."""
    keep_power = bool(task.node.get("disable_power_off"))
    if not keep_power:
        await task.driver.power.set_power_state(task, states.POWER_OFF)
        await task.save_fields({"power_state": states.POWER_OFF})
    await task.driver.boot.clean_up_ramdisk(task)
    await forget_agent(task)
    if keep_power:
        await task.driver.power.reboot(task)
        await task.save_fields({"power_state": states.POWER_ON})
