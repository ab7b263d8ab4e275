"""A simulated machine that is a real QEMU VM (``ferrum simulator --backend qemu``).

The BMC (the same Redfish service) drives a QEMU process instead of the
Python firmware: power on starts it with the boot devices of this power-on
(``-boot once=..,order=..``), power off asks QEMU to quit over QMP and
kills the process by PID if it does not within ``qemu_stop_timeout``, and a
reset does both (QEMU cannot change its boot order while running).
A guest that powers itself off (``poweroff -f`` in the ramdisk) ends the
process, and the machine then reads ``Off``, as a real one would.
Virtual media are downloaded by the BMC (from 127.0.0.1 when the URL names
the host as the guests see it, 10.0.2.2) and loaded into the VM's CD or
floppy drive over QMP; the serial port goes to ``<state>/serial/<name>.log``,
which the BMC's console log service serves.

A VM that cannot start (QEMU missing, the agent's forwarded port taken)
raises MachineStartError with QEMU's own words, within a bounded time.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from pathlib import Path
from typing import TYPE_CHECKING, Any

import aiohttp

from services.simulator import console, vmedia
from services.simulator.machine import Machine, MachineStartError
from services.simulator.qemu_command import VmSpec, guest_url, qemu_argv
from services.simulator.qmp import QmpClient, QmpError

if TYPE_CHECKING:
    from services.simulator.service import Simulator

LOG = logging.getLogger(__name__)
MEDIA_LIMITS = {"Cd": vmedia.MAX_MEDIA_BYTES, "Floppy": 64 * 1024**2}
MEDIA_DRIVES = {"Cd": "cdrom0", "Floppy": "floppy0"}
STDERR_LIMIT = 4000
GRAPHICAL_SESSIONS = 4  # VNC clients QEMU serves at once, as far as the BMC advertises


# What QEMU's user-mode network shows its guests as the host (slirp's gateway alias).
GUEST_VIEW_OF_HOST = "10.0.2.2"


def host_url(url: str) -> str:
    """The BMC of a QEMU machine lives on the host next to its VM: a media URL
    that names the host as the guests see it (``http://10.0.2.2:PORT/...``, so
    that the same object store serves the VM's own downloads) is fetched from
    127.0.0.1, where slirp sends the guest's connections anyway."""
    prefix, sep, rest = url.partition("://")
    if sep and (rest == GUEST_VIEW_OF_HOST or rest.startswith((f"{GUEST_VIEW_OF_HOST}:", f"{GUEST_VIEW_OF_HOST}/"))):
        return f"{prefix}://127.0.0.1{rest[len(GUEST_VIEW_OF_HOST) :]}"
    return url


class QemuMachine(Machine):
    def __init__(
        self, simulator: Simulator, *args: Any, agent_port: int, qmp_socket: str, iscsi_port: int = 0, **kwargs: Any
    ) -> None:
        super().__init__(simulator, *args, **kwargs)
        self.agent_port = agent_port
        self.iscsi_port = iscsi_port
        self.qmp_socket = qmp_socket
        self.boot_mode = "Legacy"  # SeaBIOS
        state = Path(simulator.options.state_dir)
        self.serial_log = str(state / "serial" / f"{self.name}.log")
        self.qemu_log = str(state / "serial" / f"{self.name}.qemu-stderr.log")  # QEMU's own complaints
        self.media_files = {dev: str(state / "media" / f"{self.name}-{dev.lower()}.img") for dev in MEDIA_DRIVES}
        self.process: asyncio.subprocess.Process | None = None
        self._qmp: QmpClient | None = None
        self._watcher: asyncio.Task[None] | None = None
        self.vnc_port: int | None = None  # QEMU's VNC server while the VM runs

    # ---- power ------------------------------------------------------------------------

    def _spec(self) -> VmSpec:
        opts = self.simulator.options
        media = {
            dev: path
            for dev, path in self.media_files.items()
            if self.virtual_media[dev].inserted and os.path.exists(path)
        }
        return VmSpec(
            name=self.name,
            uuid=self.uuid,
            macs=self.macs,
            disk_path=self.disk_path,
            disk_serial=self.disk_serial,
            serial_log=self.serial_log,
            qmp_socket=self.qmp_socket,
            agent_port=self.agent_port,
            iscsi_port=self.iscsi_port,
            boot_url=guest_url(opts.boot_url) if opts.boot_url else "",
            first_boot=tuple(self.boot_sequence()),
            later_boots=tuple(opts.boot_order),
            memory_mib=opts.qemu_memory_mib,
            cd_image=media.get("Cd", ""),
            floppy_image=media.get("Floppy", ""),
            binary=opts.qemu_binary,
        )

    async def _start_boot(self, reason: str) -> None:
        spec = self._spec()
        argv = qemu_argv(spec)
        await asyncio.to_thread(Path(self.serial_log).parent.mkdir, parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.qmp_socket)
        self.boot_count += 1
        self.status = "booting"
        self.record("power_on", reason=reason, boot=",".join(spec.first_boot), agent_port=self.agent_port)
        try:
            stderr = await asyncio.to_thread(open, self.qemu_log, "wb")
            try:
                process = await asyncio.create_subprocess_exec(
                    *argv,
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=asyncio.subprocess.DEVNULL,
                    stderr=stderr,
                    start_new_session=True,  # a Ctrl-C meant for the simulator must not kill the VM first
                )
            finally:
                stderr.close()
        except OSError as exc:
            self.status = "off"
            self.record("vm_start_error", error=f"{argv[0]}: {exc.strerror or exc}")
            raise MachineStartError(f"cannot start {self.name}'s VM: {argv[0]}: {exc.strerror or exc}") from None
        try:
            self._qmp = await self._connect(process)
        except MachineStartError as exc:
            self.status = "off"
            self.record("vm_start_error", error=str(exc))
            raise
        self.process = process
        self.vnc_port = await self._vnc_port()
        self.status = "running"
        self._watcher = asyncio.create_task(self._watch(process), name=f"qemu-{self.name}")
        self.record("vm_started", pid=process.pid)

    async def _vnc_port(self) -> int | None:
        """The TCP port QEMU's VNC server took (it picks the first free display)."""
        if self._qmp is None:
            return None
        try:
            found = await self._qmp.execute("query-vnc")
        except (QmpError, OSError, ConnectionError) as exc:
            self.record("vnc_unknown", error=str(exc))
            return None
        if not isinstance(found, dict) or not found.get("enabled") or not str(found.get("service", "")).isdigit():
            return None
        return int(found["service"])

    def graphical_console(self) -> dict[str, Any] | None:
        """Redfish's GraphicalConsole: QEMU's VNC server while the VM runs (the screen a
        KVM-over-IP console shows); a BMC with the host off offers none."""
        console: dict[str, Any] = {
            "ServiceEnabled": self.vnc_port is not None,
            "MaxConcurrentSessions": GRAPHICAL_SESSIONS,
            "ConnectTypesSupported": ["KVMIP"],
        }
        if self.vnc_port is not None:
            console["Port"] = self.vnc_port
        return console

    async def _connect(self, process: asyncio.subprocess.Process) -> QmpClient:
        """QMP once QEMU is up; QEMU exiting first (a bad option, a port in use) is a start error."""
        timeout = self.simulator.options.qemu_start_timeout
        connecting = asyncio.ensure_future(QmpClient.connect(self.qmp_socket, timeout=timeout))
        exiting = asyncio.ensure_future(process.wait())
        done, _ = await asyncio.wait({connecting, exiting}, return_when=asyncio.FIRST_COMPLETED)
        if connecting in done and connecting.exception() is None:
            exiting.cancel()
            return connecting.result()
        connecting.cancel()
        await asyncio.gather(connecting, return_exceptions=True)
        if exiting not in done:
            exiting.cancel()
            await self._kill(process)
        reason = await asyncio.to_thread(self._stderr)
        raise MachineStartError(
            f"{self.name}'s VM did not start (qemu exit status {process.returncode}): {reason or 'no monitor socket'}"
        )

    def _stderr(self) -> str:
        """What QEMU wrote to stderr during this power-on (the end of it), as one line."""
        try:
            with open(self.qemu_log, "rb") as log:
                log.seek(max(0, log.seek(0, os.SEEK_END) - STDERR_LIMIT))
                data = log.read()
        except OSError:
            return ""
        return " ".join(data.decode("utf-8", "replace").split())

    async def _watch(self, process: asyncio.subprocess.Process) -> None:
        """The guest ended its VM itself (poweroff inside it, or a crash): the machine is off."""
        code = await process.wait()
        if self.process is not process:
            return  # stopped by the BMC, which recorded it
        self.process = None
        self.vnc_port = None
        await self._close_qmp()
        self.power_state, self.status = "Off", "off"
        self.record("vm_exited", exit_status=code, error=await asyncio.to_thread(self._stderr) if code else "")

    async def _halt(self) -> None:
        process, self.process = self.process, None
        self.vnc_port = None
        watcher, self._watcher = self._watcher, None
        if watcher is not None and watcher is not asyncio.current_task():
            watcher.cancel()
            await asyncio.gather(watcher, return_exceptions=True)
        if process is None or process.returncode is not None:
            await self._close_qmp()
            return
        if self._qmp is not None:
            with contextlib.suppress(QmpError, OSError, ConnectionError):
                await self._qmp.execute("quit")
        await self._close_qmp()
        try:
            await asyncio.wait_for(process.wait(), self.simulator.options.qemu_stop_timeout)
        except TimeoutError:
            await self._kill(process)
        self.record("vm_stopped", exit_status=process.returncode)

    @staticmethod
    async def _kill(process: asyncio.subprocess.Process) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(process.pid, signal.SIGKILL)
        await process.wait()

    async def _close_qmp(self) -> None:
        qmp, self._qmp = self._qmp, None
        if qmp is not None:
            await qmp.close()

    # ---- virtual media ------------------------------------------------------------------

    def media_source(self, url: str) -> str:
        return host_url(url)

    async def attach_media(self, device: str) -> None:
        """Download the medium now (a BMC caches it) and, when the VM runs, load it into the drive."""
        slot = self.virtual_media[device]
        path = Path(self.media_files[device])
        await asyncio.to_thread(path.parent.mkdir, parents=True, exist_ok=True)
        sim = self.simulator
        source = self.media_source(slot.image or "")
        try:
            size = await vmedia.download(
                sim.session,
                source,
                path,
                timeout=sim.options.http_timeout,
                limit=MEDIA_LIMITS[device],
            )
        except (TimeoutError, aiohttp.ClientError, RuntimeError, OSError, ValueError) as exc:
            await asyncio.to_thread(path.unlink, missing_ok=True)
            raise MachineStartError(f"cannot fetch {source}: {str(exc) or type(exc).__name__}") from None
        self.record("media_downloaded", device=device, size=size)
        if self._qmp is not None:
            try:
                await self._qmp.execute(
                    "blockdev-change-medium",
                    {"id": MEDIA_DRIVES[device], "filename": str(path), "format": "raw", "read-only-mode": "read-only"},
                )
            except QmpError as exc:
                raise MachineStartError(f"QEMU refused the medium: {exc}") from None

    async def detach_media(self, device: str) -> None:
        if self._qmp is not None:
            with contextlib.suppress(QmpError):
                await self._qmp.execute("eject", {"id": MEDIA_DRIVES[device], "force": True})
        await asyncio.to_thread(Path(self.media_files[device]).unlink, missing_ok=True)

    # ---- console ------------------------------------------------------------------------

    def console_lines(self, count: int) -> list[str]:
        return console.tail_lines(self.serial_log, count)

    def console_entries(self, count: int) -> list[tuple[int, str]]:
        return console.tail_entries(self.serial_log, count)

    def summary(self) -> dict[str, Any]:
        return {
            **super().summary(),
            "backend": "qemu",
            "agent_port": self.agent_port,
            "serial_log": self.serial_log,
            "pid": self.process.pid if self.process is not None else None,
            "vnc_port": self.vnc_port,
        }
