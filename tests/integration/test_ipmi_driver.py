"""The ``ipmitool`` power and management interfaces against the simulator's
IPMI BMCs (pyghmi's BMC server, one UDP port per machine), with Debian's
ipmitool as the independent client: power on/off/soft/reboot, boot device
once and persistent in either boot mode, session reuse, and the clear,
bounded errors of a wrong password, a wrong cipher suite, an unknown user
and a BMC that never answers."""

from __future__ import annotations

import asyncio
import shutil
import socket
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import pyghmi.ipmi.private.serversession as serversession
import pytest

from services.common import errors
from services.conductor.drivers import base, ipmi_client
from services.conductor.drivers.ipmi import IpmiManagement, IpmiPower
from services.simulator import Simulator, SimulatorOptions

USER, PASSWORD = "ipmi-admin", "ipmi-secret"
TIMEOUT = 2.0  # ipmi_timeout here: every failure must come within it (plus scheduling slack)
SLACK = 0.7

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(shutil.which("ipmitool") is None, reason="ipmitool is not installed (scripts/bootstrap.sh)"),
]


@pytest.fixture(scope="module")
async def sim(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Simulator]:
    simulator = Simulator(
        SimulatorOptions(
            machines=4,
            state_dir=str(tmp_path_factory.mktemp("sim-ipmi-driver")),
            disk_size=8 * 1024**2,
            username=USER,
            password=PASSWORD,
            ipmi=True,
            power_delay=(0.05, 0.2),  # a BMC applies power changes a little later, as real ones do
        )
    )
    await simulator.start()
    try:
        yield simulator
    finally:
        await simulator.stop()


@pytest.fixture(scope="module")
async def ifaces() -> AsyncIterator[tuple[IpmiPower, IpmiManagement]]:
    options = {"ipmi_poll_interval": 0.05, "ipmi_power_timeout": 10, "ipmi_timeout": TIMEOUT, "ipmi_retries": 3}
    power, management = IpmiPower(options), IpmiManagement(options)
    try:
        yield power, management
    finally:
        await power.close()
        await management.close()


def task_for(sim: Simulator, index: int, **info: Any) -> base.Task:
    machine = sim.machines[index]
    node = {
        "uuid": machine.uuid,
        "driver": "ipmi",
        "driver_info": {**sim.ipmi_driver_info(machine), **info},
        "boot_mode": info.pop("boot_mode", None),
    }
    return base.Task(node=node, ports=[], driver=None, conductor="test")  # type: ignore[arg-type]


async def ipmitool(sim: Simulator, index: int, *args: str) -> str:
    port = sim.ipmi_driver_info(sim.machines[index])["ipmi_port"]
    proc = await asyncio.create_subprocess_exec(
        "ipmitool", "-I", "lanplus", "-C", "3", "-H", "127.0.0.1", "-p", str(port), "-U", USER, "-P", PASSWORD,
        "-R", "1", "-N", "1", *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    out, _ = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 0, out.decode()
    return out.decode()


async def wait_for(predicate: Callable[[], Any], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.02)


async def test_power_on_off_soft_and_reboot(sim: Simulator, ifaces: tuple[IpmiPower, IpmiManagement]) -> None:
    power, _ = ifaces
    machine, task = sim.machines[0], task_for(sim, 0)
    assert await power.get_power_state(task) == "power off"
    assert "Chassis Power is off" in await ipmitool(sim, 0, "power", "status")

    await power.set_power_state(task, "power on")  # returns once the BMC reports it, not when asked
    assert machine.power_state == "On"
    assert "Chassis Power is on" in await ipmitool(sim, 0, "power", "status")
    await power.set_power_state(task, "power on")  # already on: nothing sent
    boots = machine.boot_count

    await power.reboot(task)  # off, confirmed, then on: a new boot
    assert machine.power_state == "On" and machine.boot_count == boots + 1

    await power.set_power_state(task, "soft rebooting")  # ACPI shutdown, confirmed, then on
    assert machine.power_state == "On" and machine.boot_count == boots + 2

    await power.set_power_state(task, "soft power off")
    assert machine.power_state == "Off"
    assert "Chassis Power is off" in await ipmitool(sim, 0, "power", "status")
    await power.set_power_state(task, "power on")
    await power.set_power_state(task, "power off")
    assert machine.power_state == "Off"
    sent = [(e["reset_type"], e["via"]) for e in machine.events("power_pending")]
    assert sent == [
        ("On", "ipmi"),
        ("ForceOff", "ipmi"),  # reboot
        ("On", "ipmi"),
        ("GracefulShutdown", "ipmi"),  # soft reboot
        ("On", "ipmi"),
        ("GracefulShutdown", "ipmi"),  # soft power off
        ("On", "ipmi"),
        ("ForceOff", "ipmi"),
    ], sent
    with pytest.raises(errors.InvalidParameterValue, match="cannot set"):
        await power.set_power_state(task, "bogus")


async def test_a_power_change_the_bmc_never_applies_times_out(
    sim: Simulator, ifaces: tuple[IpmiPower, IpmiManagement], monkeypatch: pytest.MonkeyPatch
) -> None:
    power, _ = ifaces
    machine = sim.machines[3]
    monkeypatch.setattr(machine, "schedule_power", lambda reset_type, delay: None)  # the BMC says yes, does nothing
    started = time.monotonic()
    with pytest.raises(errors.BMCError, match=r"Timed out waiting .* 'power on' at IPMI BMC 127\.0\.0\.1:\d+"):
        await power.set_power_state(task_for(sim, 3), "power on", timeout=0.5)
    assert time.monotonic() - started < 0.5 + SLACK


async def test_boot_device_once_and_persistent_in_both_modes(
    sim: Simulator, ifaces: tuple[IpmiPower, IpmiManagement]
) -> None:
    _, management = ifaces
    machine = sim.machines[1]
    uefi, bios = task_for(sim, 1), task_for(sim, 1, boot_mode="bios")
    assert management.get_supported_boot_devices(uefi) == ["pxe", "disk", "cdrom", "bios", "safe"]

    await management.set_boot_device(uefi, "pxe", persistent=True)  # no boot_mode: uefi, Ironic's default
    assert (machine.boot_target, machine.boot_enabled, machine.boot_mode) == ("Pxe", "Continuous", "UEFI")
    assert await management.get_boot_device(uefi) == {"boot_device": "pxe", "persistent": True}
    assert await management.get_boot_mode(uefi) == "uefi"
    out = await ipmitool(sim, 1, "chassis", "bootparam", "get", "5")
    assert "Force PXE" in out and "Options apply to all future boots" in out and "BIOS EFI boot" in out, out

    await management.set_boot_device(bios, "disk")
    assert (machine.boot_target, machine.boot_enabled, machine.boot_mode) == ("Hdd", "Once", "Legacy")
    assert await management.get_boot_device(bios) == {"boot_device": "disk", "persistent": False}
    assert await management.get_boot_mode(bios) == "bios"
    out = await ipmitool(sim, 1, "chassis", "bootparam", "get", "5")
    assert "Force Boot from default Hard-Drive" in out and "Options apply to only next boot" in out, out
    assert "BIOS EFI boot" not in out and "Boot parameter data: 8008" in out, out  # valid, once, no EFI bit

    # The mode travels with the override in force: switching it re-sends the device.
    await management.set_boot_mode(bios, "uefi")
    assert (machine.boot_target, machine.boot_enabled, machine.boot_mode) == ("Hdd", "Once", "UEFI")

    for device, target in (("cdrom", "Cd"), ("bios", "BiosSetup")):
        await management.set_boot_device(uefi, device)
        assert machine.boot_target == target
        assert (await management.get_boot_device(uefi))["boot_device"] == device

    # ipmitool sets it, we read it: the same flags both ways.
    await ipmitool(sim, 1, "chassis", "bootdev", "pxe", "options=persistent")
    assert await management.get_boot_device(uefi) == {"boot_device": "pxe", "persistent": True}

    # The simulated BMC has no "safe mode" selector: refused at once, with the completion code, never retried.
    started = time.monotonic()
    with pytest.raises(errors.BMCError, match=r"refused to set the boot device to safe.*completion code 0xcc"):
        await management.set_boot_device(uefi, "safe")
    assert time.monotonic() - started < 1.0
    with pytest.raises(errors.InvalidParameterValue, match="Invalid boot device floppy"):
        await management.set_boot_device(uefi, "floppy")


async def test_sessions_are_reused_per_bmc(
    sim: Simulator, ifaces: tuple[IpmiPower, IpmiManagement], monkeypatch: pytest.MonkeyPatch
) -> None:
    power, management = ifaces
    assert power.sessions is management.sessions  # one cache for the conductor's two interfaces
    port = sim.ipmi_driver_info(sim.machines[2])["ipmi_port"]
    opened: list[Any] = []
    original = serversession.ServerSession.__init__

    def counting(self: Any, *args: Any, **kwargs: Any) -> None:
        if kwargs["bmc"].port == port:
            opened.append(self)
        original(self, *args, **kwargs)

    monkeypatch.setattr(serversession.ServerSession, "__init__", counting)
    task = task_for(sim, 2)
    created = power.sessions.created
    for _ in range(10):
        assert await power.get_power_state(task) == "power off"
        await management.get_boot_device(task)
    commands = {id(c) for c in power.sessions.sessions() if c.bmc == "127.0.0.1" and c.ipmi_session.port == port}
    assert len(opened) == 1, f"the BMC saw {len(opened)} RMCP+ sessions for 20 requests"
    assert power.sessions.created - created == 1 and len(commands) == 1

    # The BMC dropped the session (rebooted, timed out): the next request opens a new one, transparently.
    command = next(c for c in power.sessions.sessions() if c.ipmi_session.port == port)
    command.ipmi_session.logout()
    assert await power.get_power_state(task) == "power off"
    assert len(opened) == 2 and power.sessions.created - created == 2

    # Another cipher suite, privilege or password is another session (never one opened with other settings).
    await power.get_power_state(task_for(sim, 2, ipmi_priv_level="OPERATOR"))
    assert len(opened) == 3


async def test_sessions_live_across_cycles_kept_alive_and_bounded(
    sim: Simulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Power sync reads a node once a cycle (60 s or more apart): its session must survive the
    idle time in between (keep-alives), and the cache stays within ipmi_max_sessions (LRU)."""
    tasks = [task_for(sim, i) for i in range(3)]
    ports = [sim.ipmi_driver_info(m)["ipmi_port"] for m in sim.machines[:3]]
    opened: dict[int, int] = {}
    original = serversession.ServerSession.__init__

    def counting(self: Any, *args: Any, **kwargs: Any) -> None:
        opened[kwargs["bmc"].port] = opened.get(kwargs["bmc"].port, 0) + 1
        original(self, *args, **kwargs)

    monkeypatch.setattr(serversession.ServerSession, "__init__", counting)
    # Scaled down: a session unheard for 0.6 s would be replaced; keep-alives every 0.2 s prevent it.
    monkeypatch.setattr(ipmi_client, "SESSION_TRUST", 0.6)
    power = IpmiPower({"ipmi_timeout": TIMEOUT, "ipmi_keepalive_interval": 0.2, "ipmi_max_sessions": 2})
    try:
        await power.get_power_state(tasks[0])
        await wait_for(lambda: power.sessions.keepalives >= 3)  # idle well past SESSION_TRUST
        await power.get_power_state(tasks[0])
        assert opened.get(ports[0]) == 1 and power.sessions.created == 1

        # A third BMC evicts the least recently used session (logged out); coming back opens a new one.
        await power.get_power_state(tasks[1])
        await power.get_power_state(tasks[2])
        assert len(power.sessions) == 2
        assert {c.ipmi_session.port for c in power.sessions.sessions()} == {ports[1], ports[2]}
        await power.get_power_state(tasks[0])
        assert opened.get(ports[0]) == 2 and power.sessions.created == 4
    finally:
        await power.close()
    assert power.sessions._keeper is not None and not power.sessions._keeper.is_alive()

    # Keep-alives off: a session unheard past SESSION_TRUST is tried (briefly) before a new one
    # is opened; this BMC kept it, so it is reused.
    quiet = IpmiPower({"ipmi_timeout": TIMEOUT, "ipmi_keepalive_interval": 0})
    try:
        await quiet.get_power_state(tasks[1])
        seen = opened[ports[1]]
        await asyncio.sleep(0.8)
        await quiet.get_power_state(tasks[1])
        assert quiet.sessions.created == 1 and opened[ports[1]] == seen and quiet.sessions.keepalives == 0
    finally:
        await quiet.close()


async def test_many_machines_at_once(sim: Simulator, ifaces: tuple[IpmiPower, IpmiManagement]) -> None:
    power, _ = ifaces
    tasks = [task_for(sim, i) for i in range(len(sim.machines))]
    found = await asyncio.gather(*(power.get_power_state(t) for _ in range(5) for t in tasks))
    assert len(found) == 20 and set(found) <= {"power on", "power off"}


async def test_wrong_password_is_a_clear_error_at_once(
    sim: Simulator, ifaces: tuple[IpmiPower, IpmiManagement]
) -> None:
    power, _ = ifaces
    machine = sim.machines[2]
    before = machine.summary()
    started = time.monotonic()
    with pytest.raises(errors.BMCError) as caught:
        await power.set_power_state(task_for(sim, 2, ipmi_password="not-the-password"), "power on")
    assert time.monotonic() - started < 1.0  # not retried: another try cannot fix a password
    text = str(caught.value)
    assert "IPMI authentication failed for ipmi-admin@127.0.0.1:" in text and "Incorrect password" in text, text
    assert "ipmi_password" in text and "not-the-password" not in text
    assert machine.summary() == before


async def test_wrong_cipher_suite_is_a_clear_error(sim: Simulator, ifaces: tuple[IpmiPower, IpmiManagement]) -> None:
    power, _ = ifaces
    started = time.monotonic()
    with pytest.raises(errors.BMCError, match=r"answered cipher suite 17 with cipher suite 3.*ipmi_cipher_suite is 17"):
        await power.get_power_state(task_for(sim, 2, ipmi_cipher_suite="17"))
    assert time.monotonic() - started < 1.0
    assert await power.get_power_state(task_for(sim, 2, ipmi_cipher_suite=3)) == "power off"  # suite 3 works


@pytest.mark.parametrize("case", ["silent BMC", "unknown user"])
async def test_no_answer_is_a_clear_error_within_the_timeout(
    sim: Simulator, ifaces: tuple[IpmiPower, IpmiManagement], case: str
) -> None:
    power, _ = ifaces
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as silent:  # takes packets, never answers
        silent.bind(("127.0.0.1", 0))
        if case == "silent BMC":
            task = task_for(sim, 2, ipmi_port=silent.getsockname()[1])
            where, stage = f"127.0.0.1:{silent.getsockname()[1]}", "channel authentication"
        else:  # pyghmi's BMC (and others) ignore RAKP 1 for a user they do not know
            task = task_for(sim, 2, ipmi_username="nobody")
            where, stage = "nobody@127.0.0.1", "RAKP message 1"

        gaps: list[float] = []

        async def ticker() -> None:  # the event loop keeps running meanwhile
            last = time.monotonic()
            while True:
                await asyncio.sleep(0.02)
                gaps.append(time.monotonic() - last)
                last = time.monotonic()

        ticking = asyncio.create_task(ticker())
        started = time.monotonic()
        try:
            with pytest.raises(errors.BMCError) as caught:
                await power.get_power_state(task)
        finally:
            ticking.cancel()
        took = time.monotonic() - started
    text = str(caught.value)
    assert where in text and "did not answer" in text and stage in text, text
    assert TIMEOUT - 0.2 < took < TIMEOUT + SLACK, took
    assert max(gaps) < 0.3, max(gaps)
    # No worker is left waiting on the silent BMC: a good one answers at once.
    started = time.monotonic()
    assert await power.get_power_state(task_for(sim, 2)) == "power off"
    assert time.monotonic() - started < 0.5


async def test_validate_does_not_touch_the_network(ifaces: tuple[IpmiPower, IpmiManagement]) -> None:
    power, management = ifaces
    node = {"uuid": "n", "driver_info": {"ipmi_address": "192.0.2.1", "ipmi_password": "x"}}
    task = base.Task(node=node, ports=[], driver=None, conductor="test")  # type: ignore[arg-type]
    started = time.monotonic()
    await power.validate(task)
    await management.validate(task)
    assert time.monotonic() - started < 0.05
