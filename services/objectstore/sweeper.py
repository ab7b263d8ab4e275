"""Background expiry: removes expired objects at start-up (so objects that
expired while no object store ran go at once) and every ``sweep_interval``
seconds, and unreferenced backend bytes every ``max(sweep_interval,
orphan_grace / 2)`` seconds. Safe with several replicas: rows are claimed with
SKIP LOCKED, and bytes are removed only after their row is gone."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from services.objectstore.store import ObjectStore

LOG = logging.getLogger(__name__)


class Sweeper:
    def __init__(self, store: ObjectStore, *, interval: float, orphan_grace: float) -> None:
        self._store = store
        self._interval = interval
        self._orphan_every = max(interval, orphan_grace / 2)
        self._task: asyncio.Task[None] | None = None
        self.rounds = 0

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="objectstore-sweeper")

    async def _run(self) -> None:
        next_orphans = 0.0
        while True:
            try:
                await self._store.sweep_expired()
                if time.monotonic() >= next_orphans:
                    await self._store.sweep_orphans()
                    next_orphans = time.monotonic() + self._orphan_every
            except asyncio.CancelledError:
                raise
            except Exception:
                LOG.exception("object sweep failed; retrying in interval=%s", self._interval)
            self.rounds += 1
            await asyncio.sleep(self._interval)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
