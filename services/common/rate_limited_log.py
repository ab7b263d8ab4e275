"""A log line for an event that can repeat thousands of times a second.

Why: a listener under a connection flood refuses, times out or fails to
accept every few microseconds; one line each buried the real logs (313,598
EMFILE tracebacks, 147 MB). This logs the first event at once and then at
most one line per window, with the count of events the window held.
"""

from __future__ import annotations

import asyncio
import logging


class RateLimitedLog:
    """``note()`` an event; the logger sees the first one, then one summary per window.

    ``message`` is a %-format string taking two arguments: the number of
    events and the window in seconds.
    """

    def __init__(
        self,
        logger: logging.Logger,
        message: str,
        *,
        level: int = logging.WARNING,
        window: float = 10.0,
    ) -> None:
        self._logger = logger
        self._message = message
        self._level = level
        self._window = window
        self._pending = 0
        self._timer: asyncio.TimerHandle | None = None
        self.total = 0

    def note(self) -> None:
        """Count one event (call from the event loop's thread)."""
        self.total += 1
        if self._timer is not None:
            self._pending += 1
            return
        self._logger.log(self._level, self._message, 1, self._window)
        self._timer = asyncio.get_running_loop().call_later(self._window, self._end_window)

    def _end_window(self) -> None:
        self._timer = None
        if self._pending:
            count, self._pending = self._pending, 0
            self._logger.log(self._level, self._message, count, self._window)
            # Keep the limit while the events go on: the next line comes a window later.
            self._timer = asyncio.get_running_loop().call_later(self._window, self._end_window)

    def close(self) -> None:
        """Log what the open window counted and stop the timer (the listener is stopping)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._pending:
            count, self._pending = self._pending, 0
            self._logger.log(self._level, self._message, count, self._window)
