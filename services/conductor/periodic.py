"""Periodic work of a conductor: registry heartbeat, take-over of dead
conductors' nodes (services/conductor/takeover.py), call-back timeouts,
power-state sync and the console proxies of the nodes it owns
(services/conductor/consoles.py)."""

from __future__ import annotations

import asyncio
import datetime
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from services.common import errors, states
from services.common.db.conductors import ConductorRepository
from services.common.db.outage import is_unavailable
from services.common.hashring import ConductorRings
from services.conductor.console_tail import last_console_line
from services.conductor.drivers.base import Task
from services.conductor.flows import clean, inspect, rescue, service
from services.conductor.flows.context import error_text

if TYPE_CHECKING:
    from services.conductor.manager import ConductorManager

LOG = logging.getLogger(__name__)
# Nodes read (whole, with ports and volumes) per round trip by the power sync; their BMCs are
# then asked power_sync_workers at a time.
SYNC_BATCH = 500


class PeriodicWork:
    def __init__(self, manager: ConductorManager, *, registration: dict[str, Any]) -> None:
        self.manager = manager
        self.config = manager.config
        self.conductors = ConductorRepository(manager.pool)
        self.registration = registration
        self.takeover = manager.takeover
        # Failed power reads in a row, per node, since this conductor started (Ironic's sync count).
        self._power_sync_failures: dict[str, int] = {}
        self._jobs: list[asyncio.Task[None]] = []

    def start(self) -> None:
        c = self.config
        self._jobs = [
            asyncio.create_task(self._every(c.heartbeat_interval, self.heartbeat), name="heartbeat"),
            asyncio.create_task(self._every(c.liveness_check_interval, self.takeover.check), name="take-over"),
            asyncio.create_task(self._every(c.timeout_check_interval, self.check_callback_timeouts), name="timeouts"),
            asyncio.create_task(self._every(c.power_sync_interval, self.sync_power_states), name="power-sync"),
            asyncio.create_task(
                self._every(c.console_check_interval, self.manager.consoles.reconcile), name="consoles"
            ),
        ]

    async def stop(self) -> None:
        for job in self._jobs:
            job.cancel()
        await asyncio.gather(*self._jobs, return_exceptions=True)

    async def _every(self, interval: float, work: Callable[[], Awaitable[Any]]) -> None:
        while True:
            await asyncio.sleep(interval)
            try:
                await work()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                name = getattr(work, "__name__", work)
                if is_unavailable(exc):
                    LOG.warning("periodic %s: database unavailable; will retry", name)
                else:
                    LOG.exception("periodic %s failed; will retry", name)

    async def heartbeat(self) -> None:
        if not await self.conductors.heartbeat(self.manager.hostname):
            await self.conductors.register(**self.registration)

    async def rings(self) -> ConductorRings:
        return ConductorRings(await self.takeover.alive())

    async def recover_dead(self) -> int:
        """One take-over round now (tests and the periodic job use the same code)."""
        return await self.takeover.check()

    async def check_callback_timeouts(self) -> int:
        """Nodes waiting too long for their ramdisk fail with a clear last_error."""
        now = datetime.datetime.now(datetime.UTC)
        failed = 0
        for state, timeout in (
            (states.DEPLOYWAIT, self.config.deploy_callback_timeout),
            (states.CLEANWAIT, self.config.clean_callback_timeout),
            (states.RESCUEWAIT, self.config.rescue_callback_timeout),
            (states.SERVICEWAIT, self.config.service_callback_timeout),
            (states.INSPECTWAIT, self.config.inspect_wait_timeout),
        ):
            cutoff = now - datetime.timedelta(seconds=timeout)
            for node in await self.manager.nodes.list_in_states([state], updated_before=cutoff):
                if node["maintenance"]:
                    continue
                try:
                    async with self.manager.tasks.acquire_in_states(node["uuid"], "callback timeout", (state,)) as task:
                        if task is None:
                            continue  # the wait ended since the scan; the node was not locked for it
                        # Re-read under the lock: a heartbeat may have arrived since the scan.
                        fresh = task.node["provision_updated_at"]
                        if fresh is None or fresh < cutoff:
                            await self._time_out(task, state, timeout)
                            failed += 1
                except errors.NodeLocked:
                    continue
        return failed

    async def _time_out(self, task: Task, state: str, timeout: float) -> None:
        """Each wait state's flow fails its own way (clean failed names the step, rescue powers off)."""
        ctx = self.manager.states
        if state == states.CLEANWAIT:
            await clean.timed_out(ctx, task)
        elif state == states.RESCUEWAIT:
            await rescue.timed_out(ctx, task)
        elif state == states.SERVICEWAIT:
            await service.timed_out(ctx, task)
        elif state == states.INSPECTWAIT:
            await inspect.timed_out(ctx, task)
        else:
            reason = (
                f"Timeout reached while waiting for callback for node {task.node['uuid']} "
                f'({int(timeout)} s in "{state}")'
            )
            if seen := await last_console_line(task):
                reason += f"; the console last showed: {seen}"
            await ctx.fail(task, reason)

    async def sync_power_states(self) -> int:
        """Record the BMC's power state for nodes this conductor owns.

        Ferrum records the hardware's state and logs a warning on drift (it does
        not force the node back); see docs/conductor.md. BMCs are asked
        ``power_sync_workers`` at a time. A node whose BMC fails
        ``power_state_sync_max_retries`` syncs in a row goes into maintenance
        with fault ``power failure``; the first good read after that takes it out.
        """
        rings = await self.rings()
        gate = asyncio.Semaphore(self.config.power_sync_workers)
        changed = 0
        after_id = 0
        while True:
            batch = await self.manager.nodes.list_for_sync(after_id=after_id, limit=SYNC_BATCH)
            if not batch:
                return changed
            after_id = batch[-1]["id"]
            mine = []
            for node in batch:
                owner = rings.owner(node["uuid"], node["driver"], node["conductor_group"])
                if owner and owner["hostname"] == self.manager.hostname:
                    mine.append(node)
            if not mine:
                continue
            tasks = await self.manager.tasks.shared_many(mine)
            results = await asyncio.gather(
                *(self._sync_power(n["uuid"], t, gate) for n, t in zip(mine, tasks, strict=True))
            )
            changed += sum(results)

    async def _sync_power(self, node_uuid: str, task: Task | errors.FerrumError, gate: asyncio.Semaphore) -> bool:
        """One node's sync; True when its recorded power state changed. The node was read
        with its batch; only a node whose state differs is read again (and written)."""
        async with gate:
            try:
                if isinstance(task, errors.FerrumError):
                    raise task
                actual = await task.driver.power.get_power_state(task)
            except Exception as exc:
                if is_unavailable(exc):
                    raise
                await self._power_sync_failed(node_uuid, exc)
                return False
            await self._sync_health(task)
        self._power_sync_failures.pop(node_uuid, None)
        seen = task.node
        if actual == seen["power_state"] and not (seen["maintenance"] and seen.get("fault") == "power failure"):
            return False  # the usual case: nothing to record, no query
        node = await self.manager.nodes.get(node_uuid)  # it may have changed while the BMC answered
        if node["maintenance"] and node.get("fault") == "power failure" and not node["reservation"]:
            recovered = await self.manager.nodes.update(
                node_uuid, {"maintenance": False, "maintenance_reason": None, "fault": None, "power_state": actual}
            )
            await self.manager.states.record_event(
                recovered,
                "power-sync",
                f"the BMC answers again (power state {actual}): out of maintenance",
                event_type="power",
            )
            return actual != node["power_state"]
        if actual != node["power_state"] and not node["reservation"]:
            LOG.warning("power state drift node_uuid=%s db=%s hardware=%s", node_uuid, node["power_state"], actual)
            saved = await self.manager.nodes.update(node_uuid, {"power_state": actual})
            await self.manager.states.record_event(
                saved,
                "power-sync",
                f"power state changed outside Ferrum: {node['power_state']} -> {actual}",
                severity="WARNING",
                event_type="power",
            )
            return True
        return False

    async def _sync_health(self, task: Task) -> None:
        """Record the BMC's health report (REST 1.109) when it changed, with a history entry,
        as Ironic's power sync does. A failed read keeps the last value: the power read
        just succeeded, so the BMC is there, and one missed report is no news."""
        node = task.node
        try:
            health = await task.driver.management.get_node_health(task)
        except Exception as exc:
            if is_unavailable(exc):
                raise
            LOG.warning("health read failed node_uuid=%s reason=%s", node["uuid"], exc)
            return
        if health == node.get("health"):
            return
        saved = await self.manager.nodes.update(node["uuid"], {"health": health})
        task.node = {**node, "health": health}
        await self.manager.states.record_event(
            saved,
            "health-sync",
            f"health changed: {node.get('health')} -> {health}",
            severity="INFO" if health in (None, "OK") else "WARNING",
            event_type="health",
        )

    async def _power_sync_failed(self, node_uuid: str, exc: Exception) -> None:
        count = self._power_sync_failures.get(node_uuid, 0) + 1
        self._power_sync_failures[node_uuid] = count
        LOG.warning("power sync failed node_uuid=%s attempt=%d reason=%s", node_uuid, count, exc)
        if count < self.config.power_state_sync_max_retries:
            return
        node = await self.manager.nodes.get(node_uuid)
        if node["maintenance"] or node["reservation"]:
            return
        reason = (
            f"During sync_power_state, max retries exceeded for node {node_uuid}: the BMC failed "
            f"{count} power state reads in a row. Switching the node to maintenance. Error: {error_text(exc)}"
        )
        saved = await self.manager.nodes.update(
            node_uuid, {"maintenance": True, "maintenance_reason": reason, "fault": "power failure"}
        )
        await self.manager.states.record_event(saved, "power-sync", reason, severity="ERROR", event_type="power")
