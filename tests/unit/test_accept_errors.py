"""asyncio's delayed accept retry on a listener closed meanwhile is one debug
line, not a traceback; any other callback failure is still logged as before."""

from __future__ import annotations

import asyncio
import logging
import socket

import pytest

from services.common.accept_errors import quiet_accept_errors


def _run_on_fresh_loop(schedule: object) -> None:
    loop = asyncio.new_event_loop()
    try:
        quiet_accept_errors(loop)

        async def main() -> None:
            schedule(loop)  # type: ignore[operator]
            for _ in range(3):  # let the callback run and its failure reach the handler
                await asyncio.sleep(0)

        loop.run_until_complete(main())
    finally:
        loop.close()


def test_retry_on_a_closed_listener_logs_no_traceback(caplog: pytest.LogCaptureFixture) -> None:
    listener = socket.socket()
    listener.close()  # what a stopping service leaves behind while a retry timer waits

    def schedule(loop: asyncio.AbstractEventLoop) -> None:
        loop.call_soon(loop._start_serving, asyncio.Protocol, listener)  # type: ignore[attr-defined]

    with caplog.at_level(logging.DEBUG):
        _run_on_fresh_loop(schedule)
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text
    assert "listener closed while it waited" in caplog.text


def test_other_callback_failures_still_reach_the_default_handler(caplog: pytest.LogCaptureFixture) -> None:
    def broken() -> None:
        raise RuntimeError("a real bug")

    def schedule(loop: asyncio.AbstractEventLoop) -> None:
        loop.call_soon(broken)

    with caplog.at_level(logging.DEBUG):
        _run_on_fresh_loop(schedule)
    assert any(r.levelno == logging.ERROR and "a real bug" in (r.exc_text or "") for r in caplog.records), caplog.text
