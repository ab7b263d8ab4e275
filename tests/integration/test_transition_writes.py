"""A state change is one statement: the node row, its event, its history row and,
for the last write of an operation, the lock release; a locked task's ports
and volumes are one read (issue 22).

The conductor's task manager and NodeStates against a real PostgreSQL, no
stack: what is written, what is not written when the lock was lost, and that
a release folded into the last transition leaves the node free for the next
operation of the same conductor.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest

from services.common import errors
from services.common.config import ConductorConfig
from services.common.db.node_secrets import NodeSecrets
from services.common.db.nodes import NodeRepository
from services.common.db.pool import create_pool
from services.common.db.ports import PortRepository
from services.common.db.volumes import node_ports_and_volumes, node_volumes
from services.common.keyring import Keyring
from services.common.request_project import project_var
from services.conductor.configdrive_store import ConfigDriveStore
from services.conductor.drivers.registry import DriverRegistry
from services.conductor.node_states import NodeStates
from services.conductor.taskmanager import TaskManager

HOST = "writes-conductor"


class NoInventory:
    async def apply(self, task: Any) -> str:
        raise AssertionError("no inspection here")


@pytest.fixture(scope="module")
async def parts(database_url: str) -> AsyncIterator[tuple[asyncpg.Pool, TaskManager, NodeStates]]:
    pool = await create_pool(database_url, max_size=4)
    secrets = NodeSecrets(Keyring())
    config = ConductorConfig(hostname=HOST)
    tasks = TaskManager(pool, DriverRegistry(config), hostname=HOST, lease=60, workers=4, secrets=secrets)
    states = NodeStates(
        pool,
        hostname=HOST,
        config=config,
        configdrives=ConfigDriveStore(objectstore=None, container="c", lifetime=60, inline_limit=1024),
        secrets=secrets,
        inspection=NoInventory(),
    )
    yield pool, tasks, states
    await pool.close()


async def new_node(pool: asyncpg.Pool) -> str:
    nodes = NodeRepository(pool, secrets=NodeSecrets(Keyring()))
    node = await nodes.create({"uuid": str(uuid.uuid4()), "driver": "fake-hardware", "provision_state": "enroll"})
    return str(node["uuid"])


async def written(pool: asyncpg.Pool, node_uuid: str) -> tuple[list[asyncpg.Record], list[asyncpg.Record]]:
    events = await pool.fetch(
        "SELECT event, provision_state, target_provision_state, power_state, severity, message, conductor "
        "FROM node_events WHERE node_uuid = $1::uuid ORDER BY sequence",
        node_uuid,
    )
    history = await pool.fetch(
        "SELECT h.conductor, h.event_type, h.event, h.severity, h.project, h.state, h.target_provision_state, "
        "h.duration_seconds FROM node_history h JOIN nodes n ON n.id = h.node_id WHERE n.uuid = $1::uuid "
        "ORDER BY h.id",
        node_uuid,
    )
    return events, history


async def test_transition_writes_node_event_and_history_and_release_frees_the_node(
    parts: tuple[asyncpg.Pool, TaskManager, NodeStates],
) -> None:
    pool, tasks, states = parts
    node_uuid = await new_node(pool)
    project_var.set("tenant-a")
    async with tasks.acquire(node_uuid, "manage") as task:
        await states.transition(task, "manage")
        assert not task.lock_released
        saved = await states.transition(task, "done", changes={"power_state": "power off"}, release=True)
        assert saved["provision_state"] == "manageable" and saved["reservation"] is None
        assert task.lock_released
        row = await pool.fetchrow("SELECT reservation, reservation_expires_at FROM nodes WHERE uuid = $1", node_uuid)
        assert row is not None and row["reservation"] is None and row["reservation_expires_at"] is None
    assert not tasks.holds(node_uuid)
    events, history = await written(pool, node_uuid)
    assert [tuple(e) for e in events] == [
        ("manage", "verifying", "manageable", None, "INFO", "enroll -> verifying (manage)", HOST),
        ("done", "manageable", None, "power off", "INFO", "verifying -> manageable (done)", HOST),
    ]
    assert [tuple(h) for h in history] == [
        (HOST, "provisioning", "enroll -> verifying (manage)", "INFO", "tenant-a", "verifying", "manageable", 0),
        (HOST, "provisioning", "verifying -> manageable (done)", "INFO", "tenant-a", "manageable", None, 0),
    ]
    # The conductor forgot the node: its next operation takes the lock again.
    async with tasks.acquire(node_uuid, "provide") as task:
        assert task.node["reservation"] == HOST
    assert (await pool.fetchval("SELECT reservation FROM nodes WHERE uuid = $1", node_uuid)) is None


async def test_transition_after_the_lock_was_lost_writes_nothing(
    parts: tuple[asyncpg.Pool, TaskManager, NodeStates],
) -> None:
    pool, tasks, states = parts
    node_uuid = await new_node(pool)
    async with tasks.acquire(node_uuid, "manage") as task:
        await pool.execute("UPDATE nodes SET reservation = 'thief' WHERE uuid = $1", node_uuid)
        with pytest.raises(errors.NodeLocked):
            await states.transition(task, "manage", release=True)
        assert not task.lock_released
    row = await pool.fetchrow("SELECT provision_state, reservation FROM nodes WHERE uuid = $1", node_uuid)
    assert row is not None and tuple(row) == ("enroll", "thief")  # neither changed nor released
    assert await written(pool, node_uuid) == ([], [])


async def test_update_drops_internal_info_keys_in_the_database(
    parts: tuple[asyncpg.Pool, TaskManager, NodeStates],
) -> None:
    pool, tasks, _ = parts
    node_uuid = await new_node(pool)
    nodes = NodeRepository(pool, secrets=NodeSecrets(Keyring()))
    async with tasks.acquire(node_uuid, "clean") as task:
        await nodes.merge_internal_info(node_uuid, {"clean_steps": [], "kept": 1})
        # task.node predates the merge: the removal must not write that stale copy back.
        saved = await nodes.update(
            node_uuid, {"clean_step": {}}, expect_reservation=HOST, remove_internal_info=("clean_steps", "absent")
        )
        assert saved["driver_internal_info"] == {"kept": 1}
        assert task.node["driver_internal_info"] == {}
    with pytest.raises(ValueError):
        await nodes.update(node_uuid, {"clean_step": {}}, release=True)


async def test_one_read_gives_the_ports_and_volumes_the_two_reads_gave(
    parts: tuple[asyncpg.Pool, TaskManager, NodeStates],
) -> None:
    pool, _, _ = parts
    bare, full = await new_node(pool), await new_node(pool)
    full_id = await pool.fetchval("SELECT id FROM nodes WHERE uuid = $1", full)
    for mac in ("52:54:00:00:aa:02", "52:54:00:00:aa:01"):
        await pool.execute(
            "INSERT INTO ports (uuid, node_id, address) VALUES ($1::uuid, $2, $3)", str(uuid.uuid4()), full_id, mac
        )
    for index, volume in ((1, "vol-b"), (0, "vol-a")):
        await pool.execute(
            "INSERT INTO volume_targets (uuid, node_id, volume_type, boot_index, volume_id) "
            "VALUES ($1::uuid, $2, 'iscsi', $3, $4)",
            str(uuid.uuid4()),
            full_id,
            index,
            volume,
        )
    await pool.execute(
        "INSERT INTO volume_connectors (uuid, node_id, type, connector_id) VALUES ($1::uuid, $2, 'iqn', 'iqn.x')",
        str(uuid.uuid4()),
        full_id,
    )
    for node_uuid in (bare, full):
        node_id = await pool.fetchval("SELECT id FROM nodes WHERE uuid = $1", node_uuid)
        ports, targets, connectors = await node_ports_and_volumes(pool, node_id)
        assert ports == await PortRepository(pool).list_for_node_ids([node_id])
        assert (targets, connectors) == await node_volumes(pool, node_id)
    ports, targets, connectors = await node_ports_and_volumes(pool, full_id)
    assert [p["address"] for p in ports] == ["52:54:00:00:aa:02", "52:54:00:00:aa:01"]  # by id
    assert [t["volume_id"] for t in targets] == ["vol-a", "vol-b"] and len(connectors) == 1


async def test_a_provision_verb_takes_the_lock_with_its_first_transition(
    parts: tuple[asyncpg.Pool, TaskManager, NodeStates],
) -> None:
    """acquire_at_first_write: the node is held in this process from the read, but the
    database sees no lock until the transition, which takes it in the same statement."""
    pool, tasks, states = parts
    node_uuid = await new_node(pool)
    async with tasks.acquire_at_first_write(node_uuid, "manage") as task:
        assert tasks.holds(node_uuid) and task.claim is not None
        assert await pool.fetchval("SELECT reservation FROM nodes WHERE uuid = $1", node_uuid) is None
        with pytest.raises(errors.NodeLocked):  # a second operation of this process meanwhile
            async with tasks.acquire(node_uuid, "power on"):
                pass
        saved = await states.transition(task, "manage")
        assert task.claim is None and saved["reservation"] == HOST
        row = await pool.fetchrow(
            "SELECT provision_state, reservation, reservation_expires_at > now() AS leased FROM nodes WHERE uuid = $1",
            node_uuid,
        )
        assert row is not None and tuple(row) == ("verifying", HOST, True)
    assert not tasks.holds(node_uuid)
    assert await pool.fetchval("SELECT reservation FROM nodes WHERE uuid = $1", node_uuid) is None  # released
    events, _ = await written(pool, node_uuid)
    assert [e["event"] for e in events] == ["manage"]


async def test_a_refused_provision_verb_writes_nothing(parts: tuple[asyncpg.Pool, TaskManager, NodeStates]) -> None:
    pool, tasks, _ = parts
    node_uuid = await new_node(pool)
    before = await pool.fetchrow("SELECT xmin::text AS version, * FROM nodes WHERE uuid = $1", node_uuid)
    with pytest.raises(errors.InvalidParameterValue):
        async with tasks.acquire_at_first_write(node_uuid, "deploy"):
            raise errors.InvalidParameterValue("a check failed")
    assert not tasks.holds(node_uuid)
    after = await pool.fetchrow("SELECT xmin::text AS version, * FROM nodes WHERE uuid = $1", node_uuid)
    assert after == before  # not even a lock taken and released
    assert await written(pool, node_uuid) == ([], [])


async def test_a_row_changed_before_the_first_write_is_not_written(
    parts: tuple[asyncpg.Pool, TaskManager, NodeStates],
) -> None:
    """A write between the read and the first transition (the power sync's, which takes no
    lock) makes the transition refuse; the caller runs the verb again with acquire."""
    pool, tasks, states = parts
    node_uuid = await new_node(pool)
    async with tasks.acquire_at_first_write(node_uuid, "manage") as task:
        await pool.execute("UPDATE nodes SET power_state = 'power on' WHERE uuid = $1", node_uuid)
        with pytest.raises(errors.NodeChangedMeanwhile):
            await states.transition(task, "manage")
    assert not tasks.holds(node_uuid)
    row = await pool.fetchrow("SELECT provision_state, power_state, reservation FROM nodes WHERE uuid = $1", node_uuid)
    assert row is not None and tuple(row) == ("enroll", "power on", None)
    assert await written(pool, node_uuid) == ([], [])
    async with tasks.acquire(node_uuid, "manage") as task:  # the usual way then works
        assert (await states.transition(task, "manage"))["provision_state"] == "verifying"


async def test_a_node_locked_elsewhere_is_refused_at_once(parts: tuple[asyncpg.Pool, TaskManager, NodeStates]) -> None:
    pool, tasks, _ = parts
    node_uuid = await new_node(pool)
    await pool.execute(
        "UPDATE nodes SET reservation = 'other', reservation_expires_at = now() + interval '1 hour' WHERE uuid = $1",
        node_uuid,
    )
    with pytest.raises(errors.NodeLocked):
        async with tasks.acquire_at_first_write(node_uuid, "manage"):
            raise AssertionError("entered a node another conductor holds")
    assert not tasks.holds(node_uuid)
    # An expired lease is taken at once, the usual way, and released at the end.
    await pool.execute("UPDATE nodes SET reservation_expires_at = now() - interval '1 s' WHERE uuid = $1", node_uuid)
    async with tasks.acquire_at_first_write(node_uuid, "manage") as task:
        assert task.claim is None and task.node["reservation"] == HOST
    assert await pool.fetchval("SELECT reservation FROM nodes WHERE uuid = $1", node_uuid) is None
