"""The redfish interfaces against Ferrum's own simulator (the second, independent
Redfish implementation they are validated on), in this process."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from services.common import errors
from services.conductor.drivers import base
from services.conductor.drivers.redfish import RedfishManagement, RedfishPower
from services.simulator import Simulator, SimulatorOptions
from tests.support.node_records import node_record

USER, PASSWORD = "admin", "bmc-password"

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
async def sim(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Simulator]:
    simulator = Simulator(
        SimulatorOptions(
            machines=3,
            state_dir=str(tmp_path_factory.mktemp("rf-sim")),
            disk_size=4 * 1024**2,
            username=USER,
            password=PASSWORD,
            boot_order=("Hdd",),
            nics_per_machine=2,
        )
    )
    await simulator.start()
    try:
        yield simulator
    finally:
        await simulator.stop()


@pytest.fixture(scope="module")
async def power() -> AsyncIterator[RedfishPower]:
    interface = RedfishPower({"redfish_poll_interval": 0.1, "redfish_power_timeout": 20})
    yield interface
    await interface.close()


@pytest.fixture(scope="module")
async def management() -> AsyncIterator[RedfishManagement]:
    interface = RedfishManagement({})
    yield interface
    await interface.close()


def make_task(sim: Simulator, index: int | None = 0, **extra: object) -> base.Task:
    info: dict[str, object] = {**sim.driver_info(sim.machines[index or 0]), **extra}
    if index is None:
        info.pop("redfish_system_id")
    node = {"uuid": "0d7f0c43-2d5b-4f3e-9a42-9c1c7e6e1a01", "driver": "redfish", "driver_info": info}
    return base.Task(node=node, ports=[], driver=None, conductor="test")  # type: ignore[arg-type]  # drivers under test never read it


async def test_power_cycle(sim: Simulator, power: RedfishPower) -> None:
    task, machine = make_task(sim, 0), sim.machines[0]
    assert await power.get_power_state(task) == "power off"
    await power.set_power_state(task, "power on")
    assert machine.power_state == "On" and machine.boot_count == 1
    await power.reboot(task)  # off, then on: the firmware runs again
    assert machine.power_state == "On" and machine.boot_count == 2
    assert [e["reason"] for e in machine.events("power_off")][-1] == "ForceOff"
    await power.set_power_state(task, "soft rebooting")
    assert machine.boot_count == 3 and machine.events("reset")[-1]["reason"] == "GracefulRestart"
    await power.set_power_state(task, "soft power off")
    assert machine.power_state == "Off"
    assert await power.get_power_state(task) == "power off"


async def test_boot_device_once_and_persistent(
    sim: Simulator, power: RedfishPower, management: RedfishManagement
) -> None:
    task, machine = make_task(sim, 1), sim.machines[1]
    await management.set_boot_device(task, "pxe", persistent=False)
    assert await management.get_boot_device(task) == {"boot_device": "pxe", "persistent": False}
    assert (machine.boot_target, machine.boot_enabled) == ("Pxe", "Once")
    await power.set_power_state(task, "power on")  # the Once override is used by this boot
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


async def test_sushy_runs_in_the_interface_pool(sim: Simulator, power: RedfishPower) -> None:
    import threading

    name = await power._call(make_task(sim, 0), "probe", lambda system: threading.current_thread().name)
    assert name.startswith("redfish-power")


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
    assert sim.redfish is not None
    sessions_before = set(sim.redfish.sessions)
    try:
        assert await power.get_power_state(make_task(sim, 0, redfish_auth_type=auth)) in ("power on", "power off")
        with pytest.raises(errors.BMCError, match="authentication failed"):
            await power.get_power_state(make_task(sim, 0, redfish_auth_type=auth, redfish_password="wrong"))
    finally:
        await power.close()  # what the conductor calls at stop
    # Closing logged the session out (basic auth never made one).
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
            task = base.Task(
                node=node_record(uuid="x", driver_info=info),
                ports=[],
                driver=None,  # type: ignore[arg-type]
                conductor="test",
            )
            assert await power.get_power_state(task) == "power off"
            await asyncio.to_thread(power.connections.close)
        finally:
            await single.stop()
        with pytest.raises(errors.BMCError, match="unreachable"):
            await power.get_power_state(task)  # the simulator is gone now
    finally:
        await asyncio.to_thread(power.connections.close)


# ---- through the REST API and the conductor ------------------------------------------


async def test_rest_power_and_boot_device_through_the_conductor(stack: Any, sim: Simulator) -> None:
    api = stack.endpoints["api REST (Ironic v1)"]
    machine = sim.machines[2]
    headers = {"X-OpenStack-Ironic-API-Version": "1.56"}
    async with aiohttp.ClientSession(headers=headers) as http:

        async def call(method: str, path: str, body: Any = None, expect: int = 200) -> Any:
            async with http.request(method, api + path, json=body) as resp:
                text = await resp.text()
                assert resp.status == expect, f"{method} {path}: {resp.status} {text}"
                return json.loads(text) if text else None

        async def settle(uuid: str) -> dict[str, Any]:
            deadline = time.monotonic() + 60
            while True:
                node = await call("GET", f"/v1/nodes/{uuid}")
                if node["target_power_state"] is None and node["reservation"] is None:
                    return node
                assert time.monotonic() < deadline, node
                await asyncio.sleep(0.1)

        node = await call(
            "POST",
            "/v1/nodes",
            {"name": "rf-rest", "driver": "redfish", "driver_info": sim.driver_info(machine)},
            expect=201,
        )
        uuid = node["uuid"]
        assert node["driver_info"]["redfish_password"] == "******"
        assert (node["power_interface"], node["management_interface"]) == ("redfish", "redfish")
        validation = await call("GET", f"/v1/nodes/{uuid}/validate")
        assert validation["power"]["result"] is True and validation["management"]["result"] is True

        await call("PUT", f"/v1/nodes/{uuid}/states/power", {"target": "power on"}, expect=202)
        assert (await settle(uuid))["power_state"] == "power on"
        assert machine.power_state == "On"
        boots = machine.boot_count
        await call("PUT", f"/v1/nodes/{uuid}/states/power", {"target": "rebooting"}, expect=202)
        assert (await settle(uuid))["power_state"] == "power on"
        assert machine.boot_count == boots + 1

        await call(
            "PUT", f"/v1/nodes/{uuid}/management/boot_device", {"boot_device": "pxe", "persistent": True}, expect=204
        )
        assert (machine.boot_target, machine.boot_enabled) == ("Pxe", "Continuous")
        assert await call("GET", f"/v1/nodes/{uuid}/management/boot_device") == {
            "boot_device": "pxe",
            "persistent": True,
        }
        supported = await call("GET", f"/v1/nodes/{uuid}/management/boot_device/supported")
        assert supported["supported_boot_devices"] == ["pxe", "disk", "cdrom", "bios"]
        await call("PUT", f"/v1/nodes/{uuid}/states/power", {"target": "power off"}, expect=202)
        assert (await settle(uuid))["power_state"] == "power off"
        assert machine.power_state == "Off"

        # Wrong credentials: the request is accepted, the conductor records why it failed, nothing changes.
        bad = await call(
            "POST",
            "/v1/nodes",
            {
                "name": "rf-bad",
                "driver": "redfish",
                "driver_info": {**sim.driver_info(machine), "redfish_password": "wrong"},
            },
            expect=201,
        )
        await call("PUT", f"/v1/nodes/{bad['uuid']}/states/power", {"target": "power on"}, expect=202)
        failed = await settle(bad["uuid"])
        assert "authentication failed" in failed["last_error"] and failed["power_state"] != "power on"
        assert machine.power_state == "Off"
        # Missing address: validation says so without any network call.
        await call("PATCH", f"/v1/nodes/{bad['uuid']}", [{"op": "remove", "path": "/driver_info/redfish_address"}])
        validation = await call("GET", f"/v1/nodes/{bad['uuid']}/validate")
        assert validation["power"]["result"] is False and "redfish_address" in validation["power"]["reason"]


async def test_virtual_media_insert_and_eject(sim: Simulator, management: RedfishManagement, tmp_path: Path) -> None:
    from aiohttp import web

    from services.common.aiohttp_serving import start_http_site

    async def serve(request: web.Request) -> web.Response:
        return web.Response(status=404) if request.match_info["name"] == "missing" else web.Response(body=b"iso")

    app = web.Application()
    app.router.add_get("/{name}", serve)
    runner, port = await start_http_site(app, "127.0.0.1", 0)
    try:
        task, machine = make_task(sim, 1), sim.machines[1]
        url = f"http://127.0.0.1:{port}/boot-node.iso"
        await management.insert_virtual_media(task, "cdrom", url)
        assert (machine.virtual_media["Cd"].image, machine.virtual_media["Cd"].inserted) == (url, True)
        media = {m["id"]: m for m in await management.get_virtual_media(task)}
        assert media["Cd"] == {"id": "Cd", "media_types": ["CD", "DVD"], "image": url, "inserted": True}
        assert media["Floppy"]["inserted"] is False
        with pytest.raises(errors.BMCError, match="already holds media"):
            await management.insert_virtual_media(task, "cdrom", url)
        await management.insert_virtual_media(task, "floppy", f"http://127.0.0.1:{port}/params.img")
        await management.eject_virtual_media(task, "cdrom")
        assert machine.virtual_media["Cd"].inserted is False and machine.virtual_media["Floppy"].inserted
        await management.eject_virtual_media(task)
        assert not any(slot.inserted for slot in machine.virtual_media.values())
        with pytest.raises(errors.InvalidParameterValue, match="Invalid virtual media device"):
            await management.insert_virtual_media(task, "tape", url)
        with pytest.raises(errors.InvalidParameterValue, match="http or https"):
            await management.insert_virtual_media(task, "cdrom", "nfs://server/boot.iso")
        # A URL the BMC cannot fetch is refused by the BMC, with its reason.
        with pytest.raises(errors.BMCError, match="insert virtual cdrom media"):
            await management.insert_virtual_media(task, "cdrom", f"http://127.0.0.1:{port}/missing")
        assert machine.virtual_media["Cd"].image is None
    finally:
        await runner.cleanup()


async def test_slow_bmc_power_changes_are_polled(tmp_path: Path) -> None:
    """With --power-delay the simulator answers at once and acts later, like real BMCs."""
    slow = Simulator(
        SimulatorOptions(
            machines=1, state_dir=str(tmp_path), disk_size=2 * 1024**2, boot_order=("Hdd",), power_delay=(0.3, 0.8)
        )
    )
    await slow.start()
    power = RedfishPower({"redfish_poll_interval": 0.05, "redfish_power_timeout": 10})
    try:
        machine = slow.machines[0]
        task = base.Task(  # the power interface never reads task.driver
            node=node_record(uuid="slow", driver_info=slow.driver_info(machine)),
            ports=[],
            driver=None,  # type: ignore[arg-type]
            conductor="test",
        )
        async with (
            aiohttp.ClientSession() as http,
            http.post(
                slow.redfish_url + machine.system_path + "/Actions/ComputerSystem.Reset", json={"ResetType": "On"}
            ) as resp,
        ):
            assert resp.status == 204
        assert machine.power_state == "Off"  # accepted, not yet done
        await power.set_power_state(task, "power on")  # polls until the change lands
        assert machine.power_state == "On" and machine.events("power_pending")
        await power.reboot(task)
        assert machine.power_state == "On" and machine.boot_count == 2
        with pytest.raises(errors.BMCError, match="Timed out"):
            await power.set_power_state(task, "power off", timeout=0.1)
        # Whatever is still pending when stop() runs is dropped: every machine ends off.
        await power.set_power_state(task, "power on")
    finally:
        await asyncio.to_thread(power.connections.close)
        await slow.stop()
    assert machine.power_state == "Off" and machine.agent is None
