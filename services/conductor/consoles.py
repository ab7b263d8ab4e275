"""Conductor half of serial consoles (``PUT|GET /v1/nodes/{id}/states/console``).

``set_mode`` enables or disables a node's console under its lock, as
Ironic's ``set_console_mode`` does: the console interface validates (a
``no-console`` node is a 400 naming it), asking for the state the node is
already in changes nothing, and a change is recorded in ``console_enabled``
with a history event; a failure leaves ``last_error`` and is the caller's
error too. ``information`` answers ``console_info`` (None while disabled).

``reconcile`` keeps the running proxies in step with the database and the
hash ring (services/conductor/console_proxy.py): every node with
``console_enabled`` that this conductor owns gets its console started (after
a take-over, a restart, or a ring change), and a proxy for a node this
conductor no longer owns, or whose console was disabled, is stopped. It runs
every ``console_check_interval``, at start, and right after a take-over
round that adopted a dead conductor's nodes. A console that cannot start
there is switched off with a last_error naming the take-over, as Ironic does.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from services.common import errors
from services.common.hashring import ConductorRings
from services.conductor.console_proxy import ConsoleProxies
from services.conductor.drivers.base import Task
from services.conductor.node_states import NodeStates
from services.conductor.takeover import TakeOver
from services.conductor.taskmanager import TaskManager

LOG = logging.getLogger(__name__)


class Consoles:
    def __init__(self, tasks: TaskManager, states: NodeStates, proxies: ConsoleProxies, takeover: TakeOver) -> None:
        self.tasks = tasks
        self.states = states
        self.proxies = proxies
        self.takeover = takeover
        self.hostname = states.hostname
        self._reconciling = asyncio.Lock()  # the periodic check and the take-over hook never overlap

    @staticmethod
    async def _validate(task: Task) -> None:
        await task.driver.console.validate(task)

    async def set_mode(self, node_uuid: str, enabled: bool) -> None:
        async with self.tasks.acquire(node_uuid, "setting console mode") as task:
            try:
                await self._validate(task)
            except errors.UnsupportedDriverExtension:
                raise  # no-console: a 400 naming it, either way
            except errors.FerrumError:
                if enabled:
                    raise
                # Broken driver_info must not keep a running console from being switched off.
            node = task.node
            running = node_uuid in self.proxies.running()
            if enabled == node["console_enabled"] and running == enabled:
                LOG.info(
                    "no console action node_uuid=%s: the console is already %s",
                    node_uuid,
                    "enabled" if enabled else "disabled",
                )
                return
            if enabled:
                self.proxies.check_capacity(node_uuid)
            try:
                if enabled:
                    await task.driver.console.start_console(task)
                else:
                    await task.driver.console.stop_console(task)
            except errors.FerrumError as exc:
                message = (
                    f"Error {'enabling' if enabled else 'disabling'} the console on node {node_uuid}. "
                    f"Reason: {exc.message}"
                )
                LOG.warning("console change failed node_uuid=%s reason=%s", node_uuid, exc.message)
                await task.save_fields({"last_error": message})
                await self.states.record_event(task.node, "console", message, severity="ERROR", event_type="console")
                raise type(exc)(message) from None
            await task.save_fields({"console_enabled": enabled, "last_error": None})
            await self.states.record_event(
                task.node,
                "console",
                f"console {'enabled' if enabled else 'disabled'} on conductor {self.hostname}",
                event_type="console",
            )

    async def information(self, node_uuid: str) -> dict[str, Any] | None:
        """console_info of an enabled console (shared access), None when it is disabled."""
        task = await self.tasks.shared(node_uuid)
        if not task.node["console_enabled"]:
            return None
        await self._validate(task)
        return await task.driver.console.get_console(task)

    async def stop_for_deletion(self, task: Task) -> None:
        """The node is being deleted: its console goes with it (Ironic's destroy_node)."""
        if task.node.get("console_enabled") or task.node["uuid"] in self.proxies.running():
            try:
                await task.driver.console.stop_console(task)
            except errors.FerrumError as exc:
                LOG.warning("stopping the console of a deleted node failed node_uuid=%s: %s", task.node["uuid"], exc)
            await self.proxies.stop(task.node["uuid"])

    async def reconcile(self) -> int:
        """Start the consoles this conductor should run and stop the others; returns how many started."""
        async with self._reconciling:
            return await self._reconcile()

    async def _reconcile(self) -> int:
        if self.proxies.closed:
            return 0
        rings = ConductorRings(await self.takeover.alive())
        wanted: set[str] = set()
        for row in await self.takeover.nodes.list_console_enabled():
            owner = rings.owner(row["uuid"], row["driver"], row["conductor_group"])
            if owner is not None and owner["hostname"] == self.hostname:
                wanted.add(row["uuid"])
        for node_uuid in self.proxies.running() - wanted:
            if self.tasks.holds(node_uuid):
                continue  # being enabled or disabled right now: set_mode records the outcome
            LOG.info("stopping the console of a node this conductor no longer runs node_uuid=%s", node_uuid)
            await self.proxies.stop(node_uuid)
        started = 0
        for node_uuid in sorted(wanted - self.proxies.running()):
            if self.tasks.holds(node_uuid):
                continue
            if await self._restart(node_uuid):
                started += 1
        return started

    async def _restart(self, node_uuid: str) -> bool:
        """Start an enabled console here. Starting only changes this conductor's proxies, so a node
        locked by long work (a deploy someone watches) gets its console at once, with shared access."""
        try:
            task = await self.tasks.shared(node_uuid)
        except errors.NodeNotFound:
            return False
        if not task.node["console_enabled"]:
            return False
        try:
            await task.driver.console.start_console(task)
        except (errors.TooManyConsoles, errors.NodeLocked) as exc:
            LOG.warning("cannot start the console of node_uuid=%s here now: %s", node_uuid, exc.message)
            return False
        except Exception as exc:  # noqa: BLE001 - any failure switches the console off with the reason
            text = exc.message if isinstance(exc, errors.FerrumError) else f"{type(exc).__name__}: {exc}"
            message = f"Failed to start console while taking over the node {node_uuid}: {text}."
            LOG.error("%s", message)
            try:
                async with self.tasks.acquire(node_uuid, "console take-over") as locked:
                    await locked.save_fields({"console_enabled": False, "last_error": message})
                    await self.states.record_event(
                        locked.node, "console", message, severity="ERROR", event_type="console"
                    )
            except errors.NodeLocked:
                pass  # tried again next round
            return False
        await self.states.record_event(
            task.node, "console", f"console started again on conductor {self.hostname}", event_type="console"
        )
        return True
