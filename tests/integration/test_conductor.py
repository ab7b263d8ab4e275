"""Conductor correctness against real PostgreSQL: exclusive locks under races,
recovery after a conductor dies, call-back timeouts, and the state machine
applied to every verb from every state."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import uuid
from typing import Any

import pytest

from services.common import errors, states
from services.common.config import ConductorConfig
from services.common.db.conductors import ConductorRepository
from services.common.db.node_secrets import NodeSecrets
from services.common.db.pool import create_pool
from services.common.db.records import NodeRecord
from services.common.keyring import Keyring
from services.conductor.drivers.registry import DriverRegistry
from services.conductor.manager import ConductorManager
from services.conductor.periodic import PeriodicWork


@pytest.fixture(scope="module")
async def pool(database_url):
    pool = await create_pool(database_url, max_size=20)
    yield pool
    await pool.close()


def manager(pool, hostname: str, **config) -> ConductorManager:
    cfg = dataclasses.replace(ConductorConfig(), hostname=hostname, **config)
    return ConductorManager(pool, DriverRegistry(cfg), cfg, hostname=hostname, secrets=NodeSecrets(Keyring()))


async def new_node(
    m: ConductorManager, state: str = states.ENROLL, target_provision_state: str | None = None, **fields
) -> NodeRecord:
    node = await m.create_node({"driver": "fake-hardware", "provision_state": state, **fields})
    if target_provision_state:
        node = await m.nodes.update(node["uuid"], {"target_provision_state": target_provision_state})
    return node


async def test_two_conductors_never_both_hold_a_node(pool) -> None:
    a, b = manager(pool, "race-a"), manager(pool, "race-b")
    node = await new_node(a)

    async def hold(m: ConductorManager, tried: list[int], both_tried: asyncio.Event) -> str:
        def one_tried() -> None:
            tried.append(1)
            if len(tried) == 2:
                both_tried.set()

        try:
            async with m.tasks.acquire(node["uuid"], "race") as task:
                one_tried()
                await asyncio.wait_for(both_tried.wait(), 10)  # still holding while the other tries
                return task.conductor
        except errors.NodeLocked:
            one_tried()
            raise

    for _ in range(25):
        tried: list[int] = []
        both_tried = asyncio.Event()
        results = await asyncio.gather(hold(a, tried, both_tried), hold(b, tried, both_tried), return_exceptions=True)
        winners = [r for r in results if not isinstance(r, BaseException)]
        assert len(winners) == 1, results
        assert all(isinstance(r, errors.NodeLocked) for r in results if isinstance(r, BaseException))
        assert (await a.nodes.get(node["uuid"]))["reservation"] is None  # the block's end released it


async def test_expired_lease_is_reclaimable(pool) -> None:
    a, b = manager(pool, "lease-a", lock_lease=0.2), manager(pool, "lease-b")
    node = await new_node(a)
    async with contextlib.AsyncExitStack() as held_by_a:
        await held_by_a.enter_async_context(a.tasks.acquire(node["uuid"], "test"))
        with pytest.raises(errors.NodeLocked):
            async with b.tasks.acquire(node["uuid"], "test"):
                pass
        await asyncio.sleep(0.4)  # a never refreshes (its refresher is not started): the lease expires
        async with b.tasks.acquire(node["uuid"], "test") as task:
            assert task.node["reservation"] == "lease-b"
            with pytest.raises(errors.NodeLocked):  # the old holder may not write any more
                await a.nodes.update(node["uuid"], {"extra": {"x": 1}}, expect_reservation="lease-a")
    assert (await a.nodes.get(node["uuid"]))["reservation"] is None


async def test_dead_conductor_nodes_are_recovered(pool) -> None:
    live = manager(pool, "survivor", heartbeat_timeout=5)
    conductors = ConductorRepository(pool)
    await conductors.register(
        hostname="dead-host",
        grpc_address="127.0.0.1:1",
        conductor_group="",
        hardware_types=["fake-hardware"],
        interfaces={},
    )
    await pool.execute("UPDATE conductors SET heartbeat_at = now() - interval '1 hour' WHERE hostname = 'dead-host'")
    await conductors.register(
        hostname="survivor",
        grpc_address="127.0.0.1:2",
        conductor_group="",
        hardware_types=["fake-hardware"],
        interfaces={},
    )
    deploying = await new_node(live, states.DEPLOYING, target_provision_state=states.ACTIVE)
    waiting = await new_node(live, states.DEPLOYWAIT, target_provision_state=states.ACTIVE)
    for node in (deploying, waiting):
        await pool.execute(
            "UPDATE nodes SET reservation = 'dead-host', reservation_expires_at = now() + interval '1 hour' "
            "WHERE uuid = $1::uuid",
            node["uuid"],
        )
    periodic = PeriodicWork(live, registration={})
    assert await periodic.recover_dead() == 2
    # The interrupted deploy is resumed from its recorded step, not failed.
    for _ in range(200):
        resumed = await live.nodes.get(deploying["uuid"])
        if resumed["provision_state"] == states.ACTIVE and resumed["reservation"] is None:
            break
        await asyncio.sleep(0.05)
    assert resumed["provision_state"] == states.ACTIVE and resumed["last_error"] is None, resumed
    # The waiting node's resume runs in the background too, in no set order
    # with the other's: wait (bounded) for it to let go of the lock.
    for _ in range(200):
        carried_on = await live.nodes.get(waiting["uuid"])
        if carried_on["reservation"] is None:
            break
        await asyncio.sleep(0.05)
    assert carried_on["provision_state"] == states.DEPLOYWAIT and carried_on["reservation"] is None
    events = [
        r["message"]
        for r in await pool.fetch(
            "SELECT message FROM node_events WHERE node_uuid = $1::uuid ORDER BY sequence", deploying["uuid"]
        )
    ]
    assert any("dead-host went offline" in m and "resuming" in m for m in events), events
    # A second round finds nothing left to adopt.
    assert await periodic.recover_dead() == 0


async def test_callback_timeout_fails_the_deploy(pool) -> None:
    m = manager(pool, "timeouts", deploy_callback_timeout=60)
    node = await new_node(m, states.DEPLOYWAIT, target_provision_state=states.ACTIVE)
    fresh = await new_node(m, states.DEPLOYWAIT, target_provision_state=states.ACTIVE)
    await pool.execute(
        "UPDATE nodes SET provision_updated_at = now() - interval '2 minutes' WHERE uuid = $1::uuid", node["uuid"]
    )
    await pool.execute("UPDATE nodes SET provision_updated_at = now() WHERE uuid = $1::uuid", fresh["uuid"])
    assert await PeriodicWork(m, registration={}).check_callback_timeouts() == 1
    after = await m.nodes.get(node["uuid"])
    assert after["provision_state"] == states.DEPLOYFAIL and "Timeout reached" in (after["last_error"] or "")
    assert (await m.nodes.get(fresh["uuid"]))["provision_state"] == states.DEPLOYWAIT


async def test_every_verb_from_every_state(pool) -> None:
    m = manager(pool, "verbs", fake_deploy_delay="30")  # flows block: we only check acceptance
    events = sorted({spec.event for spec in states.API_VERBS.values()})
    for state in sorted(states.ALL_STATES):
        for event in events:
            node = await new_node(m, state, instance_info={})
            try:
                await m.do_provision_action(
                    node["uuid"],
                    event,
                    rescue_password="pw" if event == "rescue" else None,
                    clean_steps=[] if event == "clean" else None,
                )
            except errors.InvalidStateRequested:
                assert event not in states.allowed_events(state), (state, event)
                after = await m.nodes.get(node["uuid"])
                assert after["provision_state"] == state and after["reservation"] is None, (state, event)
                continue
            assert event in states.allowed_events(state), (state, event)
            # The background flow may already have moved on (cleaning and
            # verification are instant on fake hardware): the change feed
            # proves the node entered the table's target first.
            target = states.next_state(state, event).target
            entered = await pool.fetchval(
                "SELECT count(*) FROM node_events WHERE node_uuid = $1::uuid AND event = $2 AND provision_state = $3",
                node["uuid"],
                event,
                target,
            )
            assert entered == 1, (state, event, target)
    await m.tasks.stop(grace=0.1)
    assert await pool.fetchval("SELECT count(*) FROM nodes WHERE reservation = 'verbs'") == 0


async def test_interface_overrides_are_checked(pool) -> None:
    m = manager(pool, "ifaces")
    with pytest.raises(errors.InvalidParameterValue):
        await new_node(m, boot_interface="redfish-virtual-media")
    node = await new_node(m, boot_interface="ipxe")
    assert node["boot_interface"] == "ipxe" and node["power_interface"] == "fake"
    with pytest.raises(errors.DriverNotFound):
        await m.create_node({"driver": "idrac"})  # a hardware type Ferrum does not have
    assert uuid.UUID(node["uuid"])


async def test_active_nodes_of_a_dead_conductor_are_taken_over(pool) -> None:
    from services.common.hashring import ConductorRings

    conductors = ConductorRepository(pool)
    await pool.execute("DELETE FROM conductors")  # only this test's two conductors exist
    for name in ("to-a", "to-b"):
        await conductors.register(
            hostname=name,
            grpc_address=f"127.0.0.1:{len(name)}",
            conductor_group="",
            hardware_types=["fake-hardware"],
            interfaces={},
        )
    survivor = manager(pool, "to-a", heartbeat_timeout=5)
    nodes = [await new_node(survivor, states.ACTIVE) for _ in range(30)]
    before = ConductorRings(await conductors.list_alive(5))
    owned_by_b = [
        n["uuid"]
        for n in nodes
        if (owner := before.owner(n["uuid"], "fake-hardware", "")) is not None and owner["hostname"] == "to-b"
    ]
    assert owned_by_b, "the ring gave to-b nothing: the test proves nothing"
    await pool.execute("UPDATE conductors SET heartbeat_at = now() - interval '1 hour' WHERE hostname = 'to-b'")
    await PeriodicWork(survivor, registration={}).recover_dead()
    mine = [n["uuid"] for n in nodes]
    taken = {
        str(r["node_uuid"])
        for r in await pool.fetch(
            "SELECT node_uuid FROM node_events WHERE event = 'take-over' AND node_uuid = ANY($1::uuid[])", mine
        )
    }
    assert taken == set(owned_by_b)
    assert not await pool.fetchval(
        "SELECT count(*) FROM nodes WHERE reservation IS NOT NULL AND provision_state = 'active'"
    )
    assert not await pool.fetchval("SELECT online FROM conductors WHERE hostname = 'to-b'")


async def test_history_for_a_deleted_node_is_not_found(pool) -> None:
    """A request racing a node's deletion gets 404, never a foreign-key error."""
    from services.common.db.events import EventRepository

    m = manager(pool, "gone")
    node = await new_node(m)
    await m.nodes.delete(node["uuid"])
    with pytest.raises(errors.NodeNotFound):
        await EventRepository(pool).record(node, event="maintenance", message="late")


async def test_retired_node_cleans_to_manageable(pool) -> None:
    """API 1.61: a retired node is undeployed and cleaned, but never offered again."""
    m = manager(pool, "retire")
    retired = await new_node(m, states.ACTIVE, retired=True, retired_reason="end of life")
    kept = await new_node(m, states.ACTIVE)
    for node in (retired, kept):
        await m.do_provision_action(node["uuid"], "delete")
    deadline = asyncio.get_running_loop().time() + 20
    while True:
        a, b = await m.nodes.get(retired["uuid"]), await m.nodes.get(kept["uuid"])
        if (
            not a["reservation"]
            and not b["reservation"]
            and a["provision_state"] in (states.MANAGEABLE, states.AVAILABLE)
            and b["provision_state"] == states.AVAILABLE
        ):
            break
        assert asyncio.get_running_loop().time() < deadline, (a["provision_state"], b["provision_state"])
        await asyncio.sleep(0.05)
    assert a["provision_state"] == states.MANAGEABLE and b["provision_state"] == states.AVAILABLE
    await m.tasks.stop(grace=1)


async def test_update_node_holds_the_lock_while_it_writes(pool) -> None:
    """A PATCH is refused while another conductor holds the node, and while it writes no
    operation can start on the node; afterwards the node is free again."""
    a, b = manager(pool, "patch-a"), manager(pool, "patch-b")
    node = await new_node(a)
    async with b.tasks.acquire(node["uuid"], "test"):
        with pytest.raises(errors.NodeLocked):
            await a.update_node(node["uuid"], {"extra": {"x": 1}})
        assert (await a.nodes.get(node["uuid"]))["extra"] == {}  # the refused patch changed nothing

    writing, finish = asyncio.Event(), asyncio.Event()
    real_update = a.nodes.update

    async def slow_update(*args, **kwargs):  # a write that takes a while (the only fake here)
        writing.set()
        await finish.wait()
        return await real_update(*args, **kwargs)

    a.nodes.update = slow_update  # type: ignore[method-assign]
    patching = asyncio.create_task(a.update_node(node["uuid"], {"extra": {"x": 2}}))
    await asyncio.wait_for(writing.wait(), 10)
    with pytest.raises(errors.NodeLocked):
        async with b.tasks.acquire(node["uuid"], "deploy"):  # e.g. a deploy cannot start mid-patch
            pass
    finish.set()
    saved = await asyncio.wait_for(patching, 10)
    assert saved["extra"] == {"x": 2} and saved["reservation"] is None
    stored = await b.nodes.get(node["uuid"])
    assert stored["extra"] == {"x": 2} and stored["reservation"] is None


async def test_a_lock_being_released_cannot_be_taken_by_the_same_conductor_meanwhile(pool) -> None:
    """The row lock is per hostname, so while one operation's release is on its way to the
    database a second operation in the same conductor must not start: its reservation
    would be cleared under it by the first one's release (seen after a take-over: the
    resumed flow's release raced the agent's heartbeat, which then lost its lock mid-step
    and left the node failed or stuck in a wait state)."""
    m = manager(pool, "release-race")
    node = await new_node(m)
    releasing, finish = asyncio.Event(), asyncio.Event()
    real_release = m.tasks.nodes.release

    async def slow_release(*args, **kwargs):  # the first release takes a while (the only fake here)
        if not releasing.is_set():
            releasing.set()
            await finish.wait()
        return await real_release(*args, **kwargs)

    m.tasks.nodes.release = slow_release  # type: ignore[method-assign]

    async def first_operation() -> None:
        async with m.tasks.acquire(node["uuid"], "first"):
            pass

    first = asyncio.create_task(first_operation())
    await asyncio.wait_for(releasing.wait(), 10)  # its release is on its way to the database
    with pytest.raises(errors.NodeLocked):
        async with m.tasks.acquire(node["uuid"], "second"):
            pass
    finish.set()
    await asyncio.wait_for(first, 10)
    assert (await m.nodes.get(node["uuid"]))["reservation"] is None
    async with m.tasks.acquire(node["uuid"], "third"):  # released: free again, and this lock holds
        await asyncio.sleep(0)
        saved = await m.nodes.update(node["uuid"], {"extra": {"x": 1}}, expect_reservation="release-race")
    assert saved["extra"] == {"x": 1}


async def released_but_held(m: Any, node: NodeRecord, purpose: str) -> tuple[asyncio.Task[None], asyncio.Event]:
    """An operation on ``node`` whose release has committed but whose answer is read only
    when the returned event is set (the only fake): the node is unlocked in the row and
    still held by this process. Returns the operation's task and that event."""
    committed, finish = asyncio.Event(), asyncio.Event()
    real_release = m.tasks.nodes.release

    async def late_answer(*args: Any, **kwargs: Any) -> Any:
        released = await real_release(*args, **kwargs)
        committed.set()
        await finish.wait()
        return released

    m.tasks.nodes.release = late_answer

    async def first_operation() -> None:
        async with m.tasks.acquire(node["uuid"], purpose):
            pass

    first = asyncio.create_task(first_operation())
    await asyncio.wait_for(committed.wait(), 10)
    return first, finish


async def test_a_node_released_in_the_database_but_not_yet_forgotten_is_waited_for(pool) -> None:
    """A client that reads the node unlocked may send its next verb before the releasing
    coroutine has run again to forget the node (a full CI run: provide right after manage
    settled got 409 "locked by host test-conductor"). The row is the truth: the second
    operation waits for the node to be forgotten and then gets the lock; it is not refused."""
    m = manager(pool, "forget-race")
    node = await new_node(m)
    first, finish = await released_but_held(m, node, "manage")
    assert (await m.nodes.get(node["uuid"]))["reservation"] is None and m.tasks.holds(node["uuid"])

    async def second_operation() -> str | None:
        async with m.tasks.acquire(node["uuid"], "provide") as task:
            return task.node["reservation"]

    second = asyncio.create_task(second_operation())
    await asyncio.sleep(0.2)
    assert not second.done()  # waiting, not refused
    finish.set()
    assert await asyncio.wait_for(second, 10) == "forget-race"
    await asyncio.wait_for(first, 10)
    assert (await m.nodes.get(node["uuid"]))["reservation"] is None and not m.tasks.holds(node["uuid"])


async def test_a_verb_waiting_with_a_heartbeat_for_the_same_release_is_not_refused(pool) -> None:
    """Two operations of one conductor wait for the same node to be forgotten: a heartbeat
    for a wait state the node has left, then a verb (a full CI run: a deploy sent right
    after provide settled got 409 "locked by host fleet-conductor"). The heartbeat wakes
    first and holds the node while its state check runs and fails; the verb must wait for
    that too and then get the lock, not be refused because the node is held again."""
    m = manager(pool, "double-wait")
    node = await new_node(m)
    first, finish = await released_but_held(m, node, "provide")

    async def heartbeat() -> bool:
        async with m.tasks.acquire_in_states(node["uuid"], "agent heartbeat", (states.CLEANWAIT,)) as task:
            return task is not None

    async def verb() -> str | None:
        async with m.tasks.acquire(node["uuid"], "deploy") as task:
            return task.node["reservation"]

    beat = asyncio.create_task(heartbeat())
    await asyncio.sleep(0.2)  # waiting first
    deploy = asyncio.create_task(verb())
    await asyncio.sleep(0.2)
    assert not beat.done() and not deploy.done()
    finish.set()
    assert await asyncio.wait_for(beat, 10) is False  # the node is not in clean wait: never locked
    assert await asyncio.wait_for(deploy, 10) == "double-wait"
    await asyncio.wait_for(first, 10)
    assert (await m.nodes.get(node["uuid"]))["reservation"] is None and not m.tasks.holds(node["uuid"])


async def test_work_for_one_state_never_locks_a_node_that_has_moved_on(pool) -> None:
    """A heartbeat or a callback timeout reads the node, then locks it to continue a wait
    state. If the operation ends in between, locking the finished node anyway made the
    client that saw it settled and unlocked get 409 "locked by host" for its next verb (a
    full CI run: a deploy right after provide). The state is checked by the statement that
    takes the lock: a node in another state is not locked at all."""
    m, other = manager(pool, "in-states"), manager(pool, "in-states-other")
    node = await new_node(m)
    assert node["provision_state"] == states.ENROLL
    async with m.tasks.acquire_in_states(node["uuid"], "agent heartbeat", (states.CLEANWAIT,)) as task:
        assert task is None
        row = await m.nodes.get(node["uuid"])
        assert row["reservation"] is None and not m.tasks.holds(node["uuid"])
    async with m.tasks.acquire_in_states(node["uuid"], "agent heartbeat", (states.ENROLL,)) as task:
        assert task is not None and task.node["reservation"] == "in-states"
        assert (await m.nodes.get(node["uuid"]))["reservation"] == "in-states"
    assert (await m.nodes.get(node["uuid"]))["reservation"] is None and not m.tasks.holds(node["uuid"])
    async with other.tasks.acquire(node["uuid"], "busy"):
        for wanted in ((states.ENROLL,), (states.CLEANWAIT,)):  # held elsewhere: a 409, whatever the state
            with pytest.raises(errors.NodeLocked):
                async with m.tasks.acquire_in_states(node["uuid"], "agent heartbeat", wanted):
                    pass
    with pytest.raises(errors.NodeNotFound):
        async with m.tasks.acquire_in_states(str(uuid.uuid4()), "agent heartbeat", (states.ENROLL,)):
            pass


async def settled(m: ConductorManager, node_uuid: str) -> NodeRecord:
    for _ in range(500):
        node = await m.nodes.get(node_uuid)
        if node["reservation"] is None and node["target_provision_state"] is None:
            return node
        await asyncio.sleep(0.01)
    raise AssertionError(f"node {node_uuid} never settled")


async def test_a_verb_whose_node_changed_before_its_lock_runs_again(pool) -> None:
    """A provision verb reads a free node without locking it; its first transition takes
    the lock only if the row is unchanged. A write in between (the power sync's, which
    takes no lock) sends the verb round again, the usual way: accepted once, one event."""
    m = manager(pool, "changed-meanwhile")
    node = await new_node(m)
    real_build = m.tasks.build_task
    built: list[str | None] = []

    async def build_then_change(row: NodeRecord, *, purpose: str = "") -> Any:
        task = await real_build(row, purpose=purpose)
        built.append(row["reservation"])
        if len(built) == 1:
            await pool.execute("UPDATE nodes SET power_state = 'power off' WHERE uuid = $1::uuid", node["uuid"])
        return task

    m.tasks.build_task = build_then_change  # type: ignore[method-assign,assignment]  # the one fake: a write between read and lock
    await m.do_provision_action(node["uuid"], "manage")
    assert built == [None, "changed-meanwhile"]  # read unlocked, then locked first the second time
    after = await settled(m, node["uuid"])
    assert (after["provision_state"], after["power_state"]) == (states.MANAGEABLE, "power off")
    events = await pool.fetch(
        "SELECT event FROM node_events WHERE node_uuid = $1::uuid ORDER BY sequence", node["uuid"]
    )
    assert [e["event"] for e in events] == ["create", "manage", "done"]
    await m.tasks.stop(grace=1)


async def test_two_conductors_racing_one_verb_accept_it_once(pool, caplog: pytest.LogCaptureFixture) -> None:
    """Both read the free node; only one first transition can take the lock, and the other
    verb, run again the usual way, is refused (locked, or no longer valid in the new state)."""
    caplog.set_level(logging.INFO, logger="services.conductor.manager")
    a, b = manager(pool, "verb-race-a"), manager(pool, "verb-race-b")
    node = await new_node(a)
    for _ in range(15):
        results = await asyncio.gather(
            a.do_provision_action(node["uuid"], "manage"),
            b.do_provision_action(node["uuid"], "manage"),
            return_exceptions=True,
        )
        assert sum(r is None for r in results) == 1, results
        assert all(isinstance(r, errors.NodeLocked | errors.InvalidStateRequested) for r in results if r is not None)
        await settled(a, node["uuid"])
        manages = await pool.fetchval(
            "SELECT count(*) FROM node_events WHERE node_uuid = $1::uuid AND event = 'manage'", node["uuid"]
        )
        await pool.execute("DELETE FROM node_events WHERE node_uuid = $1::uuid", node["uuid"])
        assert manages == 1
        await pool.execute("UPDATE nodes SET provision_state = 'enroll' WHERE uuid = $1::uuid", node["uuid"])
    # Most rounds, both read the node before either wrote: the race was the first transitions'.
    assert sum("trying again" in r.getMessage() for r in caplog.records) >= 5
    await a.tasks.stop(grace=1)
    await b.tasks.stop(grace=1)
