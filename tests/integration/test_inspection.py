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

from services.common.db.inspection_rules import InspectionRuleRepository
from services.runtime import ALL_SERVICES_ORDER, RunningStack
from services.simulator.agents import AgentLaunch, real_agent
from services.simulator.options import SimulatorOptions
from services.simulator.service import Simulator
from tests.conftest import test_settings
from tests.labapi import versioned_api
from tests.restclient import call, wait_state

USER, PASSWORD = "admin", "inspect-secret"
MiB = 1024 * 1024
DISK = 3 * 1024 * MiB  # sparse: 3 GiB, so local_gb is 2
SILENT = 3  # the machine whose ramdisk never posts its inventory
INSPECT_TIMEOUT = 20.0
# A built-in rule (the conductor's file: not stored, may use any priority): it runs first.
BUILT_IN_RULES = """
- description: every inspected node says who inspected it
  priority: 10000
  actions:
    - op: set-attribute
      args: {path: /extra/order, value: built-in}
    - op: set-attribute
      args: {path: /extra/inspected_by, value: "{inventory[system_vendor][manufacturer]} agent"}
"""


class SilentRamdisk:
    """A ramdisk that boots and dies at once: no lookup, no inventory, no heartbeat."""

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        return None


@pytest.fixture(scope="module")
async def env(database_url: str, tmp_path_factory: pytest.TempPathFactory) -> Any:
    tmp = tmp_path_factory.mktemp("inspection")
    (tmp / "built-in-rules.yaml").write_text(BUILT_IN_RULES)
    settings = test_settings(
        database_url,
        tmp / "state",
        conductor={
            "hostname": "inspect-conductor",
            "timeout_check_interval": 1.0,
            "inspection_rules_file": str(tmp / "built-in-rules.yaml"),
            "inspect_wait_timeout": INSPECT_TIMEOUT,
        },
    )
    stack = RunningStack()
    await stack.start(settings, list(ALL_SERVICES_ORDER))
    simulator: Simulator

    def agent_factory(launch: AgentLaunch) -> Any:
        """The real agent, except on the last machine, whose ramdisk dies before it posts."""
        if launch.machine == simulator.machines[SILENT].name:
            return SilentRamdisk()
        return real_agent(launch)

    simulator = Simulator(
        SimulatorOptions(
            machines=4,
            agent_factory=agent_factory,
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


async def node_of(env: dict[str, Any], index: int) -> dict[str, Any]:
    """The node of machine ``index`` (enrolled by an earlier test, or now), manageable."""
    status, node = await call(env, "GET", f"/v1/nodes/{env['sim'].machines[index].name}")
    return node if status == 200 else await enroll(env, index)


async def inspect(env: dict[str, Any], uuid: str, state: str) -> dict[str, Any]:
    await call(env, "PUT", f"/v1/nodes/{uuid}/states/provision", {"target": "inspect"}, expect=202)
    return await wait_state(env, uuid, state, timeout=120)


async def test_inspection_rules_run_on_the_inventory_and_their_changes_are_saved(env: dict[str, Any]) -> None:
    """Stored rules and the built-in one run after the inventory is applied, highest priority
    first; a rule applies only when all its conditions hold; what actions change is saved."""
    rules = InspectionRuleRepository(env["stack"].pool)
    node = await node_of(env, 0)
    machine = env["sim"].machines[0]
    stored: list[dict[str, Any]] = [
        {  # applies to this node only; reads the inventory, writes node, traits, capabilities, plugin data
            "uuid": "5b3e0a4e-0000-4000-8000-000000000001",
            "priority": 50,
            "conditions": [
                {"op": "eq", "args": {"values": ["{node.name}", machine.name]}},
                {"op": "eq", "args": {"values": ["{inventory[cpu][architecture]}", "x86_64"]}},
                {"op": "!is-empty", "args": {"value": "{inventory[interfaces]}"}},
            ],
            "actions": [
                {"op": "set-attribute", "args": {"path": "/extra/order", "value": "priority-50"}},
                {"op": "set-attribute", "args": {"path": "driver_info.cpu_count", "value": "{inventory[cpu][count]}"}},
                {"op": "set-capability", "args": {"name": "inspected", "value": "yes"}},
                {"op": "add-trait", "args": {"name": "CUSTOM_INSPECTED"}},
                {
                    "op": "set-plugin-data",
                    "args": {"path": "rules.first_mac", "value": "{inventory[interfaces][0][mac_address]}"},
                },
            ],
        },
        {  # lower priority: runs after, so its value of /extra/order is the one kept
            "uuid": "5b3e0a4e-0000-4000-8000-000000000002",
            "priority": 10,
            "conditions": [{"op": "eq", "args": {"values": ["{node.name}", machine.name]}}],
            "actions": [{"op": "set-attribute", "args": {"path": "/extra/order", "value": "priority-10"}}],
        },
        {  # a condition that does not hold: never applies
            "uuid": "5b3e0a4e-0000-4000-8000-000000000003",
            "priority": 90,
            "conditions": [{"op": "eq", "args": {"values": ["{inventory[cpu][architecture]}", "aarch64"]}}],
            "actions": [{"op": "add-trait", "args": {"name": "CUSTOM_NEVER"}}],
        },
    ]
    for rule in stored:
        await rules.create(rule)
    try:
        done = await inspect(env, node["uuid"], "manageable")
    finally:
        for rule in stored:
            await rules.delete(rule["uuid"])
    assert done["last_error"] is None
    assert done["extra"]["order"] == "priority-10"
    assert done["extra"]["inspected_by"] == "Ferrum agent"  # the built-in rule, interpolated
    assert done["driver_info"]["cpu_count"] == str(machine.hardware_facts().cpu_count)
    assert "inspected:yes" in done["properties"]["capabilities"].split(",")
    _, traits = await call(env, "GET", f"/v1/nodes/{node['uuid']}/traits", expect=200)
    assert "CUSTOM_INSPECTED" in traits["traits"] and "CUSTOM_NEVER" not in traits["traits"]
    row = await env["stack"].pool.fetchrow(
        "SELECT i.plugin_data::text AS plugin_data FROM node_inventory i JOIN nodes n ON n.id = i.node_id "
        "WHERE n.uuid = $1::uuid",
        node["uuid"],
    )
    assert json.loads(row["plugin_data"])["rules"] == {"first_mac": machine.macs[0]}
    async with env["session"].get(
        f"{env['api']}/v1/nodes/{node['uuid']}/history?detail=true", headers={"X-OpenStack-Ironic-API-Version": "1.78"}
    ) as response:
        assert response.status == 200, await response.text()
        history = await response.json()
    assert any(
        # highest priority first: the built-in rule (10000, named by its index), then 50, then 10
        "inspection rules applied: 00000000-0000-0000-0000-000000000000, "
        "5b3e0a4e-0000-4000-8000-000000000001, 5b3e0a4e-0000-4000-8000-000000000002" in event["event"]
        for event in history["history"]
    ), [e["event"] for e in history["history"]][-2:]


async def test_a_failing_rule_and_a_forbidden_change_fail_the_inspection(env: dict[str, Any]) -> None:
    rules = InspectionRuleRepository(env["stack"].pool)
    failing, forbidden = await node_of(env, 1), await node_of(env, 2)
    stored: list[dict[str, Any]] = [
        {
            "uuid": "5b3e0a4e-0000-4000-8000-000000000011",
            "conditions": [{"op": "eq", "args": {"values": ["{node.uuid}", failing["uuid"]]}}],
            "actions": [{"op": "fail", "args": {"msg": "machine {node.name} is on the deny list"}}],
        },
        {
            "uuid": "5b3e0a4e-0000-4000-8000-000000000012",
            "conditions": [{"op": "eq", "args": {"values": ["{node.uuid}", forbidden["uuid"]]}}],
            "actions": [{"op": "set-attribute", "args": {"path": "/provision_state", "value": "active"}}],
        },
    ]
    for rule in stored:
        await rules.create(rule)
    try:
        await call(env, "PUT", f"/v1/nodes/{failing['uuid']}/states/provision", {"target": "inspect"}, expect=202)
        refused = await inspect(env, forbidden["uuid"], "inspect failed")
        failed = await wait_state(env, failing["uuid"], "inspect failed", timeout=120)
    finally:
        for rule in stored:
            await rules.delete(rule["uuid"])
    assert "on the deny list" in failed["last_error"], failed["last_error"]
    assert failed["power_state"] == "power off"  # the ramdisk was powered off
    assert "Inspection rules cannot change the node's provision_state" in refused["last_error"], refused["last_error"]
    assert refused["extra"].get("order") == "built-in"  # what the allowed rules did is kept


async def test_a_ramdisk_that_dies_before_posting_hits_the_inspect_timeout(env: dict[str, Any]) -> None:
    node = await node_of(env, SILENT)
    await call(env, "PUT", f"/v1/nodes/{node['uuid']}/states/provision", {"target": "inspect"}, expect=202)
    await wait_state(env, node["uuid"], "inspect wait", timeout=60)
    failed = await wait_state(env, node["uuid"], "inspect failed", timeout=INSPECT_TIMEOUT + 60)
    assert failed["last_error"] == f"Timeout reached while waiting for the inventory of node {node['uuid']}"
    assert failed["power_state"] == "power off"  # the ramdisk is not left running
    assert failed["inspection_finished_at"] is None
    stored = await env["stack"].pool.fetchval(
        "SELECT count(*) FROM node_inventory i JOIN nodes n ON n.id = i.node_id WHERE n.uuid = $1::uuid", node["uuid"]
    )
    assert stored == 0  # nothing arrived, nothing was stored


async def test_the_inventory_is_served_at_181_and_not_below(env: dict[str, Any]) -> None:
    """GET /v1/nodes/{id}/inventory (1.81): what the inspection stored; 404 below 1.81 and
    for a node with nothing stored. 1.81 is not advertised yet: tests/labapi.py."""
    machine = env["sim"].machines[0]
    node = await node_of(env, 0)
    if node["inspection_finished_at"] is None:
        node = await inspect(env, node["uuid"], "manageable")
    silent = await node_of(env, SILENT)
    async with versioned_api(env["stack"], (1, 81)) as api:
        _, stored = await api.call((1, 81), "GET", f"/v1/nodes/{machine.name}/inventory", expect=200)
        assert [i["mac_address"] for i in stored["inventory"]["interfaces"]] == list(machine.macs)
        assert stored["plugin_data"]["boot_interface"] == machine.macs[0]
        status, _ = await api.call(min((1, 80), api.live_max), "GET", f"/v1/nodes/{node['uuid']}/inventory")
        assert status == 404
        status, body = await api.call((1, 81), "GET", f"/v1/nodes/{silent['uuid']}/inventory")
        assert status == 404
        assert f"Node inventory record for node {silent['uuid']} could not be found." in json.dumps(body)
        status, _ = await api.call((1, 81), "GET", "/v1/nodes/no-such-node/inventory")
        assert status == 404
