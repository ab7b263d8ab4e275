"""Issue 7 end to end: a live stack and the machine simulator over real
protocols (Redfish power and boot override, iPXE scripts from the renderer,
the agent protocol, sparse-file disks). Five machines deploy a raw or a qcow2
image; every disk holds the raw image; each machine then boots its disk and
finds its config drive; undeploy powers them off and returns them."""

from __future__ import annotations

import asyncio
import hashlib
import json
import subprocess
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from services.demo_image import build_demo_image, payload_digest
from services.runtime import ALL_SERVICES_ORDER, RunningStack
from services.simulator.options import SimulatorOptions
from services.simulator.service import Simulator
from tests.conftest import test_settings
from tests.restclient import call, wait_state

USER, PASSWORD = "admin", "fleet-secret"


@pytest.fixture(scope="module")
async def fleet(database_url: str, tmp_path_factory: pytest.TempPathFactory) -> Any:
    tmp = tmp_path_factory.mktemp("fleet")
    settings = test_settings(
        database_url,
        tmp / "state",
        conductor={"hostname": "fleet-conductor", "deploy_callback_timeout": 15.0, "timeout_check_interval": 1.0},
    )
    stack = RunningStack()
    await stack.start(settings, list(ALL_SERVICES_ORDER))
    simulator = Simulator(
        SimulatorOptions(
            machines=7,
            state_dir=str(tmp / "machines"),
            boot_url=stack.endpoints["ipxe HTTP"],
            username=USER,
            password=PASSWORD,
            disk_size=160 * 1024 * 1024,
        ).validate()
    )
    await simulator.start()
    session = aiohttp.ClientSession()
    try:
        yield {
            "stack": stack,
            "sim": simulator,
            "api": stack.endpoints["api REST (Ironic v1)"],
            "tmp": tmp,
            "session": session,
        }
    finally:
        await session.close()
        await stack.close()
        await simulator.stop()


async def test_five_machines_raw_and_qcow2(fleet: dict[str, Any]) -> None:
    conductor = next(s for s in fleet["stack"].services if s.name == "conductor")
    store = conductor.objectstore
    image = build_demo_image(fleet["tmp"] / "images", size_mib=24, marker="fleet")
    qcow2 = fleet["tmp"] / "images" / "demo-disk.qcow2"
    subprocess.run(["qemu-img", "convert", "-f", "raw", "-O", "qcow2", str(image.path), str(qcow2)], check=True)
    await store.put_file("fleet", "disk.raw", image.path)
    await store.put_file("fleet", "disk.qcow2", qcow2)
    sources = {
        "raw": (await store.temp_url("fleet", "disk.raw", lifetime=600), image.sha256, "raw"),
        "qcow2": (
            await store.temp_url("fleet", "disk.qcow2", lifetime=600),
            hashlib.sha256(qcow2.read_bytes()).hexdigest(),
            "qcow2",
        ),
    }
    await store.put_bytes("fleet", "kernel", b"k")
    kernel = await store.temp_url("fleet", "kernel", lifetime=600)
    machines = fleet["sim"].machines[:5]
    nodes = []
    for index, machine in enumerate(machines):
        url, sha, fmt = sources["qcow2" if index % 2 else "raw"]
        _, node = await call(
            fleet,
            "POST",
            "/v1/nodes",
            {
                "name": machine.name,
                "driver": "redfish",
                "boot_interface": "ipxe",
                "deploy_interface": "direct",
                "driver_info": {
                    "redfish_address": fleet["sim"].redfish_url,
                    "redfish_system_id": machine.system_path,
                    "redfish_username": USER,
                    "redfish_password": PASSWORD,
                    "deploy_kernel": kernel,
                    "deploy_ramdisk": kernel,
                },
                "instance_info": {
                    "image_source": url,
                    "image_os_hash_algo": "sha256",
                    "image_os_hash_value": sha,
                    "image_disk_format": fmt,
                },
            },
            expect=201,
        )
        assert node["driver_info"]["redfish_password"] == "******"
        await call(fleet, "POST", "/v1/ports", {"node_uuid": node["uuid"], "address": machine.macs[0]}, expect=201)
        nodes.append(node)

    async def provision(node: dict[str, Any]) -> None:
        for verb, state in (("manage", "manageable"), ("provide", "available")):
            await call(fleet, "PUT", f"/v1/nodes/{node['uuid']}/states/provision", {"target": verb}, expect=202)
            await wait_state(fleet, node["uuid"], state)
        await call(
            fleet,
            "PUT",
            f"/v1/nodes/{node['uuid']}/states/provision",
            {"target": "active", "configdrive": {"meta_data": {"hostname": f"{node['name']}.fleet"}}},
            expect=202,
        )
        active = await wait_state(fleet, node["uuid"], "active", timeout=180)
        assert active["power_state"] == "power on" and active["last_error"] is None

    await asyncio.gather(*(provision(n) for n in nodes))
    expected = payload_digest(image.path, image)
    deadline = time.monotonic() + 60
    while any(m.os_report is None for m in machines):
        assert time.monotonic() < deadline, "machines did not boot their disks"
        await asyncio.sleep(0.2)
    for machine in machines:
        assert payload_digest(Path(machine.disk_path), image) == expected, machine.name
        with open(machine.disk_path, "rb") as disk:
            assert disk.read(446) == image.path.read_bytes()[:446]  # the boot code area is the image's
        drive = (machine.os_report or {}).get("config_drive") or {}
        assert drive.get("meta_data", {}).get("hostname") == f"{machine.name}.fleet"
        assert machine.power_state == "On"
    # The iPXE chain really ran: each machine fetched its deploy script from the renderer.
    assert all(any("kernel" in json.dumps(e) for e in m.boot_log) for m in machines)

    await asyncio.gather(
        *(
            call(fleet, "PUT", f"/v1/nodes/{n['uuid']}/states/provision", {"target": "deleted"}, expect=202)
            for n in nodes
        )
    )
    for node in nodes:
        done = await wait_state(fleet, node["uuid"], "available")
        assert done["power_state"] == "power off" and done["instance_info"] == {}
    assert all(m.power_state == "Off" for m in machines)


async def enroll(fleet: dict[str, Any], machine: Any, *, sha256: str, mac: str | None = None) -> dict[str, Any]:
    """A machine enrolled and taken to available, imaging the small stored image."""
    store = next(s for s in fleet["stack"].services if s.name == "conductor").objectstore
    if await store.stat("fleet", "small.raw") is None:
        await store.put_bytes("fleet", "small.raw", SMALL_IMAGE)
    url = await store.temp_url("fleet", "small.raw", lifetime=600)
    _, node = await call(
        fleet,
        "POST",
        "/v1/nodes",
        {
            "name": machine.name,
            "driver": "redfish",
            "boot_interface": "ipxe",
            "deploy_interface": "direct",
            "driver_info": {
                "redfish_address": fleet["sim"].redfish_url,
                "redfish_system_id": machine.system_path,
                "redfish_username": USER,
                "redfish_password": PASSWORD,
                "deploy_kernel": url,
                "deploy_ramdisk": url,
            },
            "instance_info": {"image_source": url, "image_os_hash_algo": "sha256", "image_os_hash_value": sha256},
        },
        expect=201,
    )
    await call(fleet, "POST", "/v1/ports", {"node_uuid": node["uuid"], "address": mac or machine.macs[0]}, expect=201)
    for verb, state in (("manage", "manageable"), ("provide", "available")):
        await call(fleet, "PUT", f"/v1/nodes/{node['uuid']}/states/provision", {"target": verb}, expect=202)
        await wait_state(fleet, node["uuid"], state)
    return node


SMALL_IMAGE = b"\x00" * 512 + b"FERRUM" * 100_000


async def test_bad_checksum_fails_and_redeploy_succeeds(fleet: dict[str, Any]) -> None:
    machine = fleet["sim"].machines[5]
    node = await enroll(fleet, machine, sha256="f" * 64)
    await call(fleet, "PUT", f"/v1/nodes/{node['uuid']}/states/provision", {"target": "active"}, expect=202)
    failed = await wait_state(fleet, node["uuid"], "deploy failed")
    assert "checksum mismatch" in failed["last_error"].lower(), failed["last_error"]
    good = hashlib.sha256(SMALL_IMAGE).hexdigest()
    await call(
        fleet,
        "PATCH",
        f"/v1/nodes/{node['uuid']}",
        [{"op": "replace", "path": "/instance_info/image_os_hash_value", "value": good}],
        expect=200,
    )
    await call(fleet, "PUT", f"/v1/nodes/{node['uuid']}/states/provision", {"target": "active"}, expect=202)
    await wait_state(fleet, node["uuid"], "active")
    with open(machine.disk_path, "rb") as disk:
        assert disk.read(len(SMALL_IMAGE)) == SMALL_IMAGE


async def test_machine_that_never_calls_back_times_out(fleet: dict[str, Any]) -> None:
    """Enrolled with a MAC the machine does not have: its firmware gets our error
    script, no agent ever starts, and the call-back timeout fails the deploy."""
    machine = fleet["sim"].machines[6]
    node = await enroll(fleet, machine, sha256=hashlib.sha256(SMALL_IMAGE).hexdigest(), mac="52:54:00:fe:fe:fe")
    await call(fleet, "PUT", f"/v1/nodes/{node['uuid']}/states/provision", {"target": "active"}, expect=202)
    await wait_state(fleet, node["uuid"], "wait call-back")
    failed = await wait_state(fleet, node["uuid"], "deploy failed", timeout=90)
    assert "Timeout reached while waiting for callback" in failed["last_error"]
    # The BMC's console log (for this firmware, its boot log) says what the machine did last.
    assert failed["last_error"].endswith("the console last showed: no_bootable_device"), failed["last_error"]
    assert machine.agent is None and machine.os_report is None
