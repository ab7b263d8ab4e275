"""Periodic work of a conductor: registry heartbeat, recovery from dead
conductors, call-back timeouts and power-state sync.

Recovery follows ARCHITECTURE.md "Coordination": a node whose lock holder is
dead (stopped heartbeating, or its lease expired) is taken by whichever live
conductor gets there first; nodes in an ``*ing`` state go to their failure
state with a last_error that says why, others just lose the stale lock, and
active nodes newly owned by this conductor get ``take_over``.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from services.common import errors, states
from services.common.db.conductors import ConductorRepository
from services.common.db.events import EventRepository
from services.common.hashring import ConductorRings
from services.conductor.manager import ConductorManager

LOG = logging.getLogger(__name__)


class PeriodicWork:
    def __init__(self, manager: ConductorManager, *, registration: dict[str, Any]) -> None:
        self.manager = manager
        self.config = manager.config
        self.conductors = ConductorRepository(manager.pool)
        self.registration = registration
        self._jobs: list[asyncio.Task[None]] = []
        self._known_dead: set[str] = set()

    def start(self) -> None:
        c = self.config
        self._jobs = [
            asyncio.create_task(self._every(c.heartbeat_interval, self.heartbeat), name="heartbeat"),
            asyncio.create_task(self._every(c.heartbeat_interval, self.recover_dead), name="recover"),
            asyncio.create_task(self._every(c.timeout_check_interval, self.check_callback_timeouts), name="timeouts"),
            asyncio.create_task(self._every(c.power_sync_interval, self.sync_power_states), name="power-sync"),
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
            except Exception:
                LOG.exception("periodic %s failed; will retry", getattr(work, "__name__", work))

    async def heartbeat(self) -> None:
        if not await self.conductors.heartbeat(self.manager.hostname):
            await self.conductors.register(**self.registration)

    async def rings(self) -> ConductorRings:
        return ConductorRings(await self.conductors.list_alive(self.config.heartbeat_timeout))

    async def recover_dead(self) -> int:
        """Recover nodes locked by dead conductors or under expired leases."""
        dead = [c["hostname"] for c in await self.conductors.list_dead(self.config.heartbeat_timeout)]
        dead = [h for h in dead if h != self.manager.hostname]
        candidates = await self.manager.nodes.list_reserved_by(dead) if dead else []
        candidates += [
            n
            for n in await self.manager.nodes.list_expired_reservations()
            if n["reservation"] != self.manager.hostname and n["uuid"] not in {c["uuid"] for c in candidates}
        ]
        recovered = 0
        for node in candidates:
            if await self.recover_node(node):
                recovered += 1
        newly_dead = set(dead) - self._known_dead
        if newly_dead:
            await self.take_over_active(newly_dead)
            for hostname in newly_dead:
                await self.conductors.mark_offline(hostname)
        self._known_dead = set(dead)
        return recovered

    async def recover_node(self, node: dict[str, Any]) -> bool:
        """Steal one stale lock (a conditional UPDATE: only one conductor wins)."""
        holder = node["reservation"]
        pool = self.manager.pool
        row = await pool.fetchrow(
            "UPDATE nodes SET reservation = $2, reservation_expires_at = now() + make_interval(secs => $4) "
            "WHERE uuid = $1::uuid AND reservation = $3 RETURNING uuid",
            node["uuid"],
            self.manager.hostname,
            holder,
            self.config.lock_lease,
        )
        if row is None:
            return False
        try:
            task = await self.manager.tasks.build_task(await self.manager.nodes.get(node["uuid"]))
            state = task.node["provision_state"]
            if state in states.STUCK_ON_RESTART:
                await self.manager.fail(
                    task,
                    f'Conductor {holder} went offline while the node was in state "{state}"; '
                    "the operation was aborted and can be retried.",
                )
            elif task.node["target_power_state"]:
                await self.manager.nodes.update(
                    node["uuid"],
                    {
                        "target_power_state": None,
                        "last_error": f"Conductor {holder} went offline during a power action.",
                    },
                )
            else:
                await EventRepository(pool).record(
                    task.node,
                    event="lock-recovered",
                    conductor=self.manager.hostname,
                    message=f"Stale lock of conductor {holder} cleared",
                    severity="WARNING",
                )
            LOG.warning("recovered node_uuid=%s from dead holder=%s state=%s", node["uuid"], holder, state)
        except errors.FerrumError:
            LOG.exception("recovery of node_uuid=%s failed", node["uuid"])
        finally:
            await self.manager.nodes.release(node["uuid"], self.manager.hostname)
        return True

    async def take_over_active(self, dead: set[str]) -> None:
        """Active nodes that belonged to a dead conductor and now map to us."""
        alive = await self.conductors.list_alive(self.config.heartbeat_timeout)
        everyone = await self.conductors.list_all()
        before = ConductorRings([c for c in everyone if c["online"] or c["hostname"] in dead])
        after = ConductorRings(alive)
        for node in await self.manager.nodes.list_in_states([states.ACTIVE]):
            old = before.owner(node["uuid"], node["driver"], node["conductor_group"])
            new = after.owner(node["uuid"], node["driver"], node["conductor_group"])
            if not old or old["hostname"] not in dead or not new or new["hostname"] != self.manager.hostname:
                continue
            try:
                task = await self.manager.tasks.acquire(node["uuid"])
            except errors.NodeLocked:
                continue
            try:
                for kind in ("deploy", "boot", "power", "management"):
                    await getattr(task.driver, kind).take_over(task)
                await EventRepository(self.manager.pool).record(
                    task.node,
                    event="take-over",
                    conductor=self.manager.hostname,
                    message=f"Conductor {self.manager.hostname} took over from {old['hostname']}",
                )
            except Exception as exc:
                LOG.exception("take over failed node_uuid=%s", node["uuid"])
                await self.manager.nodes.update(node["uuid"], {"last_error": f"take over failed: {exc}"})
            finally:
                await self.manager.tasks.release(node["uuid"])

    async def check_callback_timeouts(self) -> int:
        """Nodes waiting too long for their ramdisk fail with a clear last_error."""
        now = datetime.datetime.now(datetime.UTC)
        failed = 0
        for state, timeout in (
            (states.DEPLOYWAIT, self.config.deploy_callback_timeout),
            (states.CLEANWAIT, self.config.clean_callback_timeout),
        ):
            cutoff = now - datetime.timedelta(seconds=timeout)
            for node in await self.manager.nodes.list_in_states([state], updated_before=cutoff):
                if node["maintenance"]:
                    continue
                try:
                    task = await self.manager.tasks.acquire(node["uuid"])
                except errors.NodeLocked:
                    continue
                try:
                    # Re-read under the lock: a heartbeat may have arrived since the scan.
                    fresh = task.node["provision_updated_at"]
                    if task.node["provision_state"] == state and (fresh is None or fresh < cutoff):
                        await self.manager.fail(
                            task,
                            f"Timeout reached while waiting for callback for node {node['uuid']} "
                            f'({int(timeout)} s in "{state}")',
                        )
                        failed += 1
                finally:
                    await self.manager.tasks.release(node["uuid"])
        return failed

    async def sync_power_states(self) -> int:
        """Record the BMC's power state for nodes this conductor owns.

        Ferrum records the hardware's state and logs a warning on drift (it does
        not force the node back); see docs/conductor.md.
        """
        rings = await self.rings()
        changed = 0
        after_id = 0
        while True:
            batch = await self.manager.nodes.list_uuids_for_sync(after_id=after_id, limit=500)
            if not batch:
                return changed
            after_id = batch[-1]["id"]
            for row in batch:
                owner = rings.owner(row["uuid"], row["driver"], row["conductor_group"])
                if not owner or owner["hostname"] != self.manager.hostname:
                    continue
                try:
                    node = await self.manager.nodes.get(row["uuid"])
                    task = await self.manager.tasks.build_task(node)
                    actual = await task.driver.power.get_power_state(task)
                except Exception as exc:  # noqa: BLE001 - one unreachable BMC must not stop the sync of the others
                    LOG.warning("power sync failed node_uuid=%s reason=%s", row["uuid"], exc)
                    continue
                if actual != node["power_state"] and not node["reservation"]:
                    LOG.warning(
                        "power state drift node_uuid=%s db=%s hardware=%s", row["uuid"], node["power_state"], actual
                    )
                    saved = await self.manager.nodes.update(row["uuid"], {"power_state": actual})
                    await EventRepository(self.manager.pool).record(
                        saved,
                        event="power-sync",
                        severity="WARNING",
                        conductor=self.manager.hostname,
                        message=f"power state changed outside Ferrum: {node['power_state']} -> {actual}",
                        event_type="power",
                    )
                    changed += 1
