"""Cleaning, manual (``clean`` verb from manageable) and automated (after tear down).

Resuming a node caught in ``cleaning`` runs cleaning again from the start.
"""

from __future__ import annotations

from services.common import states
from services.conductor.drivers.base import Task
from services.conductor.flows.context import FlowContext, guarded


async def start(ctx: FlowContext, task: Task) -> None:
    await guarded(ctx, task, "Cleaning", run_cleaning(ctx, task))


resume = start


async def run_cleaning(ctx: FlowContext, task: Task) -> None:
    node = task.node
    manual = node["target_provision_state"] == states.MANAGEABLE
    automated = node["automated_clean"] if node["automated_clean"] is not None else ctx.config.automated_clean
    if manual or automated:
        # Fake and no-op interfaces have no real steps; the vendor "log" step
        # of fake-hardware is the one trivial automated step (as in Ironic).
        await task.driver.power.validate(task)
    # The history says whether cleaning ran and, if not, which setting skipped it (Ironic logs the same).
    if manual or automated:
        note = f"{'manual' if manual else 'automated'} cleaning finished"
    else:
        setting = "the API" if node["automated_clean"] is False else "configuration"
        note = f"automated cleaning skipped: disabled via {setting}"
    if node["driver_internal_info"].get("cleaning_disable_ramdisk"):
        note += " (ramdisk disabled)"
    info = {
        k: v for k, v in node["driver_internal_info"].items() if k not in ("clean_steps", "cleaning_disable_ramdisk")
    }
    # A retired node never becomes available again: its cleaning ends in
    # manageable (API 1.61, as Ironic does).
    if node.get("retired") and not manual:
        note += "; the node is retired, so it stays manageable"
    event = "manage" if manual or node.get("retired") else "done"
    await ctx.transition(task, event, changes={"driver_internal_info": info}, note=note)
