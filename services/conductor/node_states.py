"""Moving a locked node through the state machine, and recording what happened.

Every flow changes a node the same three ways: a transition of the
provision state table (services/common/states.py), a failure with a
last_error, or an event in the history. This class is the one place that
writes them, each state change and its event in one statement (so they
commit together), and only while this conductor holds the node's lock.
"""

from __future__ import annotations

import datetime
import logging
from collections.abc import Mapping
from typing import Any

import asyncpg

from services.common import states
from services.common.config import ConductorConfig
from services.common.db.events import EventEntry, EventRepository
from services.common.db.node_secrets import NodeSecrets
from services.common.db.nodes import NodeRepository
from services.common.db.records import NodeRecord
from services.common.db.vifs import VIF_KEY, VifRepository
from services.conductor import firmware_cache
from services.conductor.configdrive_store import ConfigDriveStore
from services.conductor.drivers.base import Task
from services.conductor.flows.context import InventoryApplier

LOG = logging.getLogger(__name__)

# Events that start new work: they clear the last error, as Ironic does.
_CLEARS_LAST_ERROR = frozenset(("deploy", "rebuild", "manage", "provide", "clean", "inspect", "service"))


def now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


class NodeStates:
    """The FlowContext a conductor hands to its flows (services/conductor/flows)."""

    def __init__(
        self,
        pool: asyncpg.Pool,
        *,
        hostname: str,
        config: ConductorConfig,
        configdrives: ConfigDriveStore,
        secrets: NodeSecrets,
        inspection: InventoryApplier,
    ) -> None:
        self.pool = pool
        self.secrets = secrets
        self.hostname = hostname
        self.config = config
        self.configdrives = configdrives
        self.inspection = inspection
        self.nodes = NodeRepository(pool, secrets=secrets)

    async def cache_firmware(self, task: Task) -> str:
        """Refresh the node's cached firmware components (services/conductor/firmware_cache.py)."""
        return await firmware_cache.refresh(self.pool, task)

    async def remove_vifs(self, task: Task) -> list[str]:
        """Tear down forgets the instance's VIF attachments, as Ironic's does
        (``network.remove_vifs_from_node``): Nova's destroy of an active
        instance only asks for ``deleted`` and never detaches them itself, so
        a VIF left behind would hold the port against the next instance."""
        removed = await VifRepository(self.pool).remove_all(task.node["id"])
        for port in task.ports:
            (port.get("internal_info") or {}).pop(VIF_KEY, None)
        return removed

    async def transition(
        self,
        task: Task,
        event: str,
        *,
        last_error: str | None = None,
        changes: Mapping[str, Any] | None = None,
        severity: str = "INFO",
        note: str = "",
        remove_internal_info: tuple[str, ...] = (),
        release: bool = False,
    ) -> NodeRecord:
        """Move the locked node by ``event`` through the table and record it
        (``note`` is appended to the history message). ``remove_internal_info``
        drops those driver_internal_info keys in the same write (keys an agent
        added meanwhile stay). ``release``: this is the operation's last write,
        so it also releases the lock (the task manager then only forgets the
        node): one statement where the transition and the release took two,
        and a client sees the node settled and unlocked at once."""
        node = task.node
        move = states.next_state(node["provision_state"], event)
        update: dict[str, Any] = {
            "provision_state": move.target,
            "target_provision_state": states.next_target(node["target_provision_state"], move),
            "provision_updated_at": now(),
        }
        if last_error is not None or event in _CLEARS_LAST_ERROR:
            update["last_error"] = last_error
        update.update(changes or {})
        message = last_error or f"{node['provision_state']} -> {move.target} ({event})" + (f": {note}" if note else "")
        entry = EventEntry(
            event, message=message, conductor=self.hostname, severity="ERROR" if last_error else severity
        )
        saved = await self.nodes.update(
            node["uuid"],
            update,
            expect_reservation=self.hostname,
            event=entry,
            remove_internal_info=remove_internal_info,
            release=release,
            claim=task.claim,  # the operation's first write takes the lock (TaskManager.acquire_at_first_write)
        )
        task.claim = None
        task.node = saved
        task.lock_released = release
        return saved

    async def fail(self, task: Task, message: str) -> None:
        """The node's failure state with ``message`` as last_error (or only the
        message, where the state has no failure transition)."""
        LOG.warning(
            "operation failed node_uuid=%s state=%s reason=%s",
            task.node["uuid"],
            task.node["provision_state"],
            message,
        )
        try:
            await self.transition(task, "fail", last_error=message)
        except states.InvalidTransition:
            task.node = await self.nodes.update(task.node["uuid"], {"last_error": message})

    async def record_event(
        self,
        node: NodeRecord,
        event: str,
        message: str,
        *,
        severity: str = "INFO",
        event_type: str = "provisioning",
    ) -> None:
        await EventRepository(self.pool).record(
            node, event=event, message=message, conductor=self.hostname, severity=severity, event_type=event_type
        )

    async def save_with_event(
        self,
        task: Task,
        changes: Mapping[str, Any],
        *,
        event: str,
        message: str,
        severity: str = "INFO",
        event_type: str = "provisioning",
    ) -> NodeRecord:
        """Node fields and their event in one transaction, under the lock."""
        entry = EventEntry(event, message=message, severity=severity, conductor=self.hostname, event_type=event_type)
        saved = await self.nodes.update(task.node["uuid"], changes, expect_reservation=self.hostname, event=entry)
        task.node = saved
        return saved
