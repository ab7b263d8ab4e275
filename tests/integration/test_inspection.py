"""In-band inspection on the machine simulator (issue 21 item 2): ``inspect``
boots the agent ramdisk, the agent posts its inventory to
``/v1/continue_inspection``, and each node gets its own machine's
properties and ports. The ramdisk endpoint refuses bad data with a 400 and
an unknown machine with the generic 404."""

from __future__ import annotations

import json
from typing import Any

import aiohttp
import pytest

from services.runtime import ALL_SERVICES_ORDER, RunningStack
from services.simulator.options import SimulatorOptions
from services.simulator.service import Simulator
from tests.conftest import test_settings
from tests.restclient import call, wait_state

USER, PASSWORD = "admin", "inspect-secret"
MiB = 1024 * 1024
DISK = 3 * 1024 * MiB  # sparse: 3 GiB, so local_gb is 2


@pytest.fixture(scope="module")
async def env(database_url: str, tmp_path_factory: pytest.TempPathFactory) -> Any:
    tmp = tmp_path_factory.mktemp("inspection")
    settings = test_settings(
        database_url, tmp / "state", conductor={"hostname": "inspect-conductor", "timeout_check_interval": 1.0}
    )
    stack = RunningStack()
    await stack.start(settings, list(ALL_SERVICES_ORDER))
    simulator = Simulator(
        SimulatorOptions(
            machines=3,
            nics_per_machine=3,
            state_dir=str(tmp / "machines"),
            boot_url=stack.endpoints["ipxe HTTP"],
            username=USER,
            password=PASSWORD,
            disk_size=DISK,
        ).validate()
    )
    await simulator.start()
    session = aiohttp.ClientSession()
    conductor: Any = next(s for s in stack.services if s.name == "conductor")  # ConductorService: its store
    await conductor.objectstore.put_bytes("inspect", "kernel", b"k")
    try:
        yield {
            "stack": stack,
            "sim": simulator,
            "api": stack.endpoints["api REST (Ironic v1)"],
            "session": session,
            "kernel": await conductor.objectstore.temp_url("inspect", "kernel", lifetime=1800),
        }
    finally:
        await session.close()
        await stack.close()
        await simulator.stop()


async def enroll(env: dict[str, Any], index: int) -> dict[str, Any]:
    machine = env["sim"].machines[index]
    _, node = await call(
        env,
        "POST",
        "/v1/nodes",
        {
            "name": machine.name,
            "driver": "redfish",
            "boot_interface": "ipxe",
            "deploy_interface": "direct",
            "inspect_interface": "agent",
            "properties": {"capabilities": "rack:r1"},
            "driver_info": {
                "redfish_address": env["sim"].redfish_url,
                "redfish_system_id": machine.system_path,
                "redfish_username": USER,
                "redfish_password": PASSWORD,
                "deploy_kernel": env["kernel"],
                "deploy_ramdisk": env["kernel"],
            },
        },
        expect=201,
    )
    # The booting NIC is known (it is how the machine network-boots); inspection finds the others.
    await call(env, "POST", "/v1/ports", {"node_uuid": node["uuid"], "address": machine.macs[0]}, expect=201)
    await call(env, "PUT", f"/v1/nodes/{node['uuid']}/states/provision", {"target": "manage"}, expect=202)
    await wait_state(env, node["uuid"], "manageable")
    return node


async def ports_of(env: dict[str, Any], uuid: str) -> dict[str, bool]:
    _, body = await call(env, "GET", f"/v1/ports/detail?node={uuid}", expect=200)
    return {p["address"]: p["pxe_enabled"] for p in body["ports"]}


async def test_each_machine_gets_its_own_properties_and_ports(env: dict[str, Any]) -> None:
    nodes = [await enroll(env, i) for i in range(3)]
    for node in nodes:
        await call(env, "PUT", f"/v1/nodes/{node['uuid']}/states/provision", {"target": "inspect"}, expect=202)
    seen = set()
    for index, node in enumerate(nodes):
        machine = env["sim"].machines[index]
        done = await wait_state(env, node["uuid"], "manageable", timeout=120)
        assert done["last_error"] is None and done["power_state"] == "power off"
        assert done["inspection_finished_at"] is not None
        props = done["properties"]
        facts = machine.hardware_facts()
        assert props["cpus"] == facts.cpu_count and props["memory_mb"] == facts.memory_mb
        assert props["cpu_arch"] == "x86_64" and props["local_gb"] == 2
        assert props["capabilities"] == f"rack:r1,boot_mode:{facts.boot_mode}"
        seen.add((props["cpus"], props["memory_mb"]))
        # NICs 0 and 1 have a link, NIC 2 has none; only the booting NIC network-boots.
        assert await ports_of(env, node["uuid"]) == {machine.macs[0]: True, machine.macs[1]: False}
        row = await env["stack"].pool.fetchrow(
            "SELECT i.inventory::text AS inventory, i.plugin_data::text AS plugin_data FROM node_inventory i "
            "JOIN nodes n ON n.id = i.node_id WHERE n.uuid = $1::uuid",
            node["uuid"],
        )
        inventory = json.loads(row["inventory"])
        assert [i["mac_address"] for i in inventory["interfaces"]] == list(machine.macs)
        assert json.loads(row["plugin_data"]) == {"boot_interface": machine.macs[0]}
    assert len(seen) == 3, seen  # three machines, three different sets of hardware


async def test_the_ramdisk_endpoint_refuses_bad_data_and_unknown_machines(env: dict[str, Any]) -> None:
    url = env["api"] + "/v1/continue_inspection"
    cases = [
        ({"inventory": {}}, 400, "interfaces"),
        ({"inventory": {"interfaces": [{"name": "eth0"}]}}, 400, "mac_address"),
        ({"no": "inventory"}, 400, "inventory"),
        ({"inventory": {"interfaces": [{"mac_address": "52:54:00:ff:ff:01"}]}}, 404, "could not be found"),
    ]
    for body, status, words in cases:
        async with env["session"].post(url, json=body) as response:  # no version header: 1.1, as IPA
            text = await response.text()
            assert response.status == status, (body, text)
            assert words in text, text
    # A known machine whose node is not being inspected is not told anything either.
    machine = env["sim"].machines[0]
    async with env["session"].post(url, json={"inventory": {"interfaces": [{"mac_address": machine.macs[0]}]}}) as r:
        assert r.status == 404
    async with env["session"].post(
        url,
        json={"inventory": {"interfaces": [{"mac_address": machine.macs[0]}]}},
        headers={"X-OpenStack-Ironic-API-Version": "1.78"},
    ) as r:
        assert r.status == 404 and "1.84" in await r.text()
