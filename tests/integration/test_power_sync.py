"""The conductor's power sync against simulated Redfish BMCs: drift is
recorded, BMCs are asked in parallel, a BMC that keeps failing puts its node
into maintenance with fault ``power failure`` after
``power_state_sync_max_retries`` syncs, and the first good read takes it out."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from services.conductor.periodic import PeriodicWork
from services.runtime import ALL_SERVICES_ORDER, RunningStack
from services.simulator.options import SimulatorOptions
from services.simulator.service import Simulator
from tests.conftest import test_settings
from tests.restclient import call, wait_state

USER, PASSWORD = "admin", "sync-secret"


@pytest.fixture(scope="module")
async def env(database_url: str, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("power-sync")
    settings = test_settings(
        database_url,
        tmp / "state",
        conductor={"hostname": "sync-conductor", "power_state_sync_max_retries": 2, "redfish_request_timeout": 5.0},
    )
    stack = RunningStack()
    await stack.start(settings, list(ALL_SERVICES_ORDER))
    simulator = Simulator(
        SimulatorOptions(
            machines=3, state_dir=str(tmp / "machines"), username=USER, password=PASSWORD, disk_size="8MiB"
        ).validate()
    )
    await simulator.start()
    conductor: Any = next(s for s in stack.services if s.name == "conductor")
    session = aiohttp.ClientSession()
    try:
        yield {
            "stack": stack,
            "sim": simulator,
            "session": session,
            "api": stack.endpoints["api REST (Ironic v1)"],
            "periodic": PeriodicWork(conductor.manager, registration={}),
        }
    finally:
        await session.close()
        await stack.close()
        await simulator.stop()


async def enroll(env: dict[str, Any], index: int) -> str:
    machine = env["sim"].machines[index]
    body = {"name": machine.name, "driver": "redfish", "driver_info": env["sim"].driver_info(machine)}
    _, node = await call(env, "POST", "/v1/nodes", body, expect=201)
    await call(env, "PUT", f"/v1/nodes/{node['uuid']}/states/provision", {"target": "manage"}, expect=202)
    await wait_state(env, node["uuid"], "manageable")
    return str(node["uuid"])


async def test_drift_is_recorded_and_a_failing_bmc_goes_into_maintenance_and_back(env: dict[str, Any]) -> None:
    nodes = [await enroll(env, i) for i in range(3)]
    sim, periodic = env["sim"], env["periodic"]
    await sim.machines[1].power_on()  # changed outside Ferrum
    assert await periodic.sync_power_states() >= 1
    _, node = await call(env, "GET", f"/v1/nodes/{nodes[1]}", expect=200)
    assert node["power_state"] == "power on"

    # A wrong password: every read fails. Below the limit nothing changes; at it, maintenance.
    bad = {"op": "replace", "path": "/driver_info/redfish_password", "value": "wrong-password"}
    await call(env, "PATCH", f"/v1/nodes/{nodes[2]}", [bad], expect=200)
    await periodic.sync_power_states()
    _, node = await call(env, "GET", f"/v1/nodes/{nodes[2]}", expect=200)
    assert node["maintenance"] is False and node["fault"] is None
    await periodic.sync_power_states()
    _, node = await call(env, "GET", f"/v1/nodes/{nodes[2]}", expect=200)
    assert node["maintenance"] is True and node["fault"] == "power failure", node
    assert "max retries exceeded" in node["maintenance_reason"]
    for other in (nodes[0], nodes[1]):  # the other BMCs were not held up by the failing one
        _, fine = await call(env, "GET", f"/v1/nodes/{other}", expect=200)
        assert fine["maintenance"] is False

    # The BMC answers again: the next sync takes the node out of maintenance on its own.
    good = {"op": "replace", "path": "/driver_info/redfish_password", "value": PASSWORD}
    await call(env, "PATCH", f"/v1/nodes/{nodes[2]}", [good], expect=200)
    await periodic.sync_power_states()
    _, node = await call(env, "GET", f"/v1/nodes/{nodes[2]}", expect=200)
    assert node["maintenance"] is False and node["fault"] is None and node["maintenance_reason"] is None
    assert node["power_state"] == "power off"


async def test_power_sync_records_the_redfish_health_shown_from_1_109(env: dict[str, Any]) -> None:
    """Ironic's 1.109: power sync reads the System's Status.Health into the node's ``health``
    and notes a change in the history; fake hardware has no health to report."""
    sim, periodic = env["sim"], env["periodic"]
    status, enrolled = await call(env, "GET", f"/v1/nodes/{sim.machines[0].name}")
    node_uuid = enrolled["uuid"] if status == 200 else await enroll(env, 0)  # the test above enrolls it too
    v109 = {"X-OpenStack-Ironic-API-Version": "1.109"}

    async def health() -> Any:
        async with env["session"].get(f"{env['api']}/v1/nodes/{node_uuid}?fields=health", headers=v109) as r:
            return (await r.json())["health"]

    await periodic.sync_power_states()
    assert await health() == "OK"
    sim.machines[0].health = "Critical"
    await periodic.sync_power_states()
    assert await health() == "Critical"
    async with env["session"].get(
        f"{env['api']}/v1/nodes/{node_uuid}/history", headers={"X-OpenStack-Ironic-API-Version": "1.78"}
    ) as r:
        events = [e["event"] for e in (await r.json())["history"]]
    assert "health changed: OK -> Critical" in events
    _, node = await call(env, "GET", f"/v1/nodes/{node_uuid}", expect=200)  # 1.56: no such field
    assert "health" not in node
    sim.machines[0].health = "OK"
