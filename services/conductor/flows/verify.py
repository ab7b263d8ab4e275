"""Verification (``manage`` from enroll): the BMC answers and reports a power state.

As Ironic's verify does, it also caches the node's BIOS settings and firmware
components (API 1.86), best effort: an interface that cannot read them does not
stop the node being managed (``GET /v1/nodes/{id}/bios`` or ``/firmware`` then
stays as it was).
"""

from __future__ import annotations

import logging

from services.common import errors
from services.conductor.drivers.base import Task
from services.conductor.flows.context import FlowContext, error_text, guarded

LOG = logging.getLogger(__name__)


async def start(ctx: FlowContext, task: Task) -> None:
    async def run() -> None:
        await task.driver.power.validate(task)
        await task.driver.management.validate(task)
        power = await task.driver.power.get_power_state(task)
        await cache_bios_settings(task)
        note = await ctx.cache_firmware(task)
        await ctx.transition(task, "done", changes={"power_state": power}, note=note, release=True)

    await guarded(ctx, task, "Verification", run())


resume = start


async def cache_bios_settings(task: Task) -> None:
    """Ironic's ``node_cache_bios_settings``: never fails the flow it is part of."""
    try:
        await task.driver.bios.cache_bios_settings(task)
    except errors.UnsupportedDriverExtension as exc:
        LOG.info("BIOS settings not cached node_uuid=%s reason=%s", task.node["uuid"], exc.message)
    except errors.FerrumError as exc:
        LOG.warning("caching BIOS settings failed node_uuid=%s reason=%s", task.node["uuid"], error_text(exc))
