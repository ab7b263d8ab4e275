"""A fix to pyghmi's BMC server for many BMCs in one process (the simulator's).

pyghmi routes a packet to a server session by the client's address and the
BMC's port: ``bmc_handlers[client address][bmc port]``. When a session sees
an IPMI 1.5 sessionless packet from its client address (a client that starts
over from the same UDP port), pyghmi drops ``bmc_handlers[client address]``
whole: the sessions that client has with *every other* BMC of the process
go too, their queued packets then fail (``'ServerSession' object has no
attribute 'sessionless_data'``) and those clients wait for answers that
never come. pyghmi's own client multiplexes up to 64 BMCs on one UDP socket,
so a conductor driving several simulated machines trips it at once.

Here only the entry of the BMC that saw the packet goes. Real BMCs are one
per device and never share the table, so only the simulator needs this.
"""

from __future__ import annotations

import os
import socket
import threading
from typing import Any

import pyghmi.ipmi.private.serversession as pyghmi_serversession
import pyghmi.ipmi.private.session as pyghmi_session

from services.common import pyghmi_io

_original_handle = pyghmi_serversession.ServerSession._handle_ipmi_packet


def _handle_ipmi_packet(self: Any, data: Any, sockaddr: Any = None, qent: Any = None) -> Any:
    handlers = pyghmi_session.Session.bmc_handlers
    if (
        qent is not None
        and sockaddr is not None
        and len(data) >= 13
        and data[4] in (0, 2)
        and bytes(data[5:13]) == bytes(8)  # sequence number and session id 0: sessionless
        and qent[2] in handlers
    ):
        sessions = handlers.get(sockaddr, {})
        if sessions.get(self.bmc.port) is self:
            del sessions[self.bmc.port]
            if not sessions:
                handlers.pop(sockaddr, None)
        server = handlers[qent[2]][0]
        server.pktqueue.append(qent)
        server.process_pktqueue()
        return None
    return _original_handle(self, data, sockaddr=sockaddr, qent=qent)


def _process_pktqueue(self: Any) -> None:
    """A server session's queue: a packet whose client address lost its entry
    goes to the BMC's sessionless handling instead of raising AttributeError."""
    handlers = pyghmi_session.Session.bmc_handlers
    while self.pktqueue:
        pkt = list(self.pktqueue.popleft())
        pkt[0] = bytearray(pkt[0])
        if not (pkt[0][0] == 6 and pkt[0][2:4] == b"\xff\x07"):
            continue
        if pkt[1] in handlers:
            self._handle_ipmi_packet(pkt[0], sockaddr=pkt[1], qent=pkt)
        elif pkt[2] in handlers:
            server = handlers[pkt[2]][0]
            server.sessionless_data(pkt[0], pkt[1])


def apply() -> None:
    """Install the fixes (idempotent), and pyghmi's shared socket I/O made safe for
    threads, on ``poll``: one process serves more than 1,024 BMCs only that way, and
    one BMC's answer can no longer freeze the I/O thread (services/common/pyghmi_io.py)."""
    pyghmi_io.install()
    pyghmi_serversession.ServerSession._handle_ipmi_packet = _handle_ipmi_packet
    pyghmi_serversession.ServerSession.process_pktqueue = _process_pktqueue


RETIRE_GRACE = 1.0  # seconds a retired socket's descriptor stays open (an I/O thread's select may hold it)


def retire_socket(sock: socket.socket) -> None:
    """Take a BMC's socket out of pyghmi's shared I/O and close it, safely.

    pyghmi's I/O thread turns its socket list into descriptors and then waits in
    ``select`` without the GIL; a descriptor closed in between makes that select
    fail with EBADF, which ends the thread, and every pyghmi user in the process
    (the conductor's ipmitool interfaces, the other simulators' BMCs) then waits
    for packets nobody reads. So: leave the list, point the descriptor at
    /dev/null (an in-flight select sees it readable and returns), and close it
    once the thread has moved on."""
    pyghmi_session.iosockets[:] = [s for s in pyghmi_session.iosockets if s is not sock]
    try:
        null = os.open(os.devnull, os.O_RDONLY)
        try:
            os.dup2(null, sock.fileno())
        finally:
            os.close(null)
    except OSError:
        sock.close()
        return
    timer = threading.Timer(RETIRE_GRACE, sock.close)
    timer.daemon = True
    timer.start()
