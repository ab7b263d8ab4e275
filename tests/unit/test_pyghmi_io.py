"""pyghmi's socket I/O as both IPMI sides install it (services/common/pyghmi_io.py)."""

from __future__ import annotations

import socket
import time

import pyghmi.ipmi.private.session as pyghmi_session

from services.common import pyghmi_io
from services.simulator import pyghmi_fixes


def test_a_send_leaves_the_socket_non_blocking_on_the_simulators_side() -> None:
    """pyghmi's own send made the socket blocking, which froze the I/O thread's read loop on it."""
    pyghmi_fixes.apply()
    receiver = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sender = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        receiver.bind(("127.0.0.1", 0))
        sender.setblocking(False)
        pyghmi_session._io_sendto(sender, b"\x06\x00\xff\x07", receiver.getsockname())
        assert sender.getblocking() is False
        assert receiver.recvfrom(16)[0] == b"\x06\x00\xff\x07"  # and the datagram went
    finally:
        receiver.close()
        sender.close()


def test_the_conductors_client_installs_the_same_io() -> None:
    import services.conductor.drivers.ipmi_client  # noqa: F401 - importing it installs the fixes

    assert pyghmi_session._io_sendto is pyghmi_io.io_sendto
    assert pyghmi_session._io_wait is pyghmi_io.io_wait


def test_a_wait_whose_wake_up_never_comes_ends_at_its_deadline() -> None:
    pyghmi_io.install()
    pyghmi_session.Session._assignsocket()  # the I/O thread's wake-up socket must exist
    started = time.monotonic()
    pyghmi_io.io_wait(0.2)
    assert time.monotonic() - started < 0.2 + pyghmi_io.IO_WAIT_SLACK + 0.5
