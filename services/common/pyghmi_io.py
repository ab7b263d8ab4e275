"""pyghmi's shared socket I/O made safe for many threads, on both sides of IPMI.

pyghmi serves every IPMI session of a process, client or BMC server, from one
I/O thread reading module-wide UDP sockets, while any other thread may send on
them and wait for answers. Three of its module functions break under that
concurrency; :func:`install` replaces them in every process that speaks IPMI:
the conductor (its IPMI client) and the simulator (its BMCs, one UDP socket
per machine, hundreds per process), whose I/O thread is otherwise just as
exposed.

* ``_io_sendto`` makes the socket *blocking* before each send, while the I/O
  thread makes it non-blocking before each ``recvfrom`` and reads until
  ``EAGAIN``. A send landing between the two leaves the I/O thread blocked in
  ``recvfrom`` on one socket until that socket's next datagram: every other
  socket of the process goes unread meanwhile. On the simulator's side one
  answering BMC froze the other 999 of its process; their clients saw their
  first login packet go unanswered until their deadline (issue 23's failed
  logins at 2,000 nodes).
* ``_io_wait`` parks its caller on an event only the I/O thread sets, with no
  timeout of its own: a missed wake-up holds the caller for ever.
* two locks guard pyghmi's session tables, taken in both orders by
  ``send_payload`` and ``awaitresponse``; they become one re-entrant lock.

The ``poll`` I/O thread of :mod:`services.common.pyghmi_poll` is installed
with them.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from typing import Any

import pyghmi.ipmi.private.session as pyghmi_session
import pyghmi.ipmi.private.util as pyghmi_util

from services.common import pyghmi_poll

IO_WAIT_SLACK = 0.05  # seconds a pyghmi wait may outlast its deadline before it re-checks by itself


def io_sendto(mysocket: socket.socket, packet: bytes, sockaddr: Any) -> None:
    """pyghmi's ``_io_sendto`` without its ``setblocking(1)``: a UDP send on a
    non-blocking socket fails only when the send buffer is full, and pyghmi
    resends lost packets (a server's answer is resent when the client asks again)."""
    with contextlib.suppress(OSError):  # as pyghmi: a lost datagram
        mysocket.sendto(packet, sockaddr)


def io_wait(timeout: float, myaddr: Any = None, evq: Any = None) -> None:
    """pyghmi's ``_io_wait``, waiting at most until its deadline.

    pyghmi's own loops re-check their state and give up by their timers, so
    an early return is harmless to them; a missed wake-up no longer is a hang."""
    evt = threading.Event()
    if evq is not None:
        evq.append(evt)
    deadline = timeout + pyghmi_util._monotonic_time()
    pyghmi_session.ioqueue.append((deadline, evt, myaddr))
    if deadline < pyghmi_session.selectdeadline:
        intsock = pyghmi_session.iosockets[0]
        with contextlib.suppress(OSError):  # a full buffer: the I/O thread is awake anyway
            intsock.sendto(b"\x01", (pyghmi_session.myself, intsock.getsockname()[1]))
    evt.wait(max(0.0, timeout) + IO_WAIT_SLACK)


def install() -> None:
    """Install the fixes and the ``poll`` I/O thread (idempotent)."""
    pyghmi_poll.install()
    pyghmi_session._io_sendto = io_sendto
    pyghmi_session._io_wait = io_wait
    pyghmi_session.WAITING_SESSIONS = pyghmi_session.KEEPALIVE_SESSIONS
