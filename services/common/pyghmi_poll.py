"""pyghmi's I/O thread on ``poll`` instead of ``select``, for processes with many descriptors.

pyghmi serves every IPMI session of a process from one I/O thread that
waits with ``select.select(iosockets, ...)`` and then reads *every* socket.
``select`` cannot watch a descriptor numbered 1024 or above: it raises
``ValueError``, the I/O thread dies, and every IPMI caller in the process
waits for answers nobody reads. A conductor reaches that number without a
single extra IPMI socket (its database pool, one HTTP connection per Redfish
BMC, console proxies and log files all hold descriptors); a simulator
reaches it with 1,024 BMCs, one UDP socket each. And reading every socket
after every wake-up costs two system calls per socket per packet: with
1,000 simulated BMCs in one process that is the whole CPU.

:func:`install` swaps the ``select`` module pyghmi's session module sees for
:class:`PollSelect` (``poll``, no descriptor limit, the registration kept
while the socket list stays the same) and makes pyghmi's ``_io_graball``
read only the sockets ``poll`` reported ready. Both run only in pyghmi's
one I/O thread, one after the other, so the hand-over needs no lock.
The conductor's IPMI client and the simulator's BMCs both install it.
"""

from __future__ import annotations

import select
import socket
import threading
from collections.abc import Callable, Sequence
from typing import Any

import pyghmi.ipmi.private.session as pyghmi_session

_READ_EVENTS = select.POLLIN | select.POLLPRI
_BROKEN_EVENTS = select.POLLNVAL


class PollSelect:
    """What pyghmi's session module calls ``select``: ``select()`` answered by ``poll``.

    Only the read list is watched (pyghmi passes empty write and error
    lists). The sockets seen ready are kept for :meth:`take_ready`."""

    def __init__(self) -> None:
        self._poller = select.poll()
        self._watched: list[socket.socket] = []
        self._by_fd: dict[int, socket.socket] = {}
        self._ready: list[socket.socket] | None = None
        self._owner: int | None = None  # the thread that last waited (pyghmi's I/O thread)

    def __getattr__(self, name: str) -> Any:
        return getattr(select, name)  # anything else pyghmi might want from the module

    def _watch(self, sockets: Sequence[socket.socket]) -> None:
        if list(sockets) == self._watched:
            return
        self._poller = select.poll()
        self._by_fd = {}
        for sock in sockets:
            fd = sock.fileno()
            if fd >= 0:  # a closed socket (-1) has nothing to wait for
                self._by_fd[fd] = sock
                self._poller.register(fd, _READ_EVENTS)
        self._watched = list(sockets)

    def select(
        self, rlist: Sequence[socket.socket], wlist: Sequence[Any], xlist: Sequence[Any], timeout: float | None = None
    ) -> tuple[list[socket.socket], list[Any], list[Any]]:
        self._watch(rlist)
        wait_ms = None if timeout is None else max(0, int(timeout * 1000 + 0.999))
        events = self._poller.poll(wait_ms)
        ready = []
        for fd, flags in events:
            sock = self._by_fd.get(fd)
            if sock is None:
                continue
            if flags & _BROKEN_EVENTS:
                self._watched = []  # a descriptor closed under us: register afresh next time
                continue
            ready.append(sock)
        self._ready = ready
        self._owner = threading.get_ident()
        return ready, [], []

    def take_ready(self) -> list[socket.socket] | None:
        """The sockets the last wait found readable, once; None when the caller is not the
        thread that waited (then every socket must be read, as pyghmi does)."""
        if self._owner != threading.get_ident():
            return None
        ready, self._ready = self._ready, None
        return ready


def _ready_graball(poll: PollSelect, original: Callable[..., Any]) -> Callable[..., Any]:
    def graball(mysockets: Sequence[socket.socket], iowaiters: Any) -> Any:
        ready = poll.take_ready()
        return original(mysockets if ready is None else ready, iowaiters)

    graball.ferrum_poll = poll  # type: ignore[attr-defined]  # marks the module as patched
    return graball


def install() -> PollSelect:
    """Put pyghmi's I/O thread on ``poll`` (idempotent; returns the one ``PollSelect``)."""
    current = getattr(pyghmi_session._io_graball, "ferrum_poll", None)
    if isinstance(current, PollSelect):
        return current
    poll = PollSelect()
    pyghmi_session._io_graball = _ready_graball(poll, pyghmi_session._io_graball)
    pyghmi_session.select = poll
    return poll
