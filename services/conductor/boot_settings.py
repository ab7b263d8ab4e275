"""Conductor half of boot mode and secure boot (API 1.76).

Checked at once under the node lock (400/409 to the caller), applied in the
background under the same lock (the api answers 202).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from services.common import errors
from services.conductor.drivers import base
from services.conductor.flows.context import error_text
from services.conductor.node_states import NodeStates
from services.conductor.taskmanager import TaskManager

LOG = logging.getLogger(__name__)
BOOT_MODES = ("bios", "uefi")


class BootSettings:
    def __init__(self, tasks: TaskManager, states: NodeStates) -> None:
        self.tasks = tasks
        self.states = states

    async def _change(
        self,
        node_uuid: str,
        what: str,
        check: Callable[[base.Task], None],
        apply: Callable[[base.Task], Awaitable[None]],
        field: str,
        value: Any,
    ) -> None:
        """Lock, check at once, then apply in the background."""

        async def work(task: base.Task) -> None:
            try:
                await apply(task)
                await task.save_fields({field: value})
                await self.states.record_event(task.node, what.replace(" ", "-"), f"{what} set to {value}")
            except Exception as exc:  # noqa: BLE001 - any driver failure is recorded as the node's last_error
                text = error_text(exc)
                message = f"Failed to set the {what} of node {node_uuid} to {value}: {text}"
                LOG.warning("management change failed node_uuid=%s what=%s reason=%s", node_uuid, what, text)
                await task.save_fields({"last_error": message})
                await self.states.record_event(task.node, what.replace(" ", "-"), message, severity="ERROR")

        self.tasks.check_capacity()
        async with self.tasks.acquire(node_uuid, f"set {what}") as task:
            node = task.node
            if node["target_provision_state"]:
                raise errors.InvalidStateRequested(
                    f'Can not change the {what} of node {node_uuid} while it is in state "{node["provision_state"]}"'
                )
            await task.driver.management.validate(task)
            check(task)
            task.spawn(work, name=what)

    async def set_boot_mode(self, node_uuid: str, mode: str) -> None:
        if mode not in BOOT_MODES:
            raise errors.InvalidParameterValue(f"Invalid boot mode {mode!r}: must be one of {', '.join(BOOT_MODES)}")

        def check(task: base.Task) -> None:
            if mode not in task.driver.management.get_supported_boot_modes(task):
                raise base.unsupported(task.driver.management, f"boot mode {mode}")

        await self._change(
            node_uuid,
            "boot mode",
            check,
            lambda task: task.driver.management.set_boot_mode(task, mode),
            "boot_mode",
            mode,
        )

    async def set_secure_boot_state(self, node_uuid: str, state: bool) -> None:
        def check(task: base.Task) -> None:
            if state and task.node.get("boot_mode") == "bios":
                raise errors.InvalidParameterValue(
                    f"Secure boot needs UEFI boot mode; node {node_uuid} boots in bios mode"
                )

        await self._change(
            node_uuid,
            "secure boot",
            check,
            lambda task: task.driver.management.set_secure_boot_state(task, state),
            "secure_boot",
            state,
        )
