"""RAID over REST (API 1.12, issue 22 item 2), against one live in-process
stack whose conductor enables the ``fake`` and ``agent`` raid interfaces:

- ``PUT /v1/nodes/{id}/states/raid`` checks the body against Ironic's RAID
  schema through the node's raid interface and stores ``target_raid_config``
  (204); a refused config is a 400 that changes nothing; a ``no-raid`` node
  answers 404 as Ironic does; ``{}`` clears; 406 below 1.12;
- ``GET /v1/drivers/{d}/raid/logical_disk_properties`` (and without ``/v1``);
- manual cleaning with ``raid.create_configuration`` on fake hardware records
  ``raid_config``, its arguments leave root or other disks out, and
  ``raid.delete_configuration`` clears it;
- the ``agent`` raid interface offers only what the booted agent reports:
  Ferrum's agent has no RAID, so the step is refused before anything runs.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from services.conductor.drivers import agent_steps
from services.conductor.drivers.agent_raid import AgentRAID
from services.runtime import RunningStack
from tests.conftest import test_settings
from tests.support.node_records import node_record

V = "1.78"
ROOT = {"raid_level": "1", "size_gb": 100, "is_root_volume": True, "volume_name": "root"}
DATA = {"raid_level": "5", "size_gb": "MAX", "controller": "RAID.Integrated.1-1", "physical_disks": ["a", "b", "c"]}
TARGET = {"logical_disks": [ROOT, DATA]}

pytestmark = pytest.mark.timeout(60)


class Client:
    def __init__(self, session: aiohttp.ClientSession, base: str) -> None:
        self.session, self.base = session, base

    async def call(self, method: str, path: str, body: Any = None, *, version: str = V) -> tuple[int, Any]:
        headers = {"X-OpenStack-Ironic-API-Version": version}
        async with self.session.request(method, self.base + path, json=body, headers=headers) as r:
            text = await r.text()
            return r.status, (json.loads(text) if text else None)

    async def refused(self, status: int, method: str, path: str, body: Any = None, *, version: str = V) -> str:
        got, reply = await self.call(method, path, body, version=version)
        assert got == status, (method, path, got, reply)
        return str(json.loads(reply["error_message"])["faultstring"])

    async def node(self, ident: str) -> dict[str, Any]:
        status, node = await self.call("GET", f"/v1/nodes/{ident}")
        assert status == 200, node
        return node

    async def settle(self, ident: str, state: str) -> dict[str, Any]:
        deadline = time.monotonic() + 10
        while True:
            node = await self.node(ident)
            settled = node["target_provision_state"] is None or node["provision_state"].endswith("failed")
            if settled and node["reservation"] is None:
                assert node["provision_state"] == state, (node["provision_state"], node["last_error"])
                return node
            assert time.monotonic() < deadline, node
            await asyncio.sleep(0.02)

    async def manageable(self, name: str, **fields: Any) -> dict[str, Any]:
        status, node = await self.call("POST", "/v1/nodes", {"driver": "fake-hardware", "name": name, **fields})
        assert status == 201, node
        status, reply = await self.call("PUT", f"/v1/nodes/{name}/states/provision", {"target": "manage"})
        assert status == 202, reply
        return await self.settle(name, "manageable")

    async def clean(self, name: str, *steps: dict[str, Any]) -> tuple[int, Any]:
        body = {"target": "clean", "clean_steps": list(steps)}
        return await self.call("PUT", f"/v1/nodes/{name}/states/provision", body)


@pytest.fixture(scope="module")
async def api(database_url: str, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Client]:
    settings = test_settings(
        database_url,
        tmp_path_factory.mktemp("raid"),
        conductor={"hostname": "raid-conductor", "enabled_raid_interfaces": ("no-raid", "fake", "agent")},
    )
    stack = RunningStack()
    await stack.start(settings, ["conductor", "api"])
    try:
        async with aiohttp.ClientSession() as session:
            yield Client(session, stack.endpoints["api REST (Ironic v1)"])
    finally:
        await stack.close()


async def test_target_raid_config_is_checked_and_stored(api: Client) -> None:
    await api.manageable("raid-target", raid_interface="fake")
    path = "/v1/nodes/raid-target/states/raid"
    status, body = await api.call("PUT", path, TARGET)
    assert (status, body) == (204, None)
    assert (await api.node("raid-target"))["target_raid_config"] == TARGET
    status, states_doc = await api.call("GET", "/v1/nodes/raid-target/states")
    assert status == 200 and states_doc["target_raid_config"] == TARGET and states_doc["raid_config"] == {}
    status, old_doc = await api.call("GET", "/v1/nodes/raid-target/states", version="1.11")
    assert status == 200 and "target_raid_config" not in old_doc
    # Only this endpoint sets it: a PATCH is refused as for any internal attribute (Ironic alike).
    ops = [{"op": "replace", "path": "/target_raid_config", "value": {}}]
    assert "internal attribute" in await api.refused(400, "PATCH", "/v1/nodes/raid-target", ops)
    bad = {
        "no logical_disks": ({}, None),
        "empty list": ({"logical_disks": []}, "non-empty"),
        "unknown level": ({"logical_disks": [{"raid_level": "7", "size_gb": 1}]}, "'7' is not one of"),
        "size missing": ({"logical_disks": [{"raid_level": "1"}]}, "'size_gb' is a required property"),
        "negative size": ({"logical_disks": [{"raid_level": "1", "size_gb": -1}]}, "size_gb"),
        "size not MAX": ({"logical_disks": [{"raid_level": "1", "size_gb": "ALL"}]}, "size_gb"),
        "unknown key": ({"logical_disks": [{**ROOT, "colour": "red"}]}, "'colour' unexpected"),
        "top-level key": ({**TARGET, "x": 1}, "'x' unexpected"),
        "disks without controller": (
            {"logical_disks": [{"raid_level": "1", "size_gb": 1, "physical_disks": ["a"]}]},
            "'controller' is a dependency of 'physical_disks'",
        ),
        "two roots": ({"logical_disks": [ROOT, ROOT]}, "more than one root volume"),
        "not a boolean": ({"logical_disks": [{**ROOT, "is_root_volume": "yes"}]}, "is_root_volume"),
        "not an object": ([ROOT], "not a JSON object"),
    }
    for case, (config, words) in bad.items():
        if words is None:
            # {} is no error: it clears the target (below)
            continue
        message = await api.refused(400, "PUT", path, config)
        assert words in message, (case, message)
        assert (await api.node("raid-target"))["target_raid_config"] == TARGET, case
    # Below 1.12 the endpoint does not exist yet: 406, as Ironic; an unknown node is 404.
    assert "1.12" in await api.refused(406, "PUT", path, {}, version="1.11")
    await api.refused(404, "PUT", "/v1/nodes/no-such-node/states/raid", TARGET)
    assert (await api.call("PUT", path, {}))[0] == 204
    assert (await api.node("raid-target"))["target_raid_config"] == {}


async def test_no_raid_refuses_a_target_but_may_clear_one(api: Client) -> None:
    await api.manageable("raid-none", raid_interface="no-raid")
    message = await api.refused(404, "PUT", "/v1/nodes/raid-none/states/raid", TARGET)
    assert "no-raid" in message and "RAID" in message, message
    assert (await api.node("raid-none"))["target_raid_config"] == {}
    assert (await api.call("PUT", "/v1/nodes/raid-none/states/raid", {}))[0] == 204


async def test_logical_disk_properties(api: Client) -> None:
    status, props = await api.call("GET", "/v1/drivers/fake-hardware/raid/logical_disk_properties")
    assert status == 200, props
    assert set(props) == {
        "raid_level",
        "size_gb",
        "volume_name",
        "is_root_volume",
        "share_physical_disks",
        "disk_type",
        "interface_type",
        "number_of_physical_disks",
        "controller",
        "physical_disks",
    }
    assert "'MAX'" in props["size_gb"] and "Required." in props["raid_level"]
    status, alias = await api.call("GET", "/drivers/fake-hardware/raid/logical_disk_properties")
    assert (status, alias) == (200, props)
    await api.refused(406, "GET", "/v1/drivers/fake-hardware/raid/logical_disk_properties", version="1.11")
    await api.refused(404, "GET", "/v1/drivers/no-such-driver/raid/logical_disk_properties")


async def test_manual_cleaning_builds_and_deletes_the_configuration(api: Client) -> None:
    await api.manageable("raid-clean", raid_interface="fake", properties={"capabilities": "boot_mode:uefi"})
    # No target yet: the step fails cleaning, naming the missing target.
    assert (await api.clean("raid-clean", {"interface": "raid", "step": "create_configuration"}))[0] == 202
    failed = await api.settle("raid-clean", "clean failed")
    assert "has no target RAID configuration" in failed["last_error"], failed["last_error"]
    await api.call("PATCH", "/v1/nodes/raid-clean", [{"op": "replace", "path": "/maintenance", "value": False}])
    assert (await api.call("PUT", "/v1/nodes/raid-clean/states/provision", {"target": "manage"}))[0] == 202
    await api.settle("raid-clean", "manageable")

    assert (await api.call("PUT", "/v1/nodes/raid-clean/states/raid", TARGET))[0] == 204
    assert (await api.clean("raid-clean", {"interface": "raid", "step": "create_configuration"}))[0] == 202
    node = await api.settle("raid-clean", "manageable")
    assert node["raid_config"]["logical_disks"] == TARGET["logical_disks"], node["raid_config"]
    assert node["raid_config"]["last_updated"], node["raid_config"]
    # As Ironic's update_raid_info: the root volume sizes the disk and is a capability.
    assert node["properties"] == {"capabilities": "boot_mode:uefi,raid_level:1", "local_gb": 100}, node["properties"]

    only_root = {"interface": "raid", "step": "create_configuration", "args": {"create_nonroot_volumes": False}}
    assert (await api.clean("raid-clean", only_root))[0] == 202
    node = await api.settle("raid-clean", "manageable")
    assert node["raid_config"]["logical_disks"] == [ROOT], node["raid_config"]

    wrong_type = {"interface": "raid", "step": "create_configuration", "args": {"create_root_volume": "no"}}
    assert "must be of type boolean" in await api.refused(
        400, "PUT", "/v1/nodes/raid-clean/states/provision", {"target": "clean", "clean_steps": [wrong_type]}
    )

    assert (await api.clean("raid-clean", {"interface": "raid", "step": "delete_configuration"}))[0] == 202
    node = await api.settle("raid-clean", "manageable")
    assert node["raid_config"] == {} and node["target_raid_config"] == TARGET


async def test_agent_raid_offers_only_what_the_agent_reports(api: Client) -> None:
    await api.manageable("raid-agent", raid_interface="agent", deploy_interface="direct")
    assert (await api.call("PUT", "/v1/nodes/raid-agent/states/raid", TARGET))[0] == 204
    message = await api.refused(
        400,
        "PUT",
        "/v1/nodes/raid-agent/states/provision",
        {"target": "clean", "clean_steps": [{"interface": "raid", "step": "create_configuration"}]},
    )
    assert "raid.create_configuration" in message and "no interface of the node offers" in message, message
    assert (await api.node("raid-agent"))["provision_state"] == "manageable"


def test_agent_raid_steps_come_from_the_agents_report() -> None:
    """What a booted agent reported (IPA's software RAID) is what the agent raid interface
    offers, run in the ramdisk; the deploy interface no longer claims those steps."""
    from services.conductor.drivers.base import Task

    reported = {"interface": "raid", "step": "create_configuration", "priority": 0}
    erase = {"interface": "deploy", "step": "erase_devices", "priority": 10}
    node = node_record(
        uuid="n", driver_internal_info={agent_steps.CACHED_STEPS: {"raid": [reported], "deploy": [erase]}}
    )
    task = Task(node=node, ports=[], driver=None, conductor="c")  # type: ignore[arg-type]  # no driver: only the node is read
    assert AgentRAID().get_clean_steps(task) == [{**reported, "requires_ramdisk": True, "argsinfo": None}]
    task.node = node_record(uuid="n")
    assert AgentRAID().get_clean_steps(task) == []


async def test_the_agents_raid_result_becomes_raid_config() -> None:
    """After the agent ran a RAID step: what it reports building is recorded (Ironic's post-step
    hook), a delete empties raid_config, and a create without a result fails the step."""
    from services.common import errors
    from services.conductor.drivers.base import Task

    built = {"logical_disks": [ROOT]}
    done = {"command_status": "SUCCEEDED", "command_result": {"clean_result": built}}
    step = {"interface": "raid", "step": "create_configuration"}
    task = Task(node=node_record(uuid="n", clean_step=step), ports=[], driver=None, conductor="c")  # type: ignore[arg-type]  # no driver: only the node is read
    await agent_steps._record_raid_result(task, done)
    assert task.node["raid_config"]["logical_disks"] == [ROOT] and task.node["raid_config"]["last_updated"]
    with pytest.raises(errors.AgentError, match="sent no RAID configuration"):
        await agent_steps._record_raid_result(task, {"command_status": "SUCCEEDED", "command_result": {}})
    task.node = {**task.node, "clean_step": {"interface": "raid", "step": "delete_configuration"}}
    await agent_steps._record_raid_result(task, {"command_status": "SUCCEEDED"})
    assert task.node["raid_config"] == {}
    task.node = {**task.node, "clean_step": {"interface": "deploy", "step": "erase_devices"}, "raid_config": built}
    await agent_steps._record_raid_result(task, done)
    assert task.node["raid_config"] == built


async def test_python_ironicclient_sets_and_reads_raid(api: Client) -> None:
    """The unmodified client's RAID calls: set the target, list the logical disk properties."""
    from ironicclient import client as ironic
    from ironicclient.common.apiclient import exceptions as ironic_errors

    await api.manageable("raid-client", raid_interface="fake")

    def run() -> dict[str, str]:
        bm = ironic.get_client("1", endpoint=api.base, auth_type="none", os_ironic_api_version="1.78")
        bm.node.set_target_raid_config("raid-client", TARGET)
        with pytest.raises(ironic_errors.BadRequest, match="RAID config validation error"):
            bm.node.set_target_raid_config("raid-client", {"logical_disks": [{"raid_level": "9", "size_gb": 1}]})
        return bm.driver.raid_logical_disk_properties("fake-hardware")

    props = await asyncio.to_thread(run)
    assert props["raid_level"].startswith("RAID level") and "controller" in props
    assert (await api.node("raid-client"))["target_raid_config"] == TARGET
