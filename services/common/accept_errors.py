"""Quiet asyncio's accept loop when the process is out of file descriptors.

When ``accept()`` fails with EMFILE, ENFILE, ENOBUFS or ENOMEM, asyncio's
selector loop calls the loop's exception handler with the message
``socket.accept() out of system resource``. It then stops accepting on that
socket for one second and tries again. The default handler logs a full
traceback every time, so a flood wrote 147 MB of identical tracebacks while
the service could not answer anyone. Here such a failure is counted and
logged once per window, without a traceback. Every other context still
reaches the handler that was installed before, or the loop's default one.

That one-second retry is a timer. When the listener closes in the meantime
(a service stopping while out of descriptors), the timer still fires, finds the
socket closed and raises, which the loop logged as a traceback at shutdown.
That retry has nothing left to do, so it is logged as one debug line instead.

The real protection is upstream: each listener's connection cap stays well
below the open-files limit, which ``ferrum`` raises to the hard limit at
start (``services/common/open_files.py``). This is the net under it.
"""

from __future__ import annotations

import asyncio
import logging
import resource
import socket
from typing import Any

from services.common.rate_limited_log import RateLimitedLog

LOG = logging.getLogger(__name__)
ACCEPT_OUT_OF_RESOURCES = "socket.accept() out of system resource"
WINDOW_SECONDS = 10.0
_MARK = "_ferrum_quiet_accept_errors"


def quiet_accept_errors(loop: asyncio.AbstractEventLoop, *, window: float = WINDOW_SECONDS) -> None:
    """Install the rate-limited handler on ``loop`` (once; later calls do nothing)."""
    previous = loop.get_exception_handler()
    if getattr(previous, _MARK, False):
        return
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    failures = RateLimitedLog(
        LOG,
        "accept failed count=%d window=%.0fs reason=out of file descriptors (EMFILE/ENFILE) or memory "
        f"open_files_limit={soft}: new connections wait in the listen backlog until descriptors free up",
        window=window,
    )

    def handler(event_loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        if context.get("message") == ACCEPT_OUT_OF_RESOURCES:
            failures.note()
        elif is_retry_on_closed_listener(context):
            LOG.debug("accept retry dropped: the listener closed while it waited for descriptors")
        elif previous is not None:
            previous(event_loop, context)
        else:
            event_loop.default_exception_handler(context)

    setattr(handler, _MARK, True)
    loop.set_exception_handler(handler)


def is_retry_on_closed_listener(context: dict[str, Any]) -> bool:
    """Whether ``context`` is asyncio's delayed accept retry failing on a closed socket.

    asyncio offers no public view of a handle's callback, so this reads the
    handle's ``_callback``/``_args``; on any other shape it answers False and the
    context is logged as before.
    """
    handle = context.get("handle")
    callback = getattr(handle, "_callback", None)
    if getattr(callback, "__name__", "") != "_start_serving":
        return False
    args: tuple[Any, ...] = getattr(handle, "_args", None) or ()
    listener = args[1] if len(args) > 1 else None
    return isinstance(listener, socket.socket) and listener.fileno() == -1
