"""Running one or several services in one asyncio process until a signal.

``ferrum stack`` runs them all (plus the embedded PostgreSQL); ``ferrum api``
and friends run one each. Shutdown order is the reverse of start-up so that
the api stops taking requests before the conductor drains its work.
"""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import json
import logging
import signal
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Protocol

from services.common.config import Settings
from services.common.db.bootstrap import Database, open_database
from services.common.db.credentials import mask_password
from services.common.db.pool import create_pool
from services.common.endpoints import Endpoints

LOG = logging.getLogger(__name__)


class Service(Protocol):
    name: str

    async def start(self) -> dict[str, str]: ...

    async def stop(self) -> None: ...


ALL_SERVICES_ORDER = ("objectstore", "ipxe", "conductor", "api")


def service_factories() -> dict[str, Callable[[Settings, Any, Endpoints], Service]]:
    from services.api.service import ApiService
    from services.conductor.service import ConductorService
    from services.ipxe.service import IpxeService
    from services.objectstore.service import ObjectStoreService

    return {"objectstore": ObjectStoreService, "ipxe": IpxeService, "conductor": ConductorService, "api": ApiService}


class RunningStack:
    """Services started in order; ``close`` undoes exactly what was started."""

    def __init__(self) -> None:
        self.database: Database | None = None
        self.pool: Any = None
        self.services: list[Service] = []
        self.endpoints: dict[str, str] = {}  # what is printed and written to --ports-file
        self.addresses = Endpoints()  # what the services of this process read from each other
        self.settings: Settings | None = None

    async def start(self, settings: Settings, names: list[str]) -> None:
        self.settings = settings
        try:
            self.database = await open_database(settings)
            if self.database.embedded is not None:
                # Printed and written to the ports file: never the password (it is in the state directory).
                self.endpoints["PostgreSQL (embedded)"] = mask_password(self.database.url)
            self.pool = await create_pool(
                self.database.url, min_size=settings.database.pool_min, max_size=settings.database.pool_max
            )
            # Services that need a connection of their own (LISTEN) use the database actually opened.
            settings = dataclasses.replace(
                settings, database=dataclasses.replace(settings.database, url=self.database.url)
            )
            self.settings = settings
            factories = service_factories()
            for name in names:
                # One Endpoints object: each service writes where it listens, the
                # ones that need it read it (services/common/endpoints.py).
                service = factories[name](settings, self.pool, self.addresses)
                # Registered before start so a half-started service is stopped too.
                self.services.append(service)
                self.endpoints.update(await service.start())
            if "api" in names:
                # Ready only once the api can route a node to a conductor.
                api = next(s for s in self.services if s.name == "api")
                own = settings.conductor_hostname() if "conductor" in names else None
                await api.wait_routable(conductor=own)  # type: ignore[attr-defined]
        except BaseException:
            await self.close()
            raise

    async def close(self) -> None:
        for service in reversed(self.services):
            try:
                await service.stop()
            except Exception:
                LOG.exception("stopping %s failed", service.name)
        self.services.clear()
        if self.pool is not None:
            await self.pool.close()
            self.pool = None
        if self.database is not None:
            await self.database.close()
            self.database = None


async def wait_for_signal() -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()


def freeze_startup_heap() -> None:
    """Move everything start-up allocated (modules, grpc, aiohttp, the services; about
    93,000 tracked objects in ``ferrum stack``) out of the collector's reach.

    Why: CPython runs a full collection whenever enough objects have survived into
    the oldest generation, and a list of 200 nodes keeps thousands of documents alive
    across the younger collections, so every few dozen lists paid a walk over the
    whole start-up heap. With them frozen a full collection walks only what was
    allocated since (about 1,200 objects). In ``bench/api_cpu.py --no-lifecycle
    --lists 60`` (200 creates, 1,500 GETs, 60 lists of 200) the collector's CPU went
    from 0.38-0.44 s to 0.27-0.31 s, full collections from 0.26-0.30 to 0.15-0.18 s,
    the one made here included, and the stack's CPU per list from a mean of 19.3 ms
    to 15.6 ms (eight interleaved runs each, issue 22). Frozen objects are still freed
    by reference counting; only a reference cycle among them would stay.
    """
    gc.collect()
    gc.freeze()


async def serve(
    settings: Settings,
    names: list[str],
    *,
    ports_file: str | None = None,
    until: Callable[[RunningStack], Awaitable[None]] | None = None,
    notes: dict[str, str] | None = None,
) -> int:
    """Start ``names``, print the endpoints (and ``notes``, such as the CA file
    clients must trust), run until a signal (or ``until``)."""
    stack = RunningStack()
    await stack.start(settings, names)
    stack.endpoints.update(notes or {})
    if until is None:  # a server process, not a caller that embeds the stack (tests) and owns its heap
        freeze_startup_heap()
    try:
        width = max(len(k) for k in stack.endpoints)
        print("Ferrum is running:", flush=True)
        for label, address in stack.endpoints.items():
            print(f"  {label:<{width}}  {address}", flush=True)
        if ports_file:
            await asyncio.to_thread(Path(ports_file).write_text, json.dumps(stack.endpoints, indent=2))
        if until is not None:
            await until(stack)
        else:
            print("Press Ctrl-C to stop.", flush=True)
            await wait_for_signal()
            print("Stopping...", flush=True)
    finally:
        await stack.close()
    return 0
