"""Exclusive node locks as a scope, and bounded background work.

``async with tasks.acquire(node_uuid, "deploy") as task:`` takes the node's
lock (NodeLocked at once when someone else has it), builds the task and
releases the lock when the block ends, however it ends. An operation that
continues in the background calls ``task.spawn(work)`` inside the block: the
lock then passes to the background job and is released when that ends, as
Ironic's ``acquire`` and ``spawn_after`` do. So the api can answer 202 or 409
at once, and no code path can forget a release. ``acquire_at_first_write``
is the same scope for a provision verb whose lock its first transition takes.

While a conductor holds locks it refreshes their leases; if it dies the
leases expire (or its liveness lock vanishes) and another conductor adopts
the nodes (``adopt``) and resumes their work (services/conductor/takeover.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any

import asyncpg

from services.common import errors
from services.common.db.bios import BiosRepository
from services.common.db.node_secrets import NodeSecrets
from services.common.db.nodes import NodeRepository
from services.common.db.outage import is_unavailable
from services.common.db.ports import PortRepository
from services.common.db.records import NodeRecord, NodeVolumeConnector, NodeVolumeTarget, PortRecord, VolumeTargetRecord
from services.common.db.volumes import VolumeRepository, node_ports_and_volumes, nodes_volumes
from services.common.logs import node_uuid_var
from services.conductor.console_proxy import ConsoleProxies
from services.conductor.drivers.base import Task
from services.conductor.drivers.media import MediaImages
from services.conductor.drivers.registry import DriverRegistry
from services.conductor.image_cache import ImageCache

LOG = logging.getLogger(__name__)

# How long a second operation waits for this process to forget a node whose
# releasing write has already committed (normally the next turn of the loop).
RELEASE_GRACE = 5.0

Work = Callable[[Task], Awaitable[None]]


class TaskManager:
    def __init__(
        self,
        pool: asyncpg.Pool,
        registry: DriverRegistry,
        *,
        hostname: str,
        lease: float,
        workers: int,
        secrets: NodeSecrets,
    ) -> None:
        self.pool = pool
        self.registry = registry
        self.hostname = hostname
        self.lease = lease
        self.max_workers = workers
        self.nodes = NodeRepository(pool, secrets=secrets)
        self.ports = PortRepository(pool)
        self._held: set[str] = set()
        # Held here but not yet locked in the database (acquire_at_first_write): no lease to refresh.
        self._unclaimed: set[str] = set()
        # Operations waiting for this process to forget a node it still holds (see _reserve).
        self._forgotten: dict[str, asyncio.Event] = {}
        self._running: set[asyncio.Task[Any]] = set()
        self._refresher: asyncio.Task[None] | None = None
        # Set by the manager: how a boot interface gets the config drive as a URL.
        self.publish_configdrive: Callable[[Task], Awaitable[str]] | None = None
        self.read_configdrive: Callable[[Task], Awaitable[bytes | None]] | None = None
        # Set by the manager: floppies and boot ISOs for virtual-media boot.
        self.media: MediaImages | None = None
        # Set by the manager: instance images by content hash (the iSCSI deploy writes from it).
        self.image_cache: ImageCache | None = None
        # Set by the manager: the conductor's console proxies (console interfaces start theirs there).
        self.consoles: ConsoleProxies | None = None
        # Set by the manager: what to do with a locked node whose background work
        # lost the database (wait for it and resume the flow from its recorded step).
        self.on_database_lost: Callable[[Task], Awaitable[None]] | None = None

    def start(self) -> None:
        self._refresher = asyncio.create_task(self._refresh_leases(), name="lease-refresh")

    async def stop(self, grace: float = 10.0) -> None:
        """Let running operations finish (bounded), then drop every lock we hold."""
        if self._running:
            _, pending = await asyncio.wait(set(self._running), timeout=grace)
            for job in pending:
                job.cancel()
            if pending:
                await asyncio.wait(pending, timeout=2)
        if self._refresher:
            self._refresher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._refresher
        with contextlib.suppress(Exception):
            await self.nodes.release_all(self.hostname)
        for node_uuid in list(self._held):
            self._forget(node_uuid)

    @property
    def busy(self) -> int:
        return len(self._running)

    def holds(self, node_uuid: str) -> bool:
        return node_uuid in self._held

    def check_capacity(self) -> None:
        """Fail fast with a retryable error rather than queue without bound."""
        if len(self._running) >= self.max_workers:
            raise errors.NoFreeConductorWorker(
                f"Requested action cannot be performed due to lack of free conductor workers "
                f"({self.max_workers} busy on {self.hostname})."
            )

    @contextlib.asynccontextmanager
    async def acquire(self, node_uuid: str, purpose: str) -> AsyncIterator[Task]:
        """The node locked for ``purpose`` (NodeLocked at once if taken), with its task."""
        node = await self._reserve(node_uuid)
        async with self._locked(node, purpose) as task:
            yield task

    @contextlib.asynccontextmanager
    async def acquire_at_first_write(self, node_uuid: str, purpose: str) -> AsyncIterator[Task]:
        """:meth:`acquire` for an operation whose checks before its first write only read
        (a provision verb): a free node is read, not locked, and the operation's first
        write (``NodeStates.transition``) takes the lock in the same statement, only if
        the row is still the version read (``Task.claim``). One commit fewer per
        operation: the lock's own commit was a third of a 1-worker manage's time
        (issue 22). The node counts as held in this process from the read, as after
        :meth:`acquire`; a check that fails ends the block with nothing written. If the
        row changed in between, the first write raises NodeChangedMeanwhile and the
        caller runs the operation again with :meth:`acquire`. A node that is locked
        (or left locked by this conductor's previous run) is locked at once, as
        :meth:`acquire` does."""
        if node_uuid in self._held:
            await self._wait_until_forgotten(node_uuid)
        self._held.add(node_uuid)
        self._unclaimed.add(node_uuid)
        task: Task | None = None
        locked = False
        try:
            version, node = await self.nodes.get_versioned(node_uuid)
            if node["reservation"] is not None:
                node = await self.nodes.reserve(node_uuid, self.hostname, self.lease)
                locked = True
                self._unclaimed.discard(node_uuid)
            task = await self._locked_task(node, purpose)
            if not locked:
                task.claim = (version, self.lease)
            yield task
        finally:
            self._unclaimed.discard(node_uuid)
            if not locked and (task is None or task.claim is not None):
                self._forget(node_uuid)  # nothing was written: no lock to release
            elif task is None or not task.handed_over:
                await self._let_go(node_uuid, task)

    @contextlib.asynccontextmanager
    async def acquire_in_states(
        self, node_uuid: str, purpose: str, provision_states: tuple[str, ...]
    ) -> AsyncIterator[Task | None]:
        """:meth:`acquire` for work that only applies in ``provision_states`` (a
        heartbeat continuing a wait state, a callback timeout): the state is
        checked by the statement that takes the lock, and a free node that has
        moved on gives None without ever being locked."""
        node = await self._claim(node_uuid, provision_states)
        if node is None:
            yield None
            return
        async with self._locked(node, purpose) as task:
            yield task

    async def take_over(self, node_uuid: str, *, dead_holder: str) -> NodeRecord | None:
        """Move ``dead_holder``'s lock on the node to this conductor; None if another was
        faster or the holder let go. The node counts as held here from before the UPDATE
        is sent: the row lock is per hostname, so an operation of this conductor starting
        meanwhile (the agent's heartbeat) would otherwise share it. Pass the node on to
        :meth:`adopt` with ``claimed=True``."""
        if node_uuid in self._held:
            return None
        self._held.add(node_uuid)
        taken = None
        try:
            taken = await self.nodes.take_over(
                node_uuid, dead_holder=dead_holder, holder=self.hostname, lease=self.lease
            )
        finally:
            if taken is None:
                self._forget(node_uuid)
        return taken

    @contextlib.asynccontextmanager
    async def adopt(self, node: NodeRecord, purpose: str, *, claimed: bool = False) -> AsyncIterator[Task]:
        """A node whose lock this conductor already holds in the database: taken over
        (``claimed``: :meth:`take_over` marked it held) or left by its own previous run."""
        if not claimed:
            if node["uuid"] in self._held:
                raise errors.NodeLocked(f"Node {node['uuid']} is already being worked on by {self.hostname}")
            self._held.add(node["uuid"])
        async with self._locked(node, purpose) as task:
            yield task

    @contextlib.asynccontextmanager
    async def _locked(self, node: NodeRecord, purpose: str) -> AsyncIterator[Task]:
        task: Task | None = None
        try:
            task = await self._locked_task(node, purpose)
            yield task
        finally:
            if task is None or not task.handed_over:
                await self._let_go(node["uuid"], task)

    async def _locked_task(self, node: NodeRecord, purpose: str) -> Task:
        """The task of a node this operation holds: it can spawn background work and lock others."""
        task = await self.build_task(node, purpose=purpose)
        task.spawner = self._spawn
        task.acquire_node = self.acquire
        task.child_nodes = functools.partial(self.nodes.children, node["uuid"])
        task.peek_node = self.nodes.get
        return task

    @contextlib.asynccontextmanager
    async def reserved(self, node_uuid: str) -> AsyncIterator[NodeRecord]:
        """The node locked for a plain field update: no task, so no driver is
        composed (a PATCH may be what repairs a node whose driver cannot load)."""
        node = await self._reserve(node_uuid)
        try:
            yield node
        finally:
            await self.release(node_uuid)

    async def shared(self, node_uuid: str) -> Task:
        """Read-only access without the lock (Ironic's ``shared=True``): reads
        and validation only, never a change."""
        return await self.build_task(await self.nodes.get(node_uuid))

    async def _reserve(self, node_uuid: str) -> NodeRecord:
        node = await self._claim(node_uuid, None)
        assert node is not None  # without states the database locks the node or raises
        return node

    async def _claim(self, node_uuid: str, provision_states: tuple[str, ...] | None) -> NodeRecord | None:
        if node_uuid in self._held:
            # The row lock is per conductor hostname, so a second operation in
            # this process would get it too: refuse it here, unless the row is
            # already free and only this process has yet to forget the node.
            await self._wait_until_forgotten(node_uuid)
        self._held.add(node_uuid)
        node: NodeRecord | None = None
        try:
            if provision_states is None:
                node = await self.nodes.reserve(node_uuid, self.hostname, self.lease)
            else:
                node = await self.nodes.reserve_in_states(node_uuid, self.hostname, self.lease, provision_states)
        finally:
            if node is None:
                self._forget(node_uuid)
        return node

    async def _wait_until_forgotten(self, node_uuid: str) -> None:
        """Wait for a node whose release has committed but that this process still holds.

        An operation clears the row lock and forgets the node when the write's
        answer is read, a turn of the loop or more later on a busy machine. A
        client that saw the node unlocked may send its next request in between
        (a provision verb right after the previous one settled), and must not
        get a 409 for a lock that is no longer there. The row is the truth: if
        it still names this conductor, the node is busy here and the answer is
        409 at once; otherwise wait (``RELEASE_GRACE`` at most) for the node to
        be forgotten, and again if another operation of this process that
        waited for the same release took it first.
        """
        locked = errors.NodeLocked(
            f"Node {node_uuid} is locked by host {self.hostname}, please retry after the current "
            "operation is completed."
        )
        loop = asyncio.get_running_loop()
        deadline = loop.time() + RELEASE_GRACE
        while node_uuid in self._held:
            if node_uuid in self._unclaimed:  # an operation that will take the lock is under way
                raise locked
            # Held again after a wait: another operation of this process that waited too
            # woke first. It may only be trying (a heartbeat whose state check will fail
            # and let go at once), so the row decides again rather than the set.
            if await self.nodes.holder(node_uuid) == self.hostname:
                raise locked
            if node_uuid not in self._held:
                return
            forgotten = self._forgotten.setdefault(node_uuid, asyncio.Event())
            try:
                await asyncio.wait_for(forgotten.wait(), max(deadline - loop.time(), 0))
            except TimeoutError:
                raise locked from None

    def _forget(self, node_uuid: str) -> None:
        self._held.discard(node_uuid)
        waiting = self._forgotten.pop(node_uuid, None)
        if waiting is not None:
            waiting.set()

    async def shared_many(self, nodes: list[NodeRecord]) -> list[Task | errors.FerrumError]:
        """``shared`` for nodes already read: their ports and volumes in two queries, whatever
        their number (the power sync reads thousands of nodes a cycle). A node whose driver
        cannot be composed (an interface no longer enabled) gets its error in its place."""
        ids = [node["id"] for node in nodes]
        ports: dict[int, list[PortRecord]] = {i: [] for i in ids}
        for port in await self.ports.list_for_node_ids(ids):
            ports[port["node_id"]].append(port)
        volumes = await nodes_volumes(self.pool, ids)
        tasks: list[Task | errors.FerrumError] = []
        for node in nodes:
            try:
                tasks.append(self._task(node, ports[node["id"]], *volumes.get(node["id"], ([], []))))
            except errors.FerrumError as exc:
                tasks.append(exc)
        return tasks

    async def build_task(self, node: NodeRecord, *, purpose: str = "") -> Task:
        ports, targets, connectors = await node_ports_and_volumes(self.pool, node["id"])
        return self._task(node, ports, targets, connectors, purpose=purpose)

    def _task(
        self,
        node: NodeRecord,
        ports: list[PortRecord],
        targets: list[NodeVolumeTarget],
        connectors: list[NodeVolumeConnector],
        *,
        purpose: str = "",
    ) -> Task:
        node_id = node["id"]
        bios = BiosRepository(self.pool)
        return Task(
            node=node,
            ports=ports,
            driver=self.registry.compose(node),
            conductor=self.hostname,
            volume_targets=targets,
            volume_connectors=connectors,
            merge_internal_info=self.nodes.merge_internal_info,
            update_fields=self._update_fields,
            save_volume_target_properties=self._save_volume_target_properties,
            read_bios_settings=lambda: bios.list(node_id),
            save_bios_settings=lambda settings, registry: bios.replace(node_id, settings, registry),
            publish_configdrive=self.publish_configdrive,
            read_configdrive=self.read_configdrive,
            media=self.media,
            image_cache=self.image_cache,
            consoles=self.consoles,
            purpose=purpose,
        )

    async def _save_volume_target_properties(self, target_uuid: str, properties: Any) -> None:
        await VolumeRepository[VolumeTargetRecord](self.pool, "target").update(
            target_uuid, {"properties": dict(properties)}
        )

    async def _update_fields(self, node_uuid: str, changes: Mapping[str, Any]) -> NodeRecord:
        return await self.nodes.update(node_uuid, changes, expect_reservation=self.hostname)

    async def release(self, node_uuid: str) -> None:
        """Clear the row lock, then forget the node. In that order: the row lock
        is per hostname, so a second operation of this conductor admitted
        while the release is on its way to the database would reserve the row
        as its own and then have that reservation cleared under it."""
        try:
            await self.nodes.release(node_uuid, self.hostname)
        except Exception as exc:  # the lease will expire; take-over handles it
            if is_unavailable(exc):
                LOG.warning("could not release lock node_uuid=%s: database unavailable", node_uuid)
            else:
                LOG.exception("could not release lock node_uuid=%s", node_uuid)
        finally:
            self._forget(node_uuid)

    async def _let_go(self, node_uuid: str, task: Task | None) -> None:
        """The end of a locked operation: release the lock, unless its last write
        already did (``Task.lock_released``); then only forget the node. Either
        way the row is cleared before the node is forgotten (see :meth:`release`);
        a flow returns without awaiting anything after its releasing write, so
        the node is forgotten as soon as that write's answer is read."""
        if task is not None and task.lock_released:
            self._forget(node_uuid)
            return
        await self.release(node_uuid)

    def _spawn(self, task: Task, work: Work, name: str) -> None:
        """Run ``work`` in the background; the lock is released when it ends.

        Work that loses the database keeps the lock (its lease is refreshed
        again once the database is back) and is handed to ``on_database_lost``,
        which resumes the node's flow; nothing is failed because PostgreSQL
        restarted.
        """
        node_uuid = task.node["uuid"]

        async def runner() -> None:
            node_uuid_var.set(node_uuid)
            keep_lock = False
            try:
                await work(task)
            except Exception as exc:
                if is_unavailable(exc) and self.on_database_lost is not None:
                    LOG.warning("database lost during %s node_uuid=%s; resuming when it is back", name, node_uuid)
                    keep_lock = True
                else:
                    LOG.exception("background operation %s crashed node_uuid=%s", name, node_uuid)
            finally:
                if not keep_lock:
                    await self._let_go(node_uuid, task)
            if keep_lock:
                assert self.on_database_lost is not None
                try:
                    await self.on_database_lost(task)
                finally:
                    await self._let_go(node_uuid, task)

        job = asyncio.create_task(runner(), name=f"{name}:{node_uuid}")
        self._running.add(job)
        job.add_done_callback(self._running.discard)

    async def _refresh_leases(self) -> None:
        interval = max(self.lease / 3, 0.2)
        while True:
            await asyncio.sleep(interval)
            if not self._held:
                continue
            try:
                snapshot = self._held - self._unclaimed
                kept = set(await self.nodes.refresh_leases(self.hostname, list(snapshot), self.lease))
                # Nodes released while the refresh ran were not lost, just done.
                lost = (snapshot - kept) & self._held
                if lost:
                    LOG.warning("lost locks on %d nodes (taken over?): %s", len(lost), sorted(lost)[:5])
            except Exception as exc:
                if is_unavailable(exc):
                    LOG.warning("lease refresh: database unavailable; will retry")
                else:
                    LOG.exception("lease refresh failed; will retry")
