"""Routing node RPCs to the conductor that owns the node (hash ring).

The ring is rebuilt from the conductors table every few seconds, and at once
when a call finds its conductor unreachable, so conductors joining or dying
are noticed without restarting the api.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

import asyncpg
import grpc

from ferrum.v1 import conductor_pb2_grpc
from services.common import errors
from services.common.db.conductors import ConductorRepository
from services.common.db.records import ConductorRecord
from services.common.grpcserver import REQUEST_ID_KEY, client_channel
from services.common.hashring import ConductorRings
from services.common.local_rpc import LocalServicer
from services.common.logs import request_id_var
from services.common.request_project import metadata as project_metadata
from services.common.tls import TlsFiles

LOG = logging.getLogger(__name__)


def no_valid_host(driver: str, group: str) -> str:
    """Ironic's words (``rpcapi.get_conductor_for``) for a driver and group no conductor serves."""
    return (
        "No valid host was found. Reason: No conductor service registered which supports "
        f'driver {driver} for conductor group "{group}". Ensure the driver is valid and enabled.'
    )


class ConductorRouter:
    def __init__(
        self,
        pool: asyncpg.Pool,
        *,
        refresh_interval: float,
        heartbeat_timeout: float,
        timeout: float,
        restart_grace: float = 10.0,
        local: Callable[[str, str], LocalServicer | None] | None = None,
    ) -> None:
        self.repo = ConductorRepository(pool)
        # The conductor of this process, by address and method (Endpoints.local): called without gRPC.
        self._local = local
        self.refresh_interval = refresh_interval
        self.heartbeat_timeout = heartbeat_timeout
        self.restart_grace = restart_grace
        self.timeout = timeout
        self.rings = ConductorRings([])
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._stubs: dict[str, conductor_pb2_grpc.ConductorServiceAsyncStub] = {}
        self._refreshed = 0.0
        self._token = ""
        self._tls: TlsFiles | None = None
        self._read_started = 0.0
        self._job: asyncio.Task[None] | None = None
        # Told when a conductor call has ended, however it ended: the api forgets which node
        # documents are current (services/api/fresh_nodes.py), since the call may have changed one.
        self.after_call: Callable[[], None] | None = None

    async def start(self, *, token: str, tls: TlsFiles | None) -> None:
        """Read the ring and start refreshing it; ``token`` is the internal token
        every conductor call presents, ``tls`` whether calls go over TLS."""
        self._token = token
        self._tls = tls
        await self.refresh()
        self._job = asyncio.create_task(self._loop(), name="ring-refresh")

    async def stop(self) -> None:
        if self._job:
            self._job.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._job
        for channel in self._channels.values():
            await channel.close()
        self._channels.clear()
        self._stubs.clear()

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.refresh_interval)
            try:
                await self.refresh()
            except Exception:
                LOG.exception("conductor ring refresh failed; keeping the previous ring")

    async def refresh(self) -> None:
        """Read the live conductors again. Refreshes may overlap (the periodic one
        and one caused by a routing miss): only a read that started after the
        ring in use was read replaces it, so an older, slower read can never put
        back a ring from before a conductor re-registered."""
        started = time.monotonic()
        alive = await self.repo.list_alive(self.heartbeat_timeout, restart_grace=self.restart_grace)
        if started >= self._read_started:
            self._read_started = started
            self.rings = ConductorRings(alive)
            self._refreshed = time.monotonic()

    async def wait_routable(self, *, conductor: str | None, timeout: float) -> bool:
        """Until the ring holds ``conductor`` (or any conductor when None); False on timeout."""
        deadline = time.monotonic() + timeout
        while True:
            await self.refresh()
            members = self.rings.conductors
            if (conductor in members) if conductor else bool(members):
                return True
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(0.1)

    def hardware_types(self) -> dict[str, list[str]]:
        return self.rings.drivers()

    async def route(self, node_uuid: str, driver: str, group: str = "") -> ConductorRecord:
        """The node's conductor. A ring that has none for it is read again first,
        so a conductor that has just registered again (after a restart, or an
        event-loop stall that outlasted its heartbeat) is routed to at once,
        not a refresh interval later. (One read per unroutable request: such a
        request costs a database read anyway.)"""
        if self.rings.owner(node_uuid, driver, group) is None:
            await self.refresh()
        return self.conductor_for(node_uuid, driver, group)

    async def require_served(self, node_uuid: str, driver: str, group: str = "") -> ConductorRecord:
        """The conductor a node with this driver and conductor group would have.

        For values a client is about to set (a new node, a patched driver or
        conductor group): none means the node could never be routed, and every
        later change to it would be a 503, so it is refused now with a 400, as
        Ironic refuses it (NoValidHost, turned into a 400 on create and update)."""
        if self.rings.owner(node_uuid, driver, group) is None:
            await self.refresh()
        owner = self.rings.owner(node_uuid, driver, group)
        if owner is None:
            error = errors.DriverNotFound if driver not in self.rings.drivers() else errors.NoValidHost
            raise error(no_valid_host(driver, group))
        return owner.copy()

    def conductor_for(self, node_uuid: str, driver: str, group: str = "") -> ConductorRecord:
        owner = self.rings.owner(node_uuid, driver, group)
        if owner is None:
            if driver not in self.rings.drivers():
                raise errors.DriverNotFound(no_valid_host(driver, group))
            raise errors.NoConductorAvailable(
                f'No conductor of conductor group "{group}" is available for driver {driver}.'
            )
        return owner.copy()

    def stub(self, address: str) -> conductor_pb2_grpc.ConductorServiceAsyncStub:
        """The conductor's stub, made once per address: a stub builds a callable for
        each of the service's ~40 methods, which cost more than the call itself
        when made for every call (issue 22)."""
        stub = self._stubs.get(address)
        if stub is None:
            channel = self._channels.get(address)
            if channel is None:
                channel = self._channels[address] = client_channel(address, token=self._token, tls=self._tls)
            stub = self._stubs[address] = conductor_pb2_grpc.ConductorServiceStub(channel)
        return stub

    async def call(self, node_uuid: str, driver: str, group: str, method: str, request: Any) -> Any:
        """Call the owner; on an unreachable owner refresh the ring and retry once."""
        try:
            return await self._call(node_uuid, driver, group, method, request)
        finally:
            if self.after_call is not None:
                self.after_call()

    async def _call(self, node_uuid: str, driver: str, group: str, method: str, request: Any) -> Any:
        for attempt in (1, 2):
            owner = await self.route(node_uuid, driver, group)
            local = self._local(owner["grpc_address"], method) if self._local is not None else None
            try:
                if local is not None:
                    return await local.call(method, request, timeout=self.timeout)
                return await getattr(self.stub(owner["grpc_address"]), method)(
                    request,
                    timeout=self.timeout,
                    metadata=((REQUEST_ID_KEY, request_id_var.get()), *project_metadata()),
                )
            except grpc.aio.AioRpcError as exc:
                error = errors.from_rpc_error(exc)
                if type(error) is errors.FerrumError:
                    LOG.warning(
                        "conductor %s failed %s: %s: %s", owner["hostname"], method, exc.code().name, exc.details()
                    )
                if isinstance(error, errors.NoConductorAvailable) and attempt == 1:
                    LOG.warning("conductor %s unreachable (%s); refreshing ring", owner["hostname"], exc.code().name)
                    await self.refresh()
                    continue
                raise error from None
        raise AssertionError("unreachable")
