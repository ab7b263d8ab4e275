"""Serial console interfaces: ``ipmitool-socat`` and ``simulator`` (docs/console.md).

Both hand the conductor's console proxy (services/conductor/console_proxy.py)
a source for the node's console; the proxy listens, bounds and relays, and
``get_console`` answers Ironic's socat-style ``console_info``.

- ``ipmitool-socat``: IPMI Serial-over-LAN through Debian's ``ipmitool -I
  lanplus ... sol activate``, a child that dies with the conductor (``setpriv
  --pdeathsig KILL``), the password in its environment (``-E``), never on
  its command line. It reads Ironic's ``ipmi_*`` driver_info through the
  ipmitool interfaces' parser (ipmi_info.py), allowing ipmitool's cipher
  suites 0-17 (default 3); ``ipmi_terminal_port`` is the proxy's TCP port.
- ``simulator``: the console of a machine behind a Redfish BMC that keeps its
  console as a ``Console`` LogService with growing entry Ids, as Ferrum's
  simulator does (the same log the redfish management interface reads for
  call-back timeouts). It polls the entries every ``console_poll_interval``
  and sends the new lines; it is read-only (typed keys go nowhere) and reads
  the node's ``redfish_*`` driver_info.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import shutil
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from sushy import exceptions as sushy_exc

from services.common import errors
from services.common.child_process import dies_with_parent
from services.conductor.console_proxy import ConsoleProxies, ConsoleSession
from services.conductor.drivers import base
from services.conductor.drivers.ipmi_info import DRIVER_INFO_PROPERTIES as IPMI_DRIVER_INFO_PROPERTIES
from services.conductor.drivers.ipmi_info import IPMITOOL_CIPHER_SUITES, IpmiInfo
from services.conductor.drivers.ipmi_info import parse_driver_info as parse_ipmi_driver_info
from services.conductor.drivers.redfish_client import (
    DRIVER_INFO_PROPERTIES,
    ConnectionCache,
    RedfishInfo,
    bmc_errors,
    parse_driver_info,
)

LOG = logging.getLogger(__name__)

CONSOLE_LOG_SERVICES = ("Console", "SerialConsole")  # LogService ids holding console lines
QUIT_GRACE = 2.0  # how long ipmitool gets to leave SOL politely before it is killed


class _ProxiedConsole(base.ConsoleInterface):
    """start/stop/get through the conductor's console proxies; subclasses give the source."""

    def _proxies(self, task: base.Task) -> ConsoleProxies:
        if task.consoles is None:
            raise errors.FerrumError("this process runs no console proxies")
        return task.consoles

    def source(self, task: base.Task) -> tuple[Any, str, int | None]:
        """(the source coroutine function, a description for logs, the TCP port wanted or None)."""
        raise NotImplementedError

    async def start_console(self, task: base.Task) -> None:
        await self.validate(task)
        source, description, port = self.source(task)
        await self._proxies(task).start(task.node["uuid"], source, description=description, port=port)

    async def stop_console(self, task: base.Task) -> None:
        await self._proxies(task).stop(task.node["uuid"])

    async def get_console(self, task: base.Task) -> dict[str, Any]:
        return self._proxies(task).info(task.node["uuid"])


# ---- ipmitool-socat ---------------------------------------------------------------------

IPMI_PROPERTIES = {
    **IPMI_DRIVER_INFO_PROPERTIES,
    "ipmi_password": "Password for the BMC (masked on reads; passed to ipmitool in its environment). Optional.",
    "ipmi_cipher_suite": "IPMI 2.0 cipher suite for lanplus (0-17). Default 3.",
    "ipmi_terminal_port": "TCP port the conductor's console proxy listens on for this node. Optional: "
    "without it a port from the conductor's console_port_range (or an ephemeral one) is used.",
}


def parse_ipmi_info(node: Mapping[str, Any]) -> IpmiInfo:
    """The node's IPMI driver_info as the SOL console needs it: the ipmitool interfaces'
    parser (ipmi_info.py) with ipmitool's cipher suites; no network traffic."""
    return parse_ipmi_driver_info(node, cipher_suites=IPMITOOL_CIPHER_SUITES)


class SolProcess:
    """One node's ``ipmitool sol activate`` as a console source; started again by the proxy when it ends."""

    def __init__(self, info: IpmiInfo, ipmitool: str) -> None:
        self.info = info
        self.ipmitool = ipmitool
        self.runs = 0

    def argv(self, *command: str) -> list[str]:
        i = self.info
        argv = [self.ipmitool, "-I", "lanplus", "-C", str(i.cipher_suite), "-H", i.address, "-p", str(i.port)]
        argv += ["-L", i.priv_level]
        if i.username:
            argv += ["-U", i.username]
        if i.password:
            argv.append("-E")  # IPMI_PASSWORD from the environment: never on the command line
        return [*argv, *command]

    def env(self) -> dict[str, str]:
        env = {"PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"), "LANG": "C"}
        if self.info.password:
            env["IPMI_PASSWORD"] = self.info.password
        return env

    async def _deactivate(self) -> None:
        """A SOL session left active (by a killed client) makes the next activation fail: end it."""
        proc = await asyncio.create_subprocess_exec(
            *dies_with_parent(),
            *self.argv("sol", "deactivate"),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
            env=self.env(),
        )
        try:
            await asyncio.wait_for(proc.wait(), 15)
        except TimeoutError:
            proc.kill()
            await proc.wait()

    async def __call__(self, session: ConsoleSession) -> None:
        self.runs += 1
        if self.runs > 1:
            await self._deactivate()
        # ipmitool buffers its output fully when it is not on a terminal; stdbuf unbuffers it.
        stdbuf = shutil.which("stdbuf")
        unbuffered = [stdbuf, "-o0"] if stdbuf else []
        proc = await asyncio.create_subprocess_exec(
            *dies_with_parent(),
            *unbuffered,
            *self.argv("sol", "activate"),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,  # its errors are what a console user needs to see
            env=self.env(),
        )
        assert proc.stdin is not None and proc.stdout is not None
        stdin = proc.stdin

        async def feed() -> None:
            while True:
                stdin.write(await session.keys.get())
                await stdin.drain()

        feeder = asyncio.create_task(feed())
        try:
            while chunk := await proc.stdout.read(4096):
                session.publish(chunk)
            code = await proc.wait()
            raise errors.BMCError(f"ipmitool sol activate to {self.info.address}:{self.info.port} exited with {code}")
        finally:
            feeder.cancel()
            await _quit(proc)


async def _quit(proc: asyncio.subprocess.Process) -> None:
    """Leave SOL with ipmitool's escape (so the BMC frees the session), then kill what stays."""
    if proc.returncode is None:
        try:
            assert proc.stdin is not None
            proc.stdin.write(b"\r~.")
            await asyncio.wait_for(proc.wait(), QUIT_GRACE)
        except (TimeoutError, ConnectionError, AssertionError):
            pass
    if proc.returncode is None:
        proc.kill()
        await proc.wait()


class IpmitoolSocatConsole(_ProxiedConsole):
    """Ironic's ``ipmitool-socat``: the BMC's Serial-over-LAN as a raw TCP console (and a WebSocket)."""

    name = "ipmitool-socat"

    def get_properties(self) -> dict[str, str]:
        return dict(IPMI_PROPERTIES)

    async def validate(self, task: base.Task) -> None:
        parse_ipmi_info(task.node)
        if shutil.which("ipmitool") is None:
            raise errors.InvalidParameterValue(
                "The ipmitool-socat console needs ipmitool on the conductor (Debian package ipmitool)"
            )

    def source(self, task: base.Task) -> tuple[Any, str, int | None]:
        info = parse_ipmi_info(task.node)
        ipmitool = shutil.which("ipmitool") or "ipmitool"
        return SolProcess(info, ipmitool), f"ipmitool sol {info.address}:{info.port}", info.terminal_port


# ---- simulator (a BMC's Console LogService, polled) ----------------------------------------


def new_entries(entries: list[tuple[str, str]], last: str | None) -> list[tuple[str, str]]:
    """The entries after the one with Id ``last`` (all of them when ``last`` is None or gone: the
    log restarted). Numeric Ids are compared as numbers; others by position."""
    if last is None:
        return entries
    if last.isdigit() and all(entry_id.isdigit() for entry_id, _ in entries):
        newer = [e for e in entries if int(e[0]) > int(last)]
        if entries and not newer and int(entries[-1][0]) < int(last):
            return entries  # Ids went backwards: a new log
        return newer
    ids = [entry_id for entry_id, _ in entries]
    return entries[ids.index(last) + 1 :] if last in ids else entries


class ConsoleLog:
    """A Redfish Console LogService polled as a console source (read-only)."""

    def __init__(self, info: RedfishInfo, cache: ConnectionCache, executor: ThreadPoolExecutor, interval: float):
        self.info = info
        self.cache = cache
        self.executor = executor
        self.interval = interval
        self.entries_path: str | None = None
        self.last: str | None = None

    def _entries_path(self, root: Any) -> str:
        system = root.get_system(self.info.system_id)
        services = ((system.json or {}).get("LogServices") or {}).get("@odata.id")
        members = (root._conn.get(services).json().get("Members") or []) if services else []
        for member in members:
            path = str(member.get("@odata.id", "")).rstrip("/")
            if path.rsplit("/", 1)[-1] in CONSOLE_LOG_SERVICES:
                entries = (root._conn.get(path).json().get("Entries") or {}).get("@odata.id")
                if entries:
                    return str(entries)
        raise errors.BMCError(
            f"The Redfish BMC at {self.info.address} has no Console log service for the system: the simulator "
            "console needs Ferrum's simulator (or a BMC that keeps its console as a LogService named Console)"
        )

    def _read(self) -> list[tuple[str, str]]:
        """New console lines as (Id, text). Blocking: runs in the interface's threads."""
        with bmc_errors(self.info, "read the console log"):
            try:
                root = self.cache.root(self.info)
                if self.entries_path is None:
                    self.entries_path = self._entries_path(root)
                members = root._conn.get(self.entries_path).json().get("Members") or []
                entries = [(str(m.get("Id", "")), m) for m in members if isinstance(m, dict)]
                fresh = new_entries([(i, "") for i, _ in entries], self.last)
                wanted = {i for i, _ in fresh}
                lines = []
                for entry_id, member in entries:
                    if entry_id not in wanted:
                        continue
                    if "Message" not in member and member.get("@odata.id"):
                        member = root._conn.get(member["@odata.id"]).json()  # a BMC that does not expand
                    lines.append((entry_id, str(member.get("Message") or "")))
                return lines
            except (sushy_exc.ConnectionError, sushy_exc.AccessError):
                self.cache.forget(self.info)
                self.entries_path = None
                raise

    async def __call__(self, session: ConsoleSession) -> None:
        loop = asyncio.get_running_loop()
        while True:
            lines = await loop.run_in_executor(self.executor, self._read)
            for entry_id, text in lines:
                session.publish(f"{text}\r\n".encode("utf-8", "replace"))
                self.last = entry_id
            await asyncio.sleep(self.interval)


class SimulatorConsole(_ProxiedConsole):
    """The serial console of a machine on Ferrum's simulator (its BMC's Console LogService)."""

    name = "simulator"

    def __init__(self, options: Mapping[str, Any] | None = None) -> None:
        super().__init__(options)
        self.interval = float(self.options.get("console_poll_interval") or 1.0)
        self.cache = ConnectionCache(request_timeout=float(self.options.get("redfish_request_timeout") or 30.0))
        self._executor = ThreadPoolExecutor(max_workers=4, thread_name_prefix="console-redfish")

    def get_properties(self) -> dict[str, str]:
        return dict(DRIVER_INFO_PROPERTIES)

    def _info(self, task: base.Task) -> RedfishInfo:
        try:
            return parse_driver_info(task.node)
        except errors.FerrumError as exc:
            raise type(exc)(
                f"{exc.message} (the simulator console reads the machine's console from its Redfish BMC's "
                "Console log service, so it needs the node's redfish_* driver_info)"
            ) from None

    async def validate(self, task: base.Task) -> None:
        self._info(task)

    def source(self, task: base.Task) -> tuple[Any, str, int | None]:
        info = self._info(task)
        log = ConsoleLog(info, self.cache, self._executor, self.interval)
        return log, f"redfish console log {info.address}{info.system_id or ''}", None

    async def close(self) -> None:
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, functools.partial(self.cache.close))
        self._executor.shutdown(wait=False, cancel_futures=True)
