"""Hold a thread at its start until something has happened: the interleaving
that a starved thread (one at nice 19 beside busy ones) gets now and then,
made to happen every time, with nothing of the code under test replaced."""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import time
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any


@dataclasses.dataclass
class Holds:
    """What the hold did: one entry per thread held, True when ``until`` came
    true (False when the bound ran out and the thread went on anyway)."""

    outcomes: list[bool] = dataclasses.field(default_factory=list)


@contextlib.contextmanager
def threads_held_at_start(name: str, until: Callable[[], bool], *, timeout: float = 30.0) -> Iterator[Holds]:
    """Every thread named ``name`` started inside the block waits before its
    first Python call until ``until()`` is true (polled, at most ``timeout``
    seconds). Uses ``threading.settrace``, so only threads started by the
    ``threading`` module inside the block are affected."""
    holds = Holds()
    seen: set[int] = set()

    def trace(frame: FrameType, event: str, arg: Any) -> None:
        thread = threading.current_thread()
        if event != "call" or thread.name != name or thread.ident in seen:
            return
        seen.add(thread.ident or 0)
        deadline = time.monotonic() + timeout
        while not until():
            if time.monotonic() > deadline:
                holds.outcomes.append(False)
                return
            time.sleep(0.002)
        holds.outcomes.append(True)

    threading.settrace(trace)
    try:
        yield holds
    finally:
        threading.settrace(None)
