"""The ``redfish`` bios interface end to end (issue 21 item 4), over REST, on the
machine simulator's BMC (its Bios resource, attribute registry and pending
settings applied at power on):

- managing a node caches its BIOS settings, with the registry's details (1.74);
- manual cleaning with ``bios.apply_configuration`` stages the settings,
  reboots the machine, checks they took effect, caches them, and leaves the
  node off as it was; a value the BMC refuses fails cleaning with the BMC's
  message and changes nothing on the machine;
- a request the conductor can judge from the cache (an unknown or read-only
  setting, a malformed or mistyped ``settings``) is a 400 that lists the
  offered steps and changes nothing;
- servicing an ``active`` node (the ``service`` verb at 1.87, through the lab
  server until 1.87 is advertised): a setting the BIOS does not apply after
  the reboot leaves ``service failed`` naming it and the BMC's reason, abort
  returns to ``active``, and steps run in the requested order (a factory
  reset, then settings that need its defaults), the node running again.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from services.runtime import RunningStack
from services.simulator import Simulator, SimulatorOptions
from services.simulator.bios import REGISTRY
from tests.conftest import test_settings
from tests.labapi import VersionedApi, versioned_api

V = (1, 87)
USER, PASSWORD = "admin", "bios-secret"
OFFERED = "bios.apply_configuration (priority 0), bios.factory_reset (priority 0)"

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
async def env(database_url: str, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("bios")
    settings = test_settings(
        database_url,
        tmp / "state",
        conductor={
            "hostname": "bios-conductor",
            "redfish_poll_interval": 0.05,
            "redfish_power_timeout": 20.0,
            "redfish_bios_apply_timeout": 10.0,
        },
    )
    stack = RunningStack()
    await stack.start(settings, ["conductor", "api"])  # no boot or image service: the BIOS steps run out of band
    simulator = Simulator(
        SimulatorOptions(
            machines=4,
            state_dir=str(tmp / "machines"),
            disk_size=4 * 1024**2,
            username=USER,
            password=PASSWORD,
            boot_order=("Hdd",),
        )
    )
    await simulator.start()
    try:
        async with versioned_api(stack, V) as api:
            yield {"stack": stack, "sim": simulator, "api": api}
    finally:
        await stack.close()
        await simulator.stop()


def fault(body: dict[str, Any]) -> str:
    return str(json.loads(body["error_message"])["faultstring"])


async def wait_state(api: VersionedApi, uuid: str, wanted: str) -> dict[str, Any]:
    deadline = time.monotonic() + 60
    while True:
        _, node = await api.call(V, "GET", f"/v1/nodes/{uuid}", expect=200)
        if node["provision_state"] == wanted and node["reservation"] is None:
            return node
        assert time.monotonic() < deadline, (node["provision_state"], node["last_error"])
        await asyncio.sleep(0.05)


async def provision(api: VersionedApi, uuid: str, target: str, state: str, **body: Any) -> dict[str, Any]:
    await api.call(V, "PUT", f"/v1/nodes/{uuid}/states/provision", {"target": target, **body}, expect=202)
    return await wait_state(api, uuid, state)


async def managed_node(env: dict[str, Any], index: int) -> dict[str, Any]:
    sim: Simulator = env["sim"]
    body = {
        "name": f"bios-{index}",
        "driver": "redfish",
        "boot_interface": "fake",
        "deploy_interface": "fake",
        "driver_info": sim.driver_info(sim.machines[index]),
    }
    _, node = await env["api"].call(V, "POST", "/v1/nodes", body, expect=201)
    assert node["bios_interface"] == "redfish"  # the redfish hardware type's default, as in Ironic
    return await provision(env["api"], node["uuid"], "manage", "manageable")


async def cached(api: VersionedApi, uuid: str) -> dict[str, Any]:
    _, body = await api.call(V, "GET", f"/v1/nodes/{uuid}/bios?detail=true", expect=200)
    return {s["name"]: s for s in body["bios"]}


def apply_step(*settings: tuple[str, Any]) -> dict[str, Any]:
    return {
        "interface": "bios",
        "step": "apply_configuration",
        "args": {"settings": [{"name": n, "value": v} for n, v in settings]},
    }


async def test_manage_caches_and_manual_cleaning_applies_settings(env: dict[str, Any]) -> None:
    api, machine = env["api"], env["sim"].machines[0]
    node = await managed_node(env, 0)
    before = await cached(api, node["uuid"])
    assert sorted(before) == sorted(a.name for a in REGISTRY)
    assert before["ProcTurboMode"]["value"] == "Enabled"
    assert before["ProcTurboMode"]["allowable_values"] == ["Enabled", "Disabled"]
    assert before["AcPwrRcvryUserDelay"]["value"] == "60" and before["AcPwrRcvryUserDelay"]["upper_bound"] == 240
    assert before["SerialNumber"]["value"] == machine.disk_serial and before["SerialNumber"]["read_only"] is True
    boots = machine.boot_count

    step = apply_step(("ProcTurboMode", "Disabled"), ("AcPwrRcvryUserDelay", "120"), ("QuietBoot", "false"))
    done = await provision(api, node["uuid"], "clean", "manageable", clean_steps=[step])
    assert done["last_error"] is None and done["clean_step"] == {}
    after = await cached(api, node["uuid"])
    assert (after["ProcTurboMode"]["value"], after["AcPwrRcvryUserDelay"]["value"]) == ("Disabled", "120")
    assert after["QuietBoot"]["value"] == "False"
    assert after["LogicalProc"]["created_at"] == before["LogicalProc"]["created_at"]
    # The machine has them, applied by its firmware at the reboot the step asked for ...
    assert machine.bios.current["ProcTurboMode"] == "Disabled" and machine.bios.current["AcPwrRcvryUserDelay"] == 120
    assert machine.bios.current["QuietBoot"] is False and machine.bios.pending == {}
    applied = machine.events("bios_settings_applied")[-1]
    assert applied["applied"] == ["AcPwrRcvryUserDelay", "ProcTurboMode", "QuietBoot"] and applied["refused"] == []
    assert machine.boot_count == boots + 1
    # ... and the node is off again, as it was before the step.
    assert machine.power_state == "Off" and done["power_state"] == "power off"

    # Asking again for what the BIOS already has changes nothing and reboots nothing.
    await provision(api, node["uuid"], "clean", "manageable", clean_steps=[apply_step(("ProcTurboMode", "Disabled"))])
    assert machine.boot_count == boots + 1


async def test_a_value_the_bmc_refuses_fails_cleaning_with_its_message(env: dict[str, Any]) -> None:
    api, machine = env["api"], env["sim"].machines[1]
    node = await managed_node(env, 1)
    bios, boots = dict(machine.bios.current), machine.boot_count
    step = apply_step(("ProcTurboMode", "Sometimes"), ("AcPwrRcvryUserDelay", 500))
    await api.call(V, "PUT", f"/v1/nodes/{node['uuid']}/states/provision", {"target": "clean", "clean_steps": [step]})
    failed = await wait_state(api, node["uuid"], "clean failed")
    error = failed["last_error"]
    assert "Clean step bios.apply_configuration failed" in error, error
    assert "refused the BIOS settings" in error
    assert "'Sometimes' for the property ProcTurboMode is not in the list of acceptable values" in error
    assert "500 for the property AcPwrRcvryUserDelay is not in the supported range 60-240" in error
    assert failed["fault"] == "clean failure"
    assert machine.bios.current == bios and machine.bios.pending == {} and machine.boot_count == boots


@pytest.mark.parametrize(
    ("steps", "words"),
    [
        (
            [apply_step(("TurboBoost", "Off"))],
            "the node's BIOS has no setting TurboBoost (its settings: AcPwrRcvryUserDelay",
        ),
        ([apply_step(("SerialNumber", "X1"))], "the BIOS settings SerialNumber are read-only"),
        (
            [{"interface": "bios", "step": "apply_configuration", "args": {"settings": "ProcTurboMode=Disabled"}}],
            "argument settings must be of type array, not str",
        ),
        (
            [{"interface": "bios", "step": "apply_configuration", "args": {"settings": [{"name": "ProcTurboMode"}]}}],
            'settings item 1 must be an object with exactly "name" and "value"',
        ),
        ([apply_step(("ProcTurboMode", None))], "settings item 1 (ProcTurboMode): value must be a string"),
        ([{"interface": "bios", "step": "apply_configuration"}], "missing required arguments settings"),
        ([{"interface": "bios", "step": "factory_reset", "args": {"hard": True}}], "unexpected arguments hard"),
        ([{"interface": "bios", "step": "update_firmware"}], "no interface of the node offers this clean step"),
    ],
)
async def test_bad_bios_steps_are_refused_listing_the_offered_steps(
    env: dict[str, Any], steps: list[dict[str, Any]], words: str
) -> None:
    api = env["api"]
    _, existing = await api.call(V, "GET", "/v1/nodes/bios-2")
    node = existing if "uuid" in existing else await managed_node(env, 2)
    status, body = await api.call(
        V, "PUT", f"/v1/nodes/{node['uuid']}/states/provision", {"target": "clean", "clean_steps": steps}
    )
    assert status == 400, body
    assert words in fault(body), fault(body)
    assert OFFERED in fault(body)
    _, after = await api.call(V, "GET", f"/v1/nodes/{node['uuid']}", expect=200)
    assert after["provision_state"] == "manageable" and after["last_error"] is None
    assert after["driver_internal_info"] == node["driver_internal_info"]


async def test_servicing_an_active_node(env: dict[str, Any]) -> None:
    api, machine = env["api"], env["sim"].machines[3]
    node = await managed_node(env, 3)
    uuid = node["uuid"]
    await provision(api, uuid, "provide", "available")
    await provision(api, uuid, "active", "active")
    await api.call(V, "PUT", f"/v1/nodes/{uuid}/states/power", {"target": "power on"}, expect=202)
    deadline = time.monotonic() + 30
    while machine.power_state != "On":
        assert time.monotonic() < deadline
        await asyncio.sleep(0.05)
    await wait_state(api, uuid, "active")

    # Bios boot mode is staged with SecureBoot, which needs UEFI: the BIOS applies one, not the other.
    await api.call(
        V,
        "PUT",
        f"/v1/nodes/{uuid}/states/provision",
        {"target": "service", "service_steps": [apply_step(("BootMode", "Bios"), ("SecureBoot", "Enabled"))]},
        expect=202,
    )
    failed = await wait_state(api, uuid, "service failed")
    error = failed["last_error"]
    assert "Service step bios.apply_configuration failed" in error, error
    assert "SecureBoot='Enabled' did not take effect" in error
    assert "SecureBoot can be Enabled only while BootMode is Uefi" in error
    assert machine.bios.current["BootMode"] == "Bios" and machine.bios.current["SecureBoot"] == "Disabled"
    assert (await cached(api, uuid))["BootMode"]["value"] == "Uefi"  # cached only when a step succeeds
    # Abort from service failed: back to active, and the step's error gives way to the abort's (Ironic).
    await api.call(V, "PUT", f"/v1/nodes/{uuid}/maintenance", {"reason": "checking"}, expect=202)
    _, refused = await api.call(V, "PUT", f"/v1/nodes/{uuid}/states/provision", {"target": "abort"}, expect=409)
    assert "while it is in maintenance mode" in fault(refused)
    await api.call(V, "DELETE", f"/v1/nodes/{uuid}/maintenance", expect=202)
    aborted = await provision(api, uuid, "abort", "active")
    assert aborted["service_step"] == {}
    for _ in range(100):
        _, node = await api.call(V, "GET", f"/v1/nodes/{uuid}", expect=200)
        if node["last_error"] != error:
            break
        await asyncio.sleep(0.05)
    assert node["last_error"].startswith("By request, the service operation was aborted"), node["last_error"]

    # In order: the factory reset brings UEFI back, so SecureBoot can be enabled after it.
    steps = [{"interface": "bios", "step": "factory_reset"}, apply_step(("SecureBoot", "Enabled"))]
    boots = machine.boot_count
    done = await provision(api, uuid, "service", "active", service_steps=steps)
    assert done["last_error"] is None and done["service_step"] == {}
    assert machine.bios.current["BootMode"] == "Uefi" and machine.bios.current["SecureBoot"] == "Enabled"
    assert machine.boot_count == boots + 2 and machine.power_state == "On" and done["power_state"] == "power on"
    after = await cached(api, uuid)
    assert (after["BootMode"]["value"], after["SecureBoot"]["value"]) == ("Uefi", "Enabled")
    rows = await env["stack"].pool.fetch(
        "SELECT h.event FROM node_history h JOIN nodes n ON n.id = h.node_id WHERE n.uuid = $1::uuid ORDER BY h.id",
        uuid,
    )
    started = [r["event"] for r in rows if r["event"].startswith("service step") and r["event"].endswith("started")]
    assert started[-2:] == ["service step bios.factory_reset started", "service step bios.apply_configuration started"]
