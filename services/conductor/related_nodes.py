"""A node acting on its parent or its children (API 1.83 ``parent_node``).

Two things need another node's lock while a node's own is held: steps run on
the children (``child_steps``) and the power coupling Ironic applies in
``node_power_action``, which lives here:

- powering a child **on** first powers its parent on, unless the child's
  ``driver_info.has_dedicated_power_supply`` is true (a blade draws its power
  from the chassis, a DPU from its host);
- powering a parent **off** first powers off each child that is not off and
  has no dedicated power supply;
- a reboot does neither.

A parent recorded as powered on is left alone without taking its lock (as
Ironic reads it under a shared lock), so a parent running steps on its
children can still have a child powered on. The other node is locked through the task manager like any operation, with
``child_node_locked_retry_attempts`` tries ``child_node_locked_retry_interval``
apart; one still locked fails the power action with a clear error. A node
with no parent pays nothing on power on; a power off costs one query for the
children.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from services.common import errors, states
from services.common.config import ConductorConfig
from services.conductor.drivers.base import Task


@contextlib.asynccontextmanager
async def locked(config: ConductorConfig, task: Task, node_uuid: str, purpose: str) -> AsyncIterator[Task]:
    """Another node's task, locked for ``purpose`` while ``task``'s lock is held;
    a lock held elsewhere is tried again a few times before NodeLocked."""
    if task.acquire_node is None:
        raise RuntimeError("acting on a related node needs a locked task")
    attempts = max(1, config.child_node_locked_retry_attempts)
    for attempt in range(1, attempts + 1):
        # Only taking the lock is retried: a NodeLocked from the work done under it
        # (a grandchild's lock) belongs to the caller.
        held = contextlib.AsyncExitStack()
        try:
            other = await held.enter_async_context(task.acquire_node(node_uuid, purpose))
        except errors.NodeLocked:
            if attempt == attempts:
                raise
            await asyncio.sleep(config.child_node_locked_retry_interval)
            continue
        async with held:
            yield other
        return


def dedicated_power(task: Task) -> bool:
    """Whether the node has its own power supply (no coupling to its parent)."""
    return bool((task.node["driver_info"] or {}).get("has_dedicated_power_supply"))


async def before_power_action(config: ConductorConfig, task: Task, target: str) -> None:
    """What must happen to the parent or the children before ``task``'s node gets ``target``."""
    if target == states.POWER_ON and task.node["parent_node"] and not dedicated_power(task):
        await _parent_on(config, task)
    elif target == states.POWER_OFF and task.child_nodes is not None:
        for child in await task.child_nodes():
            await _child_off(config, task, child)


async def _parent_on(config: ConductorConfig, task: Task) -> None:
    parent = str(task.node["parent_node"])
    if task.peek_node is not None and (await task.peek_node(parent))["power_state"] == states.POWER_ON:
        return  # on already, as Ironic sees under a shared lock: no need to take the parent's
    purpose = f"power on parent node for child node {task.node['uuid']}"
    try:
        async with locked(config, task, parent, purpose) as parent_task:
            if await parent_task.driver.power.get_power_state(parent_task) != states.POWER_ON:
                await set_power(config, parent_task, states.POWER_ON)
    except errors.NodeLocked as exc:
        raise errors.NodeLocked(f"Cannot power on parent node {parent} of node {task.node['uuid']}: {exc}") from None


async def _child_off(config: ConductorConfig, task: Task, child: str) -> None:
    purpose = f"power off child node of parent node {task.node['uuid']}"
    try:
        async with locked(config, task, child, purpose) as child_task:
            if dedicated_power(child_task):
                return
            if await child_task.driver.power.get_power_state(child_task) != states.POWER_OFF:
                await set_power(config, child_task, states.POWER_OFF)
    except errors.NodeLocked as exc:
        raise errors.NodeLocked(f"Cannot power off child node {child} of node {task.node['uuid']}: {exc}") from None


async def set_power(config: ConductorConfig, task: Task, target: str) -> None:
    """Power a related node on or off now (its own relations first), recording its power_state."""
    if target == states.POWER_OFF and task.node["disable_power_off"]:
        raise errors.InvalidParameterValue(
            f"Node {task.node['uuid']} has disable_power_off set; it cannot be powered off"
        )
    await before_power_action(config, task, target)
    if target == states.POWER_ON:
        await task.driver.boot.before_power_on(task)
    await task.driver.power.set_power_state(task, target, None)
    await task.save_fields({"power_state": target, "target_power_state": None})
