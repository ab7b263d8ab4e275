"""The redfish interfaces against Ferrum's own simulator (the second, independent
Redfish implementation they are validated on), in this process."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from services.common import errors
from services.conductor.drivers import base
from services.conductor.drivers.redfish import RedfishManagement, RedfishPower
from services.simulator import Simulator, SimulatorOptions

USER, PASSWORD = "admin", "bmc-password"

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
async def sim(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Simulator]:
    simulator = Simulator(SimulatorOptions(machines=3, state_dir=str(tmp_path_factory.mktemp("rf-sim")),
                                           disk_size=4 * 1024**2, username=USER, password=PASSWORD,
                                           boot_order=("Hdd",), nics_per_machine=2))
    await simulator.start()
    try:
        yield simulator
    finally:
        await simulator.stop()


@pytest.fixture(scope="module")
async def power() -> AsyncIterator[RedfishPower]:
    interface = RedfishPower({"redfish_poll_interval": 0.1, "redfish_power_timeout": 20})
    yield interface
    await asyncio.to_thread(interface.connections.close)


@pytest.fixture(scope="module")
async def management() -> AsyncIterator[RedfishManagement]:
    interface = RedfishManagement({})
    yield interface
    await asyncio.to_thread(interface.connections.close)


def make_task(sim: Simulator, index: int | None = 0, **extra: object) -> base.Task:
    info: dict[str, object] = {**sim.driver_info(sim.machines[index or 0]), **extra}
    if index is None:
        info.pop("redfish_system_id")
    node = {"uuid": "0d7f0c43-2d5b-4f3e-9a42-9c1c7e6e1a01", "driver": "redfish", "driver_info": info}
    return base.Task(node=node, ports=[], driver=None, conductor="test")  # type: ignore[arg-type]


async def test_power_cycle(sim: Simulator, power: RedfishPower) -> None:
    task, machine = make_task(sim, 0), sim.machines[0]
    assert await power.get_power_state(task) == "power off"
    await power.set_power_state(task, "power on")
    assert machine.power_state == "On" and machine.boot_count == 1
    await power.reboot(task)   # off, then on: the firmware runs again
    assert machine.power_state == "On" and machine.boot_count == 2
    assert [e["reason"] for e in machine.events("power_off")][-1] == "ForceOff"
    await power.set_power_state(task, "soft rebooting")
    assert machine.boot_count == 3 and machine.events("reset")[-1]["reason"] == "GracefulRestart"
    await power.set_power_state(task, "soft power off")
    assert machine.power_state == "Off"
    assert await power.get_power_state(task) == "power off"


async def test_boot_device_once_and_persistent(sim: Simulator, power: RedfishPower,
                                               management: RedfishManagement) -> None:
    task, machine = make_task(sim, 1), sim.machines[1]
    await management.set_boot_device(task, "pxe", persistent=False)
    assert await management.get_boot_device(task) == {"boot_device": "pxe", "persistent": False}
    assert (machine.boot_target, machine.boot_enabled) == ("Pxe", "Once")
    await power.set_power_state(task, "power on")   # the Once override is used by this boot
    assert machine.events("firmware_start")[-1]["sequence"] == "Pxe,Hdd"
    assert await management.get_boot_device(task) == {"boot_device": None, "persistent": False}
    await management.set_boot_device(task, "disk", persistent=True)
    assert await management.get_boot_device(task) == {"boot_device": "disk", "persistent": True}
    await power.reboot(task)
    assert machine.events("firmware_start")[-1]["sequence"] == "Hdd"
    for device, target in (("cdrom", "Cd"), ("bios", "BiosSetup")):
        await management.set_boot_device(task, device, persistent=True)
        assert machine.boot_target == target
    await power.set_power_state(task, "power off")


async def test_uuid_and_macs(sim: Simulator, management: RedfishManagement) -> None:
    machine = sim.machines[2]
    task = make_task(sim, 2)
    assert await management.get_system_uuid(task) == machine.uuid
    assert await management.get_mac_addresses(task) == list(machine.macs)
    # A bare system Id works as well as the full path.
    assert await management.get_system_uuid(make_task(sim, 2, redfish_system_id=machine.uuid)) == machine.uuid


@pytest.mark.parametrize("auth", ["basic", "session", "auto"])
async def test_every_auth_type(sim: Simulator, auth: str) -> None:
    power = RedfishPower({})
    sessions_before = set(sim.redfish.sessions)
    try:
        assert await power.get_power_state(make_task(sim, 0, redfish_auth_type=auth)) in ("power on", "power off")
        with pytest.raises(errors.BMCError, match="authentication failed"):
            await power.get_power_state(make_task(sim, 0, redfish_auth_type=auth, redfish_password="wrong"))
    finally:
        await asyncio.to_thread(power.connections.close)
    # Closing the cache logged its session out (basic auth never made one).
    assert set(sim.redfish.sessions) == sessions_before


async def test_errors_name_the_problem(sim: Simulator, tmp_path: Path) -> None:
    power = RedfishPower({})
    try:
        with pytest.raises(errors.InvalidParameterValue, match="exactly one system"):
            await power.get_power_state(make_task(sim, None))
        with pytest.raises(errors.BMCError, match="not found"):
            await power.get_power_state(make_task(sim, 0, redfish_system_id="/redfish/v1/Systems/missing"))
        # A one-machine BMC needs no system id.
        single = Simulator(SimulatorOptions(machines=1, state_dir=str(tmp_path), disk_size=2 * 1024**2))
        await single.start()
        try:
            info = single.driver_info(single.machines[0])
            info.pop("redfish_system_id")
            task = base.Task(node={"uuid": "x", "driver_info": info}, ports=[], driver=None,  # type: ignore[arg-type]
                             conductor="test")
            assert await power.get_power_state(task) == "power off"
            await asyncio.to_thread(power.connections.close)
        finally:
            await single.stop()
        with pytest.raises(errors.BMCError, match="unreachable"):
            await power.get_power_state(task)   # the simulator is gone now
    finally:
        await asyncio.to_thread(power.connections.close)
