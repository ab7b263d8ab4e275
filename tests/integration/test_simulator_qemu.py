"""The simulator's QEMU backend behind its Redfish service, without a stack.

Real QEMU processes (TCG): power on starts one, power off stops it (QMP
quit, SIGKILL if needed), a restart is a new process, virtual media is
loaded into the running VM over QMP, the serial console is served as a
Redfish log service, and a VM that cannot start (QEMU missing, the agent's
forwarded port taken) is a Redfish error at once and leaves nothing running.
The firmware only gets as far as "no bootable device" here: the real boots
are in tests/e2e/test_real_vm_deploy.py.
"""

from __future__ import annotations

import asyncio
import os
import socket
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from services.simulator.options import SimulatorOptions
from services.simulator.qemu_machine import QemuMachine
from services.simulator.service import Simulator
from tests.e2e.bootfiles import ensure_packages

pytestmark = pytest.mark.timeout(180)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.fixture(scope="module")
async def media_server(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[str]:
    ensure_packages()
    iso = tmp_path_factory.mktemp("media") / "cd.iso"
    iso.write_bytes(b"\0" * 32768 + b"\x01CD001" + b"\0" * (65536 - 32774))

    async def serve(request: web.Request) -> web.FileResponse:
        return web.FileResponse(iso)

    app = web.Application()
    app.router.add_get("/cd.iso", serve)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"  # type: ignore[union-attr]
    finally:
        await runner.cleanup()


async def start(tmp_path: Path, **options: Any) -> Simulator:
    simulator = Simulator(
        SimulatorOptions(
            machines=1,
            state_dir=str(tmp_path),
            boot_url="http://127.0.0.1:9/boot.ipxe",
            disk_size=16 * 1024 * 1024,
            backend="qemu",
            qemu_memory_mib=128,
            boot_order=("Hdd",),
            **options,
        )
    )
    await simulator.start()
    return simulator


async def redfish(simulator: Simulator, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    async with (
        aiohttp.ClientSession() as session,
        session.request(method, simulator.redfish_url + path, json=body) as response,
    ):
        text = await response.text()
        return response.status, (await response.json() if text else None)


def only_vm(simulator: Simulator) -> QemuMachine:
    """The simulator's one machine, which the QEMU backend makes a VM."""
    machine = simulator.machines[0]
    assert isinstance(machine, QemuMachine)
    return machine


async def reset(simulator: Simulator, kind: str) -> tuple[int, Any]:
    return await redfish(
        simulator, "POST", simulator.machines[0].system_path + "/Actions/ComputerSystem.Reset", {"ResetType": kind}
    )


async def test_power_media_and_console_of_a_qemu_machine(tmp_path: Path, media_server: str) -> None:
    simulator = await start(tmp_path)
    machine = only_vm(simulator)
    try:
        status, body = await reset(simulator, "On")
        assert (status, machine.power_state) == (204, "On"), (body, list(machine.boot_log)[-5:])
        first = machine.process
        assert first is not None and alive(first.pid)
        _, system = await redfish(simulator, "GET", machine.system_path)
        assert system["PowerState"] == "On" and system["Boot"]["BootSourceOverrideMode"] == "Legacy"

        # The serial console, as the BMC serves it: SeaBIOS finds nothing to boot on the empty disk.
        deadline = time.monotonic() + 60
        lines: list[str] = []
        while not any("No bootable device" in line for line in lines):
            assert time.monotonic() < deadline, lines
            await asyncio.sleep(0.5)
            _, entries = await redfish(simulator, "GET", machine.system_path + "/LogServices/Console/Entries")
            lines = [entry["Message"] for entry in entries["Members"]]
        assert any(line.startswith("SeaBIOS") for line in lines)
        assert all("\x1b" not in line for line in lines)

        # Virtual media goes into the running VM's drive over QMP, and out again.
        manager = f"/redfish/v1/Managers/{machine.name}/VirtualMedia/Cd"
        status, _ = await redfish(
            simulator, "POST", manager + "/Actions/VirtualMedia.InsertMedia", {"Image": f"{media_server}/cd.iso"}
        )
        assert status == 204
        assert machine._qmp is not None
        blocks = {b["device"]: b for b in await machine._qmp.execute("query-block")}
        assert blocks["cd0"]["inserted"]["file"] == machine.media_files["Cd"]
        status, _ = await redfish(
            simulator, "POST", manager + "/Actions/VirtualMedia.InsertMedia", {"Image": f"{media_server}/missing"}
        )
        assert status == 409  # the slot is full: nothing changes
        await redfish(simulator, "POST", manager + "/Actions/VirtualMedia.EjectMedia", {})
        blocks = {b["device"]: b for b in await machine._qmp.execute("query-block")}
        assert "inserted" not in blocks["cd0"] and not Path(machine.media_files["Cd"]).exists()
        status, body = await redfish(
            simulator, "POST", manager + "/Actions/VirtualMedia.InsertMedia", {"Image": f"{media_server}/missing"}
        )
        assert status == 400 and "HTTP 404" in body["error"]["message"]
        assert not machine.virtual_media["Cd"].inserted

        # A restart is a new QEMU process (its boot order is fixed at start); off stops it.
        status, _ = await reset(simulator, "ForceRestart")
        assert status == 204 and machine.process is not None and machine.process.pid != first.pid
        assert not alive(first.pid)
        second = machine.process.pid
        status, _ = await reset(simulator, "ForceOff")
        assert status == 204 and machine.power_state == "Off" and machine.process is None
        assert not alive(second)
        events = [e["event"] for e in machine.boot_log]
        assert events.count("vm_started") == 2 and events.count("vm_stopped") == 2
    finally:
        await simulator.stop()


async def test_a_vm_that_cannot_start_is_a_redfish_error(tmp_path: Path) -> None:
    missing = await start(tmp_path / "missing", qemu_binary=str(tmp_path / "no-such-qemu"))
    try:
        started = time.monotonic()
        status, body = await reset(missing, "On")
        assert status == 500 and "no-such-qemu" in body["error"]["message"]
        assert missing.machines[0].power_state == "Off" and time.monotonic() - started < 5
    finally:
        await missing.stop()

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        busy = await start(tmp_path / "busy", agent_port_base=port)
        try:
            machine = only_vm(busy)
            assert f"ipa-advertise-port={port} " in busy.driver_info(machine)["kernel_append_params"]
            status, body = await reset(busy, "On")
            assert status == 500, body
            message = body["error"]["message"]
            assert "did not start" in message and "host forwarding" in message.lower(), message
            assert machine.power_state == "Off" and machine.process is None
            _, system = await redfish(busy, "GET", machine.system_path)
            assert system["PowerState"] == "Off"
            assert machine.events("vm_start_error")
        finally:
            await busy.stop()
