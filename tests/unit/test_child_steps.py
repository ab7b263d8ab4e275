"""The child-step runner's answer to a child step that does not finish at once
(services/conductor/child_steps.py): the parent's step fails naming the child,
unless permit_child_node_step_async_result lets it go on, as in Ironic. Which
children run the step, their locks and their failures are
tests/integration/test_child_node_steps.py, over REST."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import AsyncIterator, Mapping
from typing import Any

import pytest

from services.common import errors, states
from services.common.config import ConductorConfig
from services.conductor import child_steps, related_nodes
from services.conductor.drivers.base import Task
from services.conductor.drivers.fake import FakeFirmware
from services.conductor.drivers.registry import DriverRegistry
from tests.support.node_records import node_record

PARENT, CHILD = "00000000-0000-4000-8000-000000000001", "00000000-0000-4000-8000-000000000002"
STEP = {"interface": "firmware", "step": "update", "args": {"settings": []}, "execute_on_child_nodes": True}


class LaterFirmware(FakeFirmware):
    """A firmware update that finishes later, as an in-band step would."""

    async def execute_service_step(self, task: Task, step: Mapping[str, Any]) -> str | None:
        return states.SERVICEWAIT


def tasks(config: ConductorConfig) -> Task:
    registry = DriverRegistry(config)

    def task(uuid: str) -> Task:
        node = node_record(uuid=uuid, driver="fake-hardware", firmware_interface="fake", driver_internal_info={})
        return Task(node=node, ports=[], driver=registry.compose(node), conductor="here")

    child = task(CHILD)
    child.driver = dataclasses.replace(child.driver, firmware=LaterFirmware())
    parent = task(PARENT)

    @contextlib.asynccontextmanager
    async def acquire(uuid: str, purpose: str) -> AsyncIterator[Task]:
        assert uuid == CHILD
        yield child

    async def children() -> list[str]:
        return [CHILD]

    parent.acquire_node, parent.child_nodes = acquire, children
    return parent


async def test_a_child_step_that_finishes_later_fails_the_parents_step() -> None:
    config = ConductorConfig()
    with pytest.raises(child_steps.ChildStepFailed, match=f"child node {CHILD}: .*must finish at once"):
        await child_steps.run(config, tasks(config), "service", STEP)


async def test_permit_child_node_step_async_result_lets_it_go_on() -> None:
    config = dataclasses.replace(ConductorConfig(), permit_child_node_step_async_result=True)
    assert await child_steps.run(config, tasks(config), "service", STEP) == [CHILD]


async def test_only_taking_the_lock_is_retried_not_a_lock_error_from_the_work_under_it() -> None:
    config = dataclasses.replace(ConductorConfig(), child_node_locked_retry_interval=0.0)
    parent = tasks(config)
    taken: list[str] = []
    inner = parent.acquire_node
    assert inner is not None

    @contextlib.asynccontextmanager
    async def counting(uuid: str, purpose: str) -> AsyncIterator[Task]:
        taken.append(uuid)
        if len(taken) == 1:
            raise errors.NodeLocked(f"Node {uuid} is locked by host elsewhere")
        async with inner(uuid, purpose) as child:
            yield child

    parent.acquire_node = counting
    async with related_nodes.locked(config, parent, CHILD, "test") as child:  # second try takes it
        assert child.node["uuid"] == CHILD
    assert taken == [CHILD, CHILD]
    with pytest.raises(errors.NodeLocked, match="grandchild"):
        async with related_nodes.locked(config, parent, CHILD, "test"):
            raise errors.NodeLocked("the grandchild is locked")
    assert taken == [CHILD, CHILD, CHILD]  # the work's own NodeLocked is not a reason to take the lock again
