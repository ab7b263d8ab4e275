"""The embeddable simulator: N machines behind one Redfish service.

``Simulator(options)``; ``await start()`` creates the sparse disk files,
binds the Redfish service and writes ``<state_dir>/machines.json`` (what
to enroll); ``await stop()`` powers every machine off (stopping agents) and
closes everything. Tests and the demo read ``machines`` directly; other
processes read ``GET /simulator/machines``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import shutil
import tempfile
import uuid as uuidlib
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, Self

import aiohttp
from aiohttp import web

from services.common.aiohttp_serving import start_http_site
from services.common.connection_guard import ListenerLimits
from services.common.open_files import raise_open_files_limit
from services.common.ports import unused_tcp_ports
from services.simulator.ipmi import IpmiEndpoints
from services.simulator.machine import Machine, hba_lun_wwn, machine_mac
from services.simulator.options import SimulatorOptions, parse_size
from services.simulator.qemu_command import ISCSI_GUEST_PORT
from services.simulator.redfish import RedfishService

LOG = logging.getLogger(__name__)
STOP_CONCURRENCY = 64
FDS_PER_MACHINE = 6


def _ensure_disk(path: Path, size: int) -> None:
    """A sparse file of ``size`` bytes; an existing disk keeps its contents (grown if smaller)."""
    if not path.exists() or path.stat().st_size < size:
        with open(path, "ab") as fp:
            fp.truncate(size)


class Simulator:
    def __init__(self, options: SimulatorOptions) -> None:
        self.options = options.validate()
        self.disk_size = parse_size(options.disk_size)
        self.machines: list[Machine] = []
        self.service_uuid = str(
            uuidlib.uuid5(uuidlib.NAMESPACE_URL, f"ferrum-simulator:{options.name_prefix}{options.first_index}")
        )
        self._index: dict[str, Machine] = {}
        self._session: aiohttp.ClientSession | None = None
        self._runner: web.AppRunner | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self.redfish: RedfishService | None = None
        self.ipmi: IpmiEndpoints | None = None
        self.stopping = False
        self.port = 0
        self._sockets_dir = ""  # the qemu backend's QMP sockets (a short path: unix sockets allow 107 bytes)

    # ---- lifecycle --------------------------------------------------------------------

    async def start(self) -> None:
        opts = self.options
        disks = Path(opts.state_dir) / "disks"
        await asyncio.to_thread(disks.mkdir, parents=True, exist_ok=True)
        ports = await asyncio.to_thread(self._agent_ports) if opts.backend == "qemu" else []
        iscsi_ports = await asyncio.to_thread(unused_tcp_ports, opts.machines) if opts.backend == "qemu" else []
        if opts.backend == "qemu":
            self._sockets_dir = await asyncio.to_thread(tempfile.mkdtemp, prefix="ferrum-qmp-")
        for offset in range(opts.machines):
            index = opts.first_index + offset
            name = f"{opts.name_prefix}{index:04d}"
            macs = tuple(machine_mac(index, nic) for nic in range(opts.nics_per_machine))
            args = (self, index, name, macs, str(disks / f"{name}.img"), f"FERRUMSIM{index:06d}")
            if opts.backend == "qemu":
                from services.simulator.qemu_machine import QemuMachine

                machine: Machine = QemuMachine(
                    *args,
                    agent_port=ports[offset],
                    iscsi_port=iscsi_ports[offset],
                    qmp_socket=os.path.join(self._sockets_dir, f"{offset}.qmp"),
                )
            else:
                machine = Machine(*args)
                if opts.hba_lun_bytes():
                    machine.lun_path = str(disks / f"{name}-lun0.img")
                    machine.lun_wwn = hba_lun_wwn(index)
            self.machines.append(machine)
            self._index[machine.name] = self._index[machine.uuid] = machine
        await asyncio.to_thread(self._create_disks)
        # A busy machine holds a few descriptors (its agent's listening socket, a download,
        # its disk file, the conductor's connections); 1,000 of them outgrow the usual 1,024.
        raise_open_files_limit(opts.machines * FDS_PER_MACHINE + 1024)
        # No connection cap: each real machine has its own NIC, and a shared cap
        # would queue agents' heartbeats behind other machines' image downloads.
        self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
        self.redfish = RedfishService(self)
        try:
            self._runner, self.port = await start_http_site(
                self.redfish.build_app(),
                opts.host,
                opts.port,
                listener="simulator",
                limits=ListenerLimits(max_connections=opts.max_connections, header_timeout=opts.header_timeout),
            )
        except BaseException:
            await self._session.close()
            self._session = None
            raise
        if opts.ipmi:
            self.ipmi = IpmiEndpoints(self.machines, host=opts.host, username=opts.username, password=opts.password)
            self.ipmi.start(asyncio.get_running_loop())
        await asyncio.to_thread(self._write_inventory)
        LOG.info(
            "simulator started machines=%d redfish_url=%s state_dir=%s boot_url=%s",
            len(self.machines),
            self.redfish_url,
            opts.state_dir,
            opts.boot_url or "-",
        )

    async def stop(self) -> None:
        # Pending power requests and agent hooks first, so nothing powers back on behind us.
        self.stopping = True
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        gate = asyncio.Semaphore(STOP_CONCURRENCY)

        async def off(machine: Machine) -> None:
            async with gate:
                await machine.power_off(reason="simulator stopping")

        await asyncio.gather(
            *(off(m) for m in self.machines if m.power_state == "On" or m.agent is not None), return_exceptions=True
        )
        if self.ipmi is not None:
            await asyncio.to_thread(self.ipmi.stop)
            self.ipmi = None
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self._session is not None:
            await self._session.close()
            self._session = None
        if self._sockets_dir:
            await asyncio.to_thread(shutil.rmtree, self._sockets_dir, True)
            self._sockets_dir = ""

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # ---- helpers --------------------------------------------------------------------

    def _agent_ports(self) -> list[int]:
        """Host ports forwarded to each VM's agent: ``agent_port_base + i``, or free ones now.

        Free ports are picked below the kernel's ephemeral range (services.common.ports);
        another server may still take one before the VM starts, and then that VM fails
        to start with QEMU's message (a Redfish error), never silently."""
        count = self.options.machines
        if self.options.agent_port_base:
            return [self.options.agent_port_base + i for i in range(count)]
        return unused_tcp_ports(count)

    def _create_disks(self) -> None:
        for machine in self.machines:
            _ensure_disk(Path(machine.disk_path), self.disk_size)
            if machine.lun_path:
                _ensure_disk(Path(machine.lun_path), self.options.hba_lun_bytes())

    def hba_volume(self, machine: Machine) -> dict[str, Any]:
        """Volume target properties for the machine's HBA LUN (boot from volume, scenarios 3 and 4)."""
        if not machine.lun_path:
            raise RuntimeError("the simulator runs without HBA LUNs (SimulatorOptions.hba_lun_size)")
        return {"target_wwn": machine.lun_wwn.removeprefix("0x"), "target_lun": 0}

    def _write_inventory(self) -> None:
        path = Path(self.options.state_dir) / "machines.json"
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(
            json.dumps(
                {
                    "redfish_url": self.options.public_url.rstrip("/") or self.redfish_url,
                    "machines": [
                        {**m.summary(), "driver_info": self.driver_info(m), **self._ipmi_inventory(m)}
                        for m in self.machines
                    ],
                },
                indent=1,
            )
        )
        os.replace(tmp, path)

    @property
    def redfish_url(self) -> str:
        host = self.options.host
        if ":" in host:
            host = f"[{host}]"
        return f"http://{host}:{self.port}"

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            raise RuntimeError("simulator not started")
        return self._session

    def find(self, ident: str) -> Machine | None:
        """A machine by UUID or name."""
        return self._index.get(ident) or self._index.get(ident.lower())

    def driver_info(self, machine: Machine) -> dict[str, Any]:
        """What to put in a node's driver_info to drive this machine with ``redfish``."""
        info: dict[str, Any] = {
            "redfish_address": self.options.public_url.rstrip("/") or self.redfish_url,
            "redfish_system_id": machine.system_path,
            "redfish_verify_ca": False,
        }
        if self.options.username:
            info.update(redfish_username=self.options.username, redfish_password=self.options.password)
        port = getattr(machine, "agent_port", 0)
        if port:
            # The guest is behind user-mode NAT: its agent must advertise the host's forwarded
            # ports, for its command API and for the iSCSI deploy's target.
            info["kernel_append_params"] = f"%default% ipa-advertise-host=127.0.0.1 ipa-advertise-port={port}"
            iscsi = getattr(machine, "iscsi_port", 0)
            if iscsi:
                info["kernel_append_params"] += (
                    f" ipa-iscsi-portal-port={ISCSI_GUEST_PORT} ipa-iscsi-advertise-port={iscsi}"
                )
        return info

    def ipmi_driver_info(self, machine: Machine) -> dict[str, Any]:
        """What to put in a node's driver_info to drive this machine with ``ipmi``."""
        if self.ipmi is None:
            raise RuntimeError("the simulator runs without IPMI (SimulatorOptions.ipmi / --ipmi)")
        return {
            "ipmi_address": self.options.host,
            "ipmi_port": self.ipmi.port(machine),
            "ipmi_username": self.ipmi.username,
            "ipmi_password": self.ipmi.password,
        }

    def ipmi_summary(self, machine: Machine) -> dict[str, Any]:
        """The machine's IPMI port for the inventory (nothing when IPMI is off)."""
        if self.ipmi is None:
            return {}
        return {"ipmi_port": self.ipmi.port(machine)}

    def _ipmi_inventory(self, machine: Machine) -> dict[str, Any]:
        if self.ipmi is None:
            return {}
        return {**self.ipmi_summary(machine), "ipmi_driver_info": self.ipmi_driver_info(machine)}

    def power_delay(self) -> float:
        """How long this power request takes to land (``power_delay`` min,max seconds)."""
        low, high = self.options.power_delay
        return low if low >= high else random.uniform(low, high)

    def spawn(self, coro: Coroutine[Any, Any, Any], *, delay: float = 0.0) -> asyncio.Task[None]:
        """Run ``coro`` in the background, tracked so ``stop()`` can cancel it."""

        async def run() -> None:
            try:
                if delay:
                    await asyncio.sleep(delay)
            except asyncio.CancelledError:
                coro.close()
                raise
            await coro

        task = asyncio.create_task(run())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task
