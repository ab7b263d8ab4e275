"""Work a request starts and does not wait for (an allocation's node pick).

The api answers such a request at once and finishes in the background, as
Ironic's conductor does. The tasks are held here so none is garbage-collected
half-way, and stopping the api cancels and awaits whatever is still running.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any

LOG = logging.getLogger(__name__)


class BackgroundWork:
    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[Any]] = set()

    def spawn(self, work: Coroutine[Any, Any, Any], *, name: str) -> asyncio.Task[Any]:
        """Run ``work`` after the response; its failure is logged, never raised to anyone."""
        task = asyncio.get_running_loop().create_task(work, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._done)
        return task

    def _done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            LOG.error("background work %s failed", task.get_name(), exc_info=task.exception())

    async def close(self) -> None:
        """Cancel what is still running and wait for it to end."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
