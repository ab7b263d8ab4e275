"""The bounds every HTTP listener puts on its connections.

Why: a client that opens a connection and trickles its request head never
completes a request, so no request timeout ever fires. 19,990 such
connections once used every file descriptor: REST and iPXE stopped
answering, and the accept loop logged an EMFILE traceback per attempt.
So each listener (api, ipxe, objectstore, agent, simulator, conductor
metrics) has one ``ConnectionGuard`` that enforces two limits:

- **A connection cap.** A connection beyond ``max_connections`` is answered
  ``503`` with ``Connection: close`` at once, before any of its bytes are
  read, and closed. Its descriptor is back within microseconds. A warning
  says so at most once per ``REPORT_WINDOW`` seconds, with a count.
- **A header deadline.** A request head (request line and headers) must be
  complete ``header_timeout`` seconds after its first byte arrived. For the
  first request, the clock starts when the connection opens. Otherwise the
  connection is dropped. While the server itself has paused reading (too
  many pipelined requests, or a client that does not read its replies), the
  clock starts again, so the deadline never punishes the server's own flow control.

An idle keep-alive connection, between requests, is the idle timeout's
business (75 s in every server), not the deadline's. Request bodies are
bounded by each server's own limits.

The protocols tell the guard where heads start and end (``head_started``,
``head_finished``). The guard keeps the open heads in a dict ordered by start
time, so a tick only looks at the heads that are overdue.
"""

from __future__ import annotations

import asyncio
import logging
import resource
from dataclasses import dataclass
from typing import Protocol

from services.common.accept_errors import quiet_accept_errors
from services.common.rate_limited_log import RateLimitedLog

LOG = logging.getLogger(__name__)
REPORT_WINDOW = 10.0
FD_RESERVE = 256  # descriptors a process needs besides its client connections (database, files, gRPC)
REFUSAL = (
    b"HTTP/1.1 503 Service Unavailable\r\n"
    b"Content-Type: text/plain\r\n"
    b"Content-Length: 38\r\n"
    b"Retry-After: 1\r\n"
    b"Connection: close\r\n"
    b"\r\n"
    b"too many connections; try again later\n"
)


@dataclass(frozen=True)
class ListenerLimits:
    """The two bounds of one listener (see the module docstring)."""

    max_connections: int = 1024
    header_timeout: float = 10.0

    def __post_init__(self) -> None:
        if self.max_connections < 1:
            raise ValueError("max_connections must be at least 1")
        if self.header_timeout <= 0:
            raise ValueError("header_timeout must be positive")


class GuardedConnection(Protocol):
    """What the guard needs from a connection whose head is overdue."""

    def head_timed_out(self) -> None:
        """Drop the connection, or call ``head_started`` again if the server paused reading."""


class ConnectionGuard:
    """Counts one listener's connections and enforces its :class:`ListenerLimits`."""

    def __init__(self, listener: str, limits: ListenerLimits) -> None:
        self.listener = listener
        self.limits = limits
        self.live = 0
        self._heads: dict[GuardedConnection, float] = {}
        self._ticker: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.refusals = RateLimitedLog(
            LOG,
            f"connections refused listener={listener} count=%d window=%.0fs "
            f"reason=max_connections={limits.max_connections} reached",
            window=REPORT_WINDOW,
        )
        self.timeouts = RateLimitedLog(
            LOG,
            f"connections dropped listener={listener} count=%d window=%.0fs "
            f"reason=request head not complete within header_timeout={limits.header_timeout:g}s",
            level=logging.INFO,
            window=REPORT_WINDOW,
        )

    def start(self) -> None:
        """Called by the listener once it is bound, inside the running loop."""
        self._loop = asyncio.get_running_loop()
        quiet_accept_errors(self._loop)
        soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft != resource.RLIM_INFINITY and self.limits.max_connections > soft - FD_RESERVE:
            LOG.warning(
                "listener=%s max_connections=%d is above what the open-files limit allows (soft=%d, %d kept for "
                "other use): the process will run out of descriptors before the cap refuses anyone",
                self.listener,
                self.limits.max_connections,
                soft,
                FD_RESERVE,
            )

    def stop(self) -> None:
        if self._ticker is not None:
            self._ticker.cancel()
            self._ticker = None
        self._heads.clear()
        self.refusals.close()
        self.timeouts.close()

    # -- the cap ----------------------------------------------------------------------------------

    def admit(self, transport: asyncio.BaseTransport) -> bool:
        """Count a new connection, or answer 503 and close it when the cap is reached."""
        if self.live >= self.limits.max_connections:
            self.refusals.note()
            if isinstance(transport, asyncio.WriteTransport):
                transport.write(REFUSAL)
            transport.close()
            return False
        self.live += 1
        return True

    def release(self) -> None:
        """An admitted connection is gone."""
        self.live -= 1

    # -- the header deadline ----------------------------------------------------------------------

    def head_started(self, connection: GuardedConnection) -> None:
        """A request head began (or the connection opened); a running clock keeps its start."""
        if connection in self._heads:
            return
        loop = self._loop or asyncio.get_running_loop()
        self._heads[connection] = loop.time()
        if self._ticker is None:
            self._ticker = loop.call_later(self._tick_seconds(), self._tick)

    def head_finished(self, connection: GuardedConnection) -> None:
        """The head is complete (or the connection closed): its clock stops."""
        self._heads.pop(connection, None)

    def _tick_seconds(self) -> float:
        return min(1.0, self.limits.header_timeout / 4)

    def _tick(self) -> None:
        self._ticker = None
        loop = self._loop or asyncio.get_running_loop()
        horizon = loop.time() - self.limits.header_timeout
        overdue = []
        for connection, started in self._heads.items():  # oldest first: insertion order is start order
            if started > horizon:
                break
            overdue.append(connection)
        for connection in overdue:
            del self._heads[connection]
            connection.head_timed_out()
        if self._heads:
            self._ticker = loop.call_later(self._tick_seconds(), self._tick)

    def dropped_for_timeout(self) -> None:
        """A connection closed because its head was overdue (counted and logged, rate-limited)."""
        self.timeouts.note()
