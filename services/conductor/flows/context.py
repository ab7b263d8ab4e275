"""What a flow may do to a node besides calling its driver."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Mapping
from typing import Any, Protocol

from services.common import errors
from services.common.config import ConductorConfig
from services.common.db.outage import is_unavailable
from services.common.db.records import NodeRecord
from services.conductor.configdrive_store import ConfigDriveStore
from services.conductor.drivers.base import Task

LOG = logging.getLogger(__name__)


class InventoryApplier(Protocol):
    """What inspection does with a stored inventory (services/conductor/inspection.py)."""

    async def apply(self, task: Task) -> str:
        """Set the node's properties and ports from its inventory; returns a
        one-line summary for the history."""
        ...


class FlowContext(Protocol):
    """The narrow surface flows depend on (implemented by node_states.NodeStates)."""

    hostname: str
    config: ConductorConfig
    configdrives: ConfigDriveStore
    inspection: InventoryApplier

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
        """Move the node by ``event`` and record it; ``release`` only as the flow's last write."""
        ...

    async def fail(self, task: Task, message: str) -> None: ...

    async def remove_vifs(self, task: Task) -> list[str]:
        """Forget every VIF attached to the node's ports and port groups; the VIFs forgotten."""
        ...

    async def cache_firmware(self, task: Task) -> str:
        """Refresh the node's cached firmware components (best effort); a note for the history."""
        ...

    async def record_event(
        self,
        node: NodeRecord,
        event: str,
        message: str,
        *,
        severity: str = "INFO",
        event_type: str = "provisioning",
    ) -> None: ...

    async def save_with_event(
        self,
        task: Task,
        changes: Mapping[str, Any],
        *,
        event: str,
        message: str,
        severity: str = "INFO",
        event_type: str = "provisioning",
    ) -> NodeRecord: ...


def error_text(exc: BaseException) -> str:
    return exc.message if isinstance(exc, errors.FerrumError) else f"{type(exc).__name__}: {exc}"


async def guarded(ctx: FlowContext, task: Task, what: str, work: Awaitable[None]) -> bool:
    """Run one flow; a hardware or input error fails the node with a clear last_error.

    A lost database is not the node's failure: it propagates, the task
    manager keeps the lock and the flow resumes once PostgreSQL is back.
    """
    try:
        await work
        return True
    except Exception as exc:
        if is_unavailable(exc):
            raise
        await ctx.fail(task, f"{what} failed for node {task.node['uuid']}: {error_text(exc)}")
        return False
