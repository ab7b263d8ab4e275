"""IPMI on the simulator, with Debian's ipmitool as the independent client:
chassis power, boot device (once, persistent, UEFI), Serial-over-LAN, and
what a wrong password or an unknown device changes (nothing)."""

from __future__ import annotations

import asyncio
import json
import shutil
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from services.simulator import Simulator, SimulatorOptions

USER, PASSWORD = "ipmi-admin", "ipmi-secret"

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(shutil.which("ipmitool") is None, reason="ipmitool is not installed (scripts/bootstrap.sh)"),
]


async def wait_for(predicate: Callable[[], Any], timeout: float = 15.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


@pytest.fixture(scope="module")
async def sim(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Simulator]:
    simulator = Simulator(
        SimulatorOptions(
            machines=3,
            state_dir=str(tmp_path_factory.mktemp("sim-ipmi")),
            disk_size=8 * 1024**2,
            username=USER,
            password=PASSWORD,
            ipmi=True,
        )
    )
    await simulator.start()
    try:
        yield simulator
    finally:
        await simulator.stop()


async def ipmitool(sim: Simulator, index: int, *args: str, password: str = PASSWORD) -> tuple[int, str]:
    port = sim.ipmi_driver_info(sim.machines[index])["ipmi_port"]
    proc = await asyncio.create_subprocess_exec(
        "ipmitool", "-I", "lanplus", "-C", "3", "-H", "127.0.0.1", "-p", str(port), "-U", USER, "-P", password,
        "-R", "1", "-N", "1", *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    out, _ = await asyncio.wait_for(proc.communicate(), 30)
    return proc.returncode or 0, out.decode()


async def test_inventory_reports_one_ipmi_port_per_machine(sim: Simulator) -> None:
    inventory = json.loads((Path(sim.options.state_dir) / "machines.json").read_text())
    ports = [m["ipmi_port"] for m in inventory["machines"]]
    assert len(set(ports)) == 3 and all(p > 0 for p in ports)
    info = inventory["machines"][0]["ipmi_driver_info"]
    assert info == {
        "ipmi_address": "127.0.0.1",
        "ipmi_port": ports[0],
        "ipmi_username": USER,
        "ipmi_password": PASSWORD,
    }


async def test_chassis_power_on_and_off(sim: Simulator) -> None:
    machine = sim.machines[0]
    rc, out = await ipmitool(sim, 0, "power", "status")
    assert rc == 0 and "Chassis Power is off" in out
    rc, out = await ipmitool(sim, 0, "power", "on")
    assert rc == 0, out
    await wait_for(lambda: machine.power_state == "On", what="power on")
    rc, out = await ipmitool(sim, 0, "power", "status")
    assert "Chassis Power is on" in out
    assert sim.machines[1].power_state == "Off"  # only the addressed machine
    rc, out = await ipmitool(sim, 0, "power", "off")
    assert rc == 0, out
    await wait_for(lambda: machine.power_state == "Off", what="power off")
    assert [e["reset_type"] for e in machine.events("power_pending")] == ["On", "ForceOff"]


async def test_boot_device_once_persistent_and_uefi(sim: Simulator) -> None:
    machine = sim.machines[1]
    rc, out = await ipmitool(sim, 1, "chassis", "bootdev", "pxe", "options=persistent,efiboot")
    assert rc == 0, out
    assert (machine.boot_target, machine.boot_enabled, machine.boot_mode) == ("Pxe", "Continuous", "UEFI")
    rc, out = await ipmitool(sim, 1, "chassis", "bootparam", "get", "5")
    assert "Force PXE" in out and "Options apply to all future boots" in out and "EFI" in out
    rc, out = await ipmitool(sim, 1, "chassis", "bootdev", "disk")
    assert rc == 0, out
    assert (machine.boot_target, machine.boot_enabled, machine.boot_mode) == ("Hdd", "Once", "Legacy")
    rc, out = await ipmitool(sim, 1, "chassis", "bootparam", "get", "5")
    assert "Force Boot from default Hard-Drive" in out and "Options apply to only next boot" in out


async def test_wrong_password_is_refused_and_changes_nothing(sim: Simulator) -> None:
    machine = sim.machines[2]
    before = machine.summary()
    rc, out = await ipmitool(sim, 2, "power", "on", password="not-the-password")
    assert rc != 0 and "Unable to establish IPMI v2 / RMCP+ session" in out
    await asyncio.sleep(0)  # nothing is pending, so nothing may land later either
    assert machine.summary() == before and not machine.events("power_pending")


async def test_serial_over_lan_streams_the_console(sim: Simulator) -> None:
    machine = sim.machines[2]
    port = sim.ipmi_driver_info(machine)["ipmi_port"]
    # stdbuf: ipmitool buffers its stdout fully when it is not a terminal.
    proc = await asyncio.create_subprocess_exec(
        "stdbuf", "-o0", "ipmitool", "-I", "lanplus", "-C", "3", "-H", "127.0.0.1", "-p", str(port),
        "-U", USER, "-P", PASSWORD, "sol", "activate",
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    assert proc.stdout is not None and proc.stdin is not None
    seen = b""
    try:

        async def read_until(marker: bytes) -> None:
            nonlocal seen
            while marker not in seen:
                chunk = await proc.stdout.read(4096)  # type: ignore[union-attr]
                if not chunk:
                    raise AssertionError(f"SOL ended before {marker!r}; got {seen!r}")
                seen += chunk

        async def expect(marker: bytes) -> None:
            try:
                await asyncio.wait_for(read_until(marker), 15)
            except TimeoutError:
                raise AssertionError(f"no {marker!r} on the SOL console within 15 s; got {seen!r}") from None

        await expect(b"SOL Session operational")
        # A key typed and received: the client is past its set-up and reads what comes.
        bmc = sim.ipmi.bmcs[machine.uuid]  # type: ignore[union-attr]
        proc.stdin.write(b"x")
        await proc.stdin.drain()
        await wait_for(lambda: bmc.keys_received > 0, what="the typed key at the BMC")
        await machine.power_on(reason="test")
        await expect(b"power_on reason=test")
        await expect(b"firmware_start")
    finally:
        proc.stdin.write(b"~.")
        await proc.stdin.drain()
        try:
            await asyncio.wait_for(proc.wait(), 10)
        except TimeoutError:
            proc.kill()
            await proc.wait()
        await machine.power_off(reason="test")
