"""A power change in the background, and its resumption.

The api answers 202 once the target is recorded (``target_power_state``);
this flow drives the BMC and records the outcome with an event. A node
adopted with a target still set gets the same power action again: setting
a power state the machine already has is a no-op at the BMC.
"""

from __future__ import annotations

from services.common import states
from services.common.db.outage import is_unavailable
from services.conductor import related_nodes
from services.conductor.drivers.base import Task
from services.conductor.flows.context import FlowContext, error_text


def final_state(target: str) -> str:
    """What the node's power_state will be once ``target`` is done."""
    return states.POWER_ON if target in (states.POWER_ON, states.REBOOT, states.SOFT_REBOOT) else states.POWER_OFF


async def change(ctx: FlowContext, task: Task, target: str, timeout: int | None = None) -> None:
    final = final_state(target)
    storage = task.driver.storage
    # Seed 004: an active node's volumes follow its power (the storage's toggle option).
    toggle = (
        target in (states.POWER_ON, states.POWER_OFF, states.SOFT_POWER_OFF)
        and task.node["provision_state"] == states.ACTIVE
        and bool(task.volume_targets)
        and storage.power_toggles_attachments(task)
    )
    try:
        if final == states.POWER_ON:
            if toggle:
                await storage.attach_volumes(task)
            # A netbooting instance gets its boot media attached again first (virtual media).
            await task.driver.boot.before_power_on(task)
        if target == states.REBOOT:
            await task.driver.power.reboot(task, timeout)
        else:
            await related_nodes.before_power_action(ctx.config, task, target)  # parent on / children off
            await task.driver.power.set_power_state(task, target, timeout)
        if final == states.POWER_OFF and toggle:
            await storage.detach_volumes(task)
        changes = {"power_state": final, "target_power_state": None}
        message = f"power state changed to {final}"
        severity = "INFO"
    except Exception as exc:
        if is_unavailable(exc):
            raise
        message = f"Failed to change power state to '{target}' by '{target}': {error_text(exc)}"
        changes = {"target_power_state": None, "last_error": message}
        severity = "ERROR"
    await ctx.save_with_event(task, changes, event="power", message=message, severity=severity, event_type="power")


async def resume(ctx: FlowContext, task: Task) -> None:
    """Finish the power change recorded in ``target_power_state`` (a reboot
    that was cut short is finished as "power on")."""
    target = task.node["target_power_state"]
    if target:
        await change(ctx, task, target)
