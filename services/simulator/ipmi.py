"""IPMI on the simulator: one pyghmi BMC per machine, each on its own UDP port.

Racks that only speak IPMI are driven by the ``ipmi`` hardware type, so the
simulator answers IPMI 2.0 (RMCP+, cipher suite 3) as well as Redfish, and
``ipmitool -I lanplus -C 3`` works against it. Each machine's BMC binds
127.0.0.1 (the simulator's host) on an ephemeral port reported in the
inventory next to the Redfish address.

pyghmi's server is synchronous and keeps its sessions in process-wide
state, served by one thread of its own (``_serve``). Machine state belongs
to the simulator's event loop, so every change a BMC makes is handed to the
loop and awaited there (briefly: power requests are only scheduled, as the
Redfish side schedules them); reads of plain attributes need no hand-over.

Serial-over-LAN streams the machine's console: the simulated firmware has no
serial port, so its console is its boot log, one line per event (the same
lines ``console_line`` renders for everything else that shows a console).
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
import uuid as uuidlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pyghmi.ipmi.bmc as pyghmi_bmc
import pyghmi.ipmi.private.session as pyghmi_session

from services.simulator import pyghmi_fixes
from services.simulator.serial_console import console_line

if TYPE_CHECKING:
    from services.simulator.machine import Machine

LOG = logging.getLogger(__name__)

HANDOVER_TIMEOUT = 5.0  # a BMC answer waits at most this long for the event loop
SERVE_POLL = 0.1  # how often the serving thread sends queued console text and checks for stop
DEFAULT_USERNAME = "admin"  # when the simulator runs without credentials; IPMI always needs a user
DEFAULT_PASSWORD = "password"

# IPMI boot device selector (boot flags data 2, bits 5:2) <-> the simulator's Redfish targets.
IPMI_TO_TARGET = {1: "Pxe", 2: "Hdd", 5: "Cd", 6: "BiosSetup"}
TARGET_TO_IPMI = {v: k for k, v in IPMI_TO_TARGET.items()}
BOOT_FLAGS_VALID = 0x80
BOOT_FLAGS_PERSISTENT = 0x40
BOOT_FLAGS_EFI = 0x20
CC_INVALID_DATA = 0xCC
CC_PARAM_NOT_SUPPORTED = 0x80
CC_BUSY = 0xC0


class MachineBmc(pyghmi_bmc.Bmc):  # pyghmi ships no type hints: Any as far as mypy knows
    """The IPMI face of one simulated machine."""

    def __init__(
        self,
        machine: Machine,
        loop: asyncio.AbstractEventLoop,
        authdata: dict[str, str],
        host: str,
        outbox: queue.SimpleQueue[tuple[Any, str]],
    ) -> None:
        super().__init__(authdata, port=0, address=host, bmcuuid=uuidlib.UUID(machine.uuid))
        # pyghmi reports self.port as the SOL port; tell clients the one really bound.
        self.port = self.serversocket.getsockname()[1]
        self.machine = machine
        self.loop = loop
        self.outbox = outbox
        self._unsubscribe: Callable[[], None] | None = None
        self.keys_received = 0

    # ---- chassis power ---------------------------------------------------------------

    def get_power_state(self) -> str:
        return "on" if self.machine.power_state == "On" else "off"

    def is_active(self) -> bool:
        return True  # SOL is offered whether or not the machine runs, as real BMCs do

    def power_on(self) -> int:
        return self._power("On")

    def power_off(self) -> int:
        return self._power("ForceOff")

    def power_shutdown(self) -> int:
        return self._power("GracefulShutdown")

    def power_reset(self) -> int:
        return self._power("ForceRestart")

    def power_cycle(self) -> int:
        return self._power("PowerCycle")

    def pulse_diag(self) -> int:
        return self._run(lambda: self.machine.record("nmi", via="ipmi"))

    def _power(self, reset_type: str) -> int:
        def schedule() -> None:
            delay = self.machine.simulator.power_delay()
            self.machine.record("power_pending", reset_type=reset_type, delay=round(delay, 2), via="ipmi")
            self.machine.schedule_power(reset_type, delay)

        return self._run(schedule)

    # ---- boot device -----------------------------------------------------------------

    def get_system_boot_options(self, request: dict[str, Any], session: Any) -> None:
        if request["data"][0] != 5:  # only the boot flags parameter
            session.send_ipmi_response(code=CC_PARAM_NOT_SUPPORTED)
            return
        m = self.machine
        flags, device = 0, 0
        if m.boot_enabled in ("Once", "Continuous") and m.boot_target in TARGET_TO_IPMI:
            flags = BOOT_FLAGS_VALID | (BOOT_FLAGS_PERSISTENT if m.boot_enabled == "Continuous" else 0)
            device = TARGET_TO_IPMI[m.boot_target] << 2
        if m.boot_mode == "UEFI":
            flags |= BOOT_FLAGS_EFI
        session.send_ipmi_response(data=[1, 5, flags, device, 0, 0, 0])

    def set_system_boot_options(self, request: dict[str, Any], session: Any) -> None:
        data = request["data"]
        if data[0] in (0, 3, 4):  # set-in-progress, timer and acknowledge: nothing to keep
            session.send_ipmi_response()
            return
        if data[0] != 5 or len(data) < 3:
            session.send_ipmi_response(code=CC_PARAM_NOT_SUPPORTED)
            return
        flags, selector = data[1], (data[2] >> 2) & 0x0F
        if flags & BOOT_FLAGS_VALID and selector and selector not in IPMI_TO_TARGET:
            session.send_ipmi_response(code=CC_INVALID_DATA)
            return

        def apply() -> None:
            m = self.machine
            if not flags & BOOT_FLAGS_VALID or not selector:
                m.boot_target, m.boot_enabled = "None", "Disabled"
            else:
                m.boot_target = IPMI_TO_TARGET[selector]
                m.boot_enabled = "Continuous" if flags & BOOT_FLAGS_PERSISTENT else "Once"
            if flags & BOOT_FLAGS_VALID:
                m.boot_mode = "UEFI" if flags & BOOT_FLAGS_EFI else "Legacy"
            m.record("boot_override", target=m.boot_target, enabled=m.boot_enabled, mode=m.boot_mode, via="ipmi")

        session.send_ipmi_response(code=self._run(apply))

    # ---- Serial-over-LAN -------------------------------------------------------------

    def activate_payload(self, request: dict[str, Any], session: Any) -> None:
        super().activate_payload(request, session)
        if self.sol is not None and self._unsubscribe is None:
            sol = self.sol
            # Console text is produced on the event loop; pyghmi's sessions belong to the
            # serving thread, which sends what is queued here.
            self._unsubscribe = self.machine.subscribe_console(
                lambda entry: self.outbox.put((sol, console_line(entry)))
            )

    def deactivate_payload(self, request: dict[str, Any], session: Any) -> None:
        self._stop_streaming()
        super().deactivate_payload(request, session)

    def iohandler(self, data: bytes) -> None:
        """Keys typed on the SOL console: the simulated firmware reads none, but
        counting them shows the channel works both ways (and when the client is ready)."""
        self.keys_received += len(data)

    def _stop_streaming(self) -> None:
        unsubscribe, self._unsubscribe = self._unsubscribe, None
        if unsubscribe is not None:
            unsubscribe()

    # ---- plumbing --------------------------------------------------------------------

    def _run(self, change: Callable[[], None]) -> int:
        """Apply ``change`` on the event loop and wait for it; a completion code."""
        if self.machine.simulator.stopping:
            return CC_BUSY

        async def call() -> None:
            change()

        try:
            asyncio.run_coroutine_threadsafe(call(), self.loop).result(HANDOVER_TIMEOUT)
        except Exception:
            LOG.exception("simulator ipmi machine=%s: change failed", self.machine.name)
            return CC_BUSY
        return 0

    def leave_io_thread(self) -> None:
        """Stop being served: out of pyghmi's handlers and its I/O thread's socket list."""
        self._stop_streaming()
        pyghmi_session.Session.bmc_handlers.pop(self.serversocket, None)
        pyghmi_session.iosockets[:] = [s for s in pyghmi_session.iosockets if s is not self.serversocket]

    def close(self) -> None:
        # pyghmi's I/O thread selects on its module-wide socket list: leave it, then close safely.
        self.leave_io_thread()
        pyghmi_fixes.retire_socket(self.serversocket)


def _wake_io_thread() -> None:
    """Make pyghmi's I/O thread return from its select (its own wake-up: a datagram to its first socket)."""
    sockets = pyghmi_session.iosockets
    if sockets and pyghmi_session.myself:
        try:
            sockets[0].sendto(b"\x01", (pyghmi_session.myself, sockets[0].getsockname()[1]))
        except OSError:
            LOG.debug("simulator ipmi: could not wake pyghmi's I/O thread")


class IpmiEndpoints:
    """The BMCs of a simulator's machines and the thread that serves them."""

    def __init__(self, machines: list[Machine], *, host: str, username: str, password: str) -> None:
        self.machines = machines
        self.host = host
        self.username = username or DEFAULT_USERNAME
        self.password = password or DEFAULT_PASSWORD
        self.bmcs: dict[str, MachineBmc] = {}
        self._stop = threading.Event()
        self._outbox: queue.SimpleQueue[tuple[Any, str]] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        pyghmi_fixes.apply()  # many BMCs in one process: see pyghmi_fixes.py
        authdata = {self.username: self.password}
        if not pyghmi_session.iosockets:
            # pyghmi wakes its I/O thread through the first socket it made; let that
            # be one of its own, so closing a BMC never closes the wake-up socket.
            pyghmi_session.Session._assignsocket()
        for machine in self.machines:
            self.bmcs[machine.uuid] = MachineBmc(machine, loop, authdata, self.host, self._outbox)
        self._thread = threading.Thread(target=self._serve, name="simulator-ipmi", daemon=True)
        self._thread.start()

    def port(self, machine: Machine) -> int:
        return int(self.bmcs[machine.uuid].port)

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                pyghmi_session.Session.wait_for_rsp(SERVE_POLL)
                self._send_console_text()
            except Exception:
                LOG.exception("simulator ipmi: serving loop error")

    def _send_console_text(self) -> None:
        """Console lines queued by the machines, onto their SOL sessions (closed ones drop them)."""
        while True:
            try:
                sol, text = self._outbox.get_nowait()
            except queue.Empty:
                return
            if sol.activated:
                sol.send_data(text.encode("utf-8", "replace"))

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(SERVE_POLL * 4 + 1)
            self._thread = None
        for bmc in self.bmcs.values():
            bmc.leave_io_thread()
        # A select already running in pyghmi's I/O thread still watches the BMC sockets: closing
        # them under it fails that select (EBADF) when it wakes. Wake it so it selects on the
        # list without them, then close.
        _wake_io_thread()
        time.sleep(SERVE_POLL)
        for bmc in self.bmcs.values():
            bmc.close()
        self.bmcs.clear()
