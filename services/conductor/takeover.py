"""Adopting the nodes of a dead conductor and resuming their work.

Runs every ``liveness_check_interval`` (1 s). A conductor is dead when it is
offline, stopped heartbeating, or its session dropped the liveness lock
(services/conductor/liveness.py), so a killed conductor is seen within about
a second.

- Nodes it had locked (work in flight) go to their owner on the ring of live
  conductors: that conductor moves the lock to itself with one conditional
  UPDATE (only one can win) and resumes the node's flow from its recorded
  step (services/conductor/flows/resume.py). Nothing is failed because a
  conductor died; each step is safe to repeat.
- Nodes it owned but had not locked need no lock moved. ``active`` ones get
  the interfaces' ``take_over``; ones waiting for their agent
  (``wait call-back``) are continued at once: the new owner asks the agent
  for its command status instead of waiting for its next heartbeat.
- A lease that expired while its holder is alive (lost database, crashed
  background work) is handled the same way by the ring owner.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from services.common import errors, states
from services.common.config import ConductorConfig
from services.common.db.conductors import ConductorRepository
from services.common.db.nodes import NodeRepository
from services.common.db.records import ConductorRecord, NodeRecord
from services.common.hashring import ConductorRings
from services.conductor.drivers.base import Task
from services.conductor.flows import resume
from services.conductor.node_states import NodeStates
from services.conductor.taskmanager import TaskManager

LOG = logging.getLogger(__name__)
# Wait states whose agent may already have called back to a dead conductor.
WAITING_FOR_AGENT = (states.DEPLOYWAIT, states.CLEANWAIT, states.RESCUEWAIT)


class TakeOver:
    def __init__(self, tasks: TaskManager, ctx: NodeStates, *, config: ConductorConfig) -> None:
        self.tasks = tasks
        self.ctx = ctx
        self.config = config
        self.hostname = ctx.hostname
        self.conductors = ConductorRepository(ctx.pool)
        self.nodes = NodeRepository(ctx.pool, secrets=ctx.secrets)
        # Set by the manager: run after a round that adopted a dead conductor's nodes
        # (the console proxies of nodes with console_enabled start here: consoles.py).
        self.on_adopted: Callable[[], Awaitable[Any]] | None = None

    async def alive(self) -> list[ConductorRecord]:
        return await self.conductors.list_alive(
            self.config.heartbeat_timeout, restart_grace=self.config.liveness_restart_grace
        )

    async def check(self) -> int:
        """One round: adopt what dead conductors left; returns how many locked nodes were adopted."""
        c = self.config
        dead_rows = [
            row
            for row in await self.conductors.list_dead(c.heartbeat_timeout, restart_grace=c.liveness_restart_grace)
            if row["hostname"] != self.hostname
        ]
        dead = {row["hostname"] for row in dead_rows}
        # Still marked online: nobody has handled this death yet (the mark is
        # shared, so a restarted survivor does not handle it twice).
        newly_dead = {row["hostname"] for row in dead_rows if row["online"]}
        alive = await self.alive()
        rings = ConductorRings(alive)
        candidates = await self.nodes.list_reserved_by(sorted(dead)) if dead else []
        seen = {n["uuid"] for n in candidates}
        for node in await self.nodes.list_expired_reservations():
            if node["uuid"] in seen or self.tasks.holds(node["uuid"]):
                continue
            candidates.append(node)
        adopted = 0
        for node in candidates:
            owner = rings.owner(node["uuid"], node["driver"], node["conductor_group"])
            if owner is None or owner["hostname"] != self.hostname:
                continue  # its owner on the ring adopts it (the api routes the node there too)
            holder = node["reservation"]
            if holder is None:
                continue  # released since it was read
            taken = await self.tasks.take_over(node["uuid"], dead_holder=holder)
            if taken is None:
                continue  # someone else was faster, or the holder released it
            reason = (
                f"conductor {holder} went offline"
                if holder != self.hostname
                else "this conductor's own lease had expired"
            )
            await self.resume_adopted(taken, reason=reason, claimed=True)
            adopted += 1
        if newly_dead:
            await self._adopt_unlocked(newly_dead, alive)
            for hostname in newly_dead:
                await self.conductors.mark_offline(hostname)
            if self.on_adopted is not None:
                try:
                    await self.on_adopted()
                except errors.FerrumError as exc:
                    LOG.warning("after the take-over: %s", exc.message)
        return adopted

    async def resume_adopted(self, node: NodeRecord, *, reason: str, claimed: bool = False) -> None:
        """Resume a node this conductor holds the lock of, in the background."""
        try:
            async with self.tasks.adopt(node, "take-over", claimed=claimed) as task:
                task.spawn(lambda t: resume.resume(self.ctx, t, reason=reason), name="resume")
        except errors.FerrumError as exc:  # e.g. its driver is not enabled here: the lock is released
            LOG.error("cannot resume node_uuid=%s reason=%s", node["uuid"], exc.message)
            await self.nodes.update(node["uuid"], {"last_error": f"{reason}; resuming failed: {exc.message}"})

    async def _adopt_unlocked(self, dead: set[str], alive: list[ConductorRecord]) -> None:
        """Nodes the dead conductors owned without a lock that now map to us."""
        everyone = await self.conductors.list_all()
        before = ConductorRings([c for c in everyone if c["online"] or c["hostname"] in dead])
        after = ConductorRings(alive)
        waiting = WAITING_FOR_AGENT
        for node in await self.nodes.list_in_states([states.ACTIVE, *waiting]):
            old = before.owner(node["uuid"], node["driver"], node["conductor_group"])
            new = after.owner(node["uuid"], node["driver"], node["conductor_group"])
            if not old or old["hostname"] not in dead or not new or new["hostname"] != self.hostname:
                continue
            if node["provision_state"] == states.ACTIVE:
                await self._take_over_active(node, old["hostname"])
            elif node["driver_internal_info"].get("agent_url") and not node["maintenance"]:
                await self._continue_waiting(node, old["hostname"])

    async def _take_over_active(self, node: NodeRecord, previous: str) -> None:
        try:
            async with self.tasks.acquire(node["uuid"], "take-over") as task:
                await _interfaces_take_over(task)
                await self.ctx.record_event(
                    task.node, "take-over", f"Conductor {self.hostname} took over from {previous}"
                )
        except errors.NodeLocked:
            return
        except Exception as exc:
            LOG.exception("take over failed node_uuid=%s", node["uuid"])
            await self.nodes.update(node["uuid"], {"last_error": f"take over failed: {exc}"})

    async def _continue_waiting(self, node: NodeRecord, previous: str) -> None:
        try:
            async with self.tasks.acquire(node["uuid"], "take-over") as task:
                if task.node["provision_state"] not in WAITING_FOR_AGENT:
                    return
                await self.ctx.record_event(
                    task.node, "take-over", f"Conductor {self.hostname} took over from {previous}; asking the agent"
                )
                task.spawn(
                    lambda t: resume.resume(self.ctx, t, reason=f"conductor {previous} went offline"), name="resume"
                )
        except errors.NodeLocked:
            return  # a heartbeat is being handled right now: that continues it


async def _interfaces_take_over(task: Task) -> None:
    for kind in ("deploy", "boot", "power", "management"):
        await getattr(task.driver, kind).take_over(task)


async def adopt_own(takeover: TakeOver, nodes: Iterable[NodeRecord], *, reason: str) -> None:
    """A restarted conductor's previous incarnation left these locked: resume them."""
    for node in nodes:
        await takeover.resume_adopted(node, reason=reason)
