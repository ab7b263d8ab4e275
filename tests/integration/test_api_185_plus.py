"""Microversions 1.85 to 1.95, and 1.114, over real REST: each at its
version and, where behaviour differs, one below it (as Ironic refuses it).

Requests at a version the live api advertises go to it; requests above go to
a lab server made of the same handlers (tests/labapi.py), so these tests
hold whatever the advertised maximum is. One stack for the module; fake
hardware except where the Redfish simulator is the point (firmware, vmedia).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from ferrum.v1 import api_pb2 as pb
from ferrum.v1 import api_pb2_grpc as pb_grpc
from services.simulator.options import SimulatorOptions
from services.simulator.service import Simulator
from tests.fileserver import serving_files
from tests.labapi import VersionedApi, versioned_api

CEILING = (1, 114)
OLD = (1, 78)


@pytest.fixture(scope="module")
async def api(sim: Simulator, stack: Any) -> AsyncIterator[VersionedApi]:
    # The simulator first: it outlives the stack, whose Redfish sessions log out of it at close.
    async with versioned_api(stack, CEILING) as api:
        yield api


def fault(body: dict[str, Any]) -> str:
    return str(json.loads(body["error_message"])["faultstring"])


async def new_node(api: VersionedApi, name: str, **fields: Any) -> dict[str, Any]:
    _, node = await api.call(OLD, "POST", "/v1/nodes", {"driver": "fake-hardware", "name": name, **fields}, expect=201)
    return node


async def wait_state(api: VersionedApi, ident: str, state: str, timeout: float = 30) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        _, node = await api.call((1, 87), "GET", f"/v1/nodes/{ident}", expect=200)
        if node["provision_state"] == state and node["reservation"] is None and not node["target_power_state"]:
            return node
        assert time.monotonic() < deadline, f"{ident}: {node['provision_state']} ({node['last_error']})"
        await asyncio.sleep(0.03)


async def provision(api: VersionedApi, ident: str, body: dict[str, Any], state: str, version=OLD) -> dict[str, Any]:
    await api.call(version, "PUT", f"/v1/nodes/{ident}/states/provision", body, expect=202)
    return await wait_state(api, ident, state)


async def manageable_node(api: VersionedApi, name: str, **fields: Any) -> dict[str, Any]:
    await new_node(api, name, **fields)
    return await provision(api, name, {"target": "manage"}, "manageable")


async def active_node(api: VersionedApi, name: str, **fields: Any) -> dict[str, Any]:
    await manageable_node(api, name, **fields)
    await provision(api, name, {"target": "provide"}, "available")
    return await provision(api, name, {"target": "active"}, "active")


# -- 1.85: hold steps and unhold ---------------------------------------------------------------------


async def test_clean_hold_and_unhold_from_1_85(api: VersionedApi) -> None:
    v84, v85 = (1, 84), (1, 85)
    await manageable_node(api, "h-clean")
    await api.call(OLD, "PUT", "/v1/nodes/h-clean/states/power", {"target": "power on"}, expect=202)
    await wait_state(api, "h-clean", "manageable")
    steps = [
        {"interface": "deploy", "step": "erase_devices_metadata"},
        {"interface": "deploy", "step": "hold"},
        {"interface": "power", "step": "power_off"},
    ]
    held = await provision(api, "h-clean", {"target": "clean", "clean_steps": steps}, "clean hold")
    assert held["target_provision_state"] == "manageable"
    assert held["clean_step"]["step"] == "hold" and held["power_state"] == "power on"
    # unhold is checked against the state first: 406 where it applies, 400 where it does not.
    status, body = await api.call(v84, "PUT", "/v1/nodes/h-clean/states/provision", {"target": "unhold"})
    assert status == 406, body
    other = await manageable_node(api, "h-other")
    status, body = await api.call(v85, "PUT", f"/v1/nodes/{other['uuid']}/states/provision", {"target": "unhold"})
    assert status == 400 and "can not be performed" in fault(body), body
    # The steps after the hold run once released: the node powers off and cleaning ends.
    done = await provision(api, "h-clean", {"target": "unhold"}, "manageable", version=v85)
    assert done["power_state"] == "power off" and done["clean_step"] == {} and done["last_error"] is None
    # A reserved step takes no arguments; wait is not run by Ferrum.
    for bad in ({"interface": "deploy", "step": "hold", "args": {"x": 1}}, {"interface": "deploy", "step": "wait"}):
        status, body = await api.call(
            v85, "PUT", "/v1/nodes/h-other/states/provision", {"target": "clean", "clean_steps": [bad]}
        )
        assert status == 400, body
    _, still = await api.call(v85, "GET", "/v1/nodes/h-other", expect=200)
    assert still["provision_state"] == "manageable"


async def test_deploy_and_service_hold_from_1_85(api: VersionedApi) -> None:
    v85, v87 = (1, 85), (1, 87)
    await manageable_node(api, "h-deploy")
    await provision(api, "h-deploy", {"target": "provide"}, "available")
    hold = {"interface": "deploy", "step": "hold", "priority": 150, "args": {}}
    late = {**hold, "priority": 50}
    status, body = await api.call(
        v85, "PUT", "/v1/nodes/h-deploy/states/provision", {"target": "active", "deploy_steps": [late]}
    )
    assert status == 400 and "before deploy.deploy" in fault(body), body
    held = await provision(api, "h-deploy", {"target": "active", "deploy_steps": [hold]}, "deploy hold")
    assert held["target_provision_state"] == "active" and held["deploy_step"]["step"] == "hold"
    active = await provision(api, "h-deploy", {"target": "unhold"}, "active", version=v85)
    assert active["deploy_step"] == {}

    # Servicing (1.87) holds in service hold; abort there returns the node to active.
    steps = [{"interface": "deploy", "step": "hold"}, {"interface": "power", "step": "power_off"}]
    body = {"target": "service", "service_steps": steps}
    held = await provision(api, "h-deploy", body, "service hold", version=v87)
    assert held["service_step"]["step"] == "hold"
    released = await provision(api, "h-deploy", {"target": "unhold"}, "active", version=v87)
    assert released["power_state"] == "power off" and released["service_step"] == {}
    await provision(api, "h-deploy", body, "service hold", version=v87)
    aborted = await provision(api, "h-deploy", {"target": "abort"}, "active", version=v87)
    assert "aborted" in aborted["last_error"]


# -- 1.86: firmware_interface and firmware components (1.114: their identity) ------------------------


@pytest.fixture(scope="module")
async def sim(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Simulator]:
    simulator = Simulator(
        SimulatorOptions(
            machines=2, state_dir=str(tmp_path_factory.mktemp("machines")), disk_size="8MiB", nics_per_machine=2
        ).validate()
    )
    await simulator.start()
    try:
        yield simulator
    finally:
        await simulator.stop()


async def test_firmware_interface_and_components_from_1_86(api: VersionedApi, sim: Simulator) -> None:
    v85, v86, v114 = (1, 85), (1, 86), (1, 114)
    body: dict[str, Any] = {"driver": "fake-hardware", "name": "fw-old", "firmware_interface": "no-firmware"}
    status, _ = await api.call(v85, "POST", "/v1/nodes", body)
    assert status == 406
    old = await new_node(api, "fw-old")
    assert "firmware_interface" not in old
    status, _ = await api.call(v85, "GET", "/v1/nodes/fw-old/firmware")
    assert status == 404
    _, drivers = await api.call(v85, "GET", "/v1/drivers?detail=True", expect=200)
    assert "enabled_firmware_interfaces" not in drivers["drivers"][0]

    _, node = await api.call(v86, "GET", "/v1/nodes/fw-old", expect=200)
    assert node["firmware_interface"] == "no-firmware"  # the default, as Ironic's
    _, node = await api.call(
        v86,
        "PATCH",
        "/v1/nodes/fw-old",
        [{"op": "replace", "path": "/firmware_interface", "value": "fake"}],
        expect=200,
    )
    assert node["firmware_interface"] == "fake"
    status, body = await api.call(
        v86, "PATCH", "/v1/nodes/fw-old", [{"op": "replace", "path": "/firmware_interface", "value": "bogus"}]
    )
    assert status == 400, body
    _, listed = await api.call(v86, "GET", "/v1/nodes/fw-old/firmware", expect=200)
    assert listed == {"firmware": []}
    _, drivers = await api.call(v86, "GET", "/v1/drivers?detail=True", expect=200)
    fake = next(d for d in drivers["drivers"] if d["name"] == "fake-hardware")
    assert fake["default_firmware_interface"] == "no-firmware"
    assert {"no-firmware", "fake", "redfish"} <= set(fake["enabled_firmware_interfaces"])
    redfish = next(d for d in drivers["drivers"] if d["name"] == "redfish")
    assert redfish["enabled_firmware_interfaces"] == ["no-firmware", "redfish"]

    # A Redfish node reads bios, bmc and its NICs (the simulator's FirmwareInventory) when verified.
    machine = sim.machines[0]
    body = {
        "driver": "redfish",
        "name": "fw-redfish",
        "driver_info": sim.driver_info(machine),
        "firmware_interface": "redfish",
        "boot_interface": "fake",
        "deploy_interface": "fake",
    }
    await api.call(v86, "POST", "/v1/nodes", body, expect=201)
    await provision(api, "fw-redfish", {"target": "manage"}, "manageable")
    _, listed = await api.call(v86, "GET", "/v1/nodes/fw-redfish/firmware", expect=200)
    found = {c["component"]: c for c in listed["firmware"]}
    serial = f"SIM{machine.uuid[:8].upper()}N"
    assert set(found) == {"bios", "bmc", f"nic:{serial}0", f"nic:{serial}1"}, listed
    assert found["bios"]["current_version"] == found["bios"]["initial_version"] == "ferrum-sim-1"
    assert found["bmc"]["current_version"] == "1.0" and found["bmc"]["last_version_flashed"] is None
    assert found[f"nic:{serial}1"]["current_version"] == "22.5.1" and found["bios"]["created_at"]
    assert "vendor" not in found["bmc"]
    status, body = await api.call(v86, "GET", "/v1/nodes/fw-redfish/firmware?fields=component,vendor")
    assert status == 400 and "1.114" in fault(body), body

    # 1.114: vendor, model and serial_number (bios: none of them; bmc: its model; NICs: all three).
    _, listed = await api.call(v114, "GET", "/v1/nodes/fw-redfish/firmware", expect=200)
    found = {c["component"]: c for c in listed["firmware"]}
    assert (found["bios"]["vendor"], found["bios"]["model"], found["bios"]["serial_number"]) == (None, None, None)
    assert found["bmc"]["model"] == "Ferrum simulated BMC" and found["bmc"]["vendor"] is None
    nic = found[f"nic:{serial}0"]
    assert (nic["vendor"], nic["model"], nic["serial_number"]) == ("Ferrum", "Simulated 10GbE NIC", f"{serial}0")
    _, picked = await api.call(v114, "GET", "/v1/nodes/fw-redfish/firmware?fields=component,serial_number", expect=200)
    assert set(picked["firmware"][0]) == {"component", "serial_number", "created_at", "updated_at"}


# -- 1.88 port name, 1.90 OVN VTEP local_link_connection, 1.94 port create by node name -------------


async def test_port_name_vtep_and_node_ident_1_88_to_1_94(api: VersionedApi) -> None:
    v87, v88, v89, v90, v93, v94 = (1, 87), (1, 88), (1, 89), (1, 90), (1, 93), (1, 94)
    node = await new_node(api, "p-node")
    mac = "52:54:00:88:00:0"
    status, _ = await api.call(
        v87, "POST", "/v1/ports", {"address": mac + "1", "node_uuid": node["uuid"], "name": "p1"}
    )
    assert status == 406
    _, plain = await api.call(v87, "POST", "/v1/ports", {"address": mac + "1", "node_uuid": node["uuid"]}, expect=201)
    assert "name" not in plain
    status, _ = await api.call(v87, "GET", "/v1/ports?fields=name")
    assert status == 406

    _, named = await api.call(
        v88, "POST", "/v1/ports", {"address": mac + "2", "node_uuid": node["uuid"], "name": "p-two"}, expect=201
    )
    assert named["name"] == "p-two"
    _, got = await api.call(v88, "GET", "/v1/ports/p-two", expect=200)
    assert got["uuid"] == named["uuid"]
    status, body = await api.call(
        v88, "POST", "/v1/ports", {"address": mac + "3", "node_uuid": node["uuid"], "name": "p-two"}
    )
    assert status == 409 and "p-two" in fault(body), body
    _, renamed = await api.call(
        v88, "PATCH", f"/v1/ports/{plain['uuid']}", [{"op": "add", "path": "/name", "value": "p-one"}], expect=200
    )
    assert renamed["name"] == "p-one"
    status, _ = await api.call(v88, "PATCH", "/v1/ports/p-one", [{"op": "replace", "path": "/name", "value": "p-two"}])
    assert status == 409
    _, listed = await api.call(v88, "GET", f"/v1/ports?node={node['uuid']}&fields=name", expect=200)
    assert sorted(p["name"] for p in listed["ports"]) == ["p-one", "p-two"]
    _, unnamed = await api.call(v88, "PATCH", "/v1/ports/p-one", [{"op": "remove", "path": "/name"}], expect=200)
    assert unnamed["name"] is None
    await api.call(v88, "DELETE", "/v1/ports/p-two", expect=204)

    # 1.90: an OVN VTEP switch port is a valid local_link_connection.
    vtep = {"port_id": "lp-1", "vtep-logical-switch": "ls-1", "vtep-physical-switch": "ps-1"}
    status, _ = await api.call(
        v89, "POST", "/v1/ports", {"address": mac + "4", "node_uuid": node["uuid"], "local_link_connection": vtep}
    )
    assert status == 406
    _, port = await api.call(
        v90,
        "POST",
        "/v1/ports",
        {"address": mac + "4", "node_uuid": node["uuid"], "local_link_connection": vtep},
        expect=201,
    )
    assert port["local_link_connection"] == vtep
    for bad in ({**vtep, "switch_id": "aa:bb:cc:dd:ee:ff"}, {"port_id": "lp", "vtep-logical-switch": "ls"}):
        status, body = await api.call(
            v90,
            "PATCH",
            f"/v1/ports/{port['uuid']}",
            [{"op": "replace", "path": "/local_link_connection", "value": bad}],
        )
        assert status == 400, body

    # 1.94: node_ident (name or UUID) instead of node_uuid; a missing node is a 400.
    status, _ = await api.call(v93, "POST", "/v1/ports", {"address": mac + "5", "node_ident": "p-node"})
    assert status == 406
    _, by_name = await api.call(v94, "POST", "/v1/ports", {"address": mac + "5", "node_ident": "p-node"}, expect=201)
    assert by_name["node_uuid"] == node["uuid"]
    _, by_uuid = await api.call(
        v94, "POST", "/v1/ports", {"address": mac + "6", "node_ident": node["uuid"]}, expect=201
    )
    assert by_uuid["node_uuid"] == node["uuid"]
    for body in (
        {"address": mac + "7", "node_ident": "no-such-node"},
        {"address": mac + "7", "node_ident": "p-node", "node_uuid": node["uuid"]},
        {"address": mac + "7"},
    ):
        status, answer = await api.call(v94, "POST", "/v1/ports", body)
        assert status == 400, (body, answer)
    _, none = await api.call(v94, "GET", f"/v1/ports?address={mac}7", expect=200)
    assert none["ports"] == []


# -- 1.95: disable_power_off ------------------------------------------------------------------------


async def test_disable_power_off_from_1_95(api: VersionedApi, stack: Any) -> None:
    v94, v95 = (1, 94), (1, 95)
    status, _ = await api.call(
        v94, "POST", "/v1/nodes", {"driver": "fake-hardware", "name": "dpo", "disable_power_off": True}
    )
    assert status == 406
    _, node = await api.call(v94, "POST", "/v1/nodes", {"driver": "fake-hardware", "name": "dpo"}, expect=201)
    assert "disable_power_off" not in node
    status, _ = await api.call(
        v94, "PATCH", "/v1/nodes/dpo", [{"op": "add", "path": "/disable_power_off", "value": True}]
    )
    assert status == 406
    _, node = await api.call(v95, "GET", "/v1/nodes/dpo", expect=200)
    assert node["disable_power_off"] is False
    _, node = await api.call(
        v95, "PATCH", "/v1/nodes/dpo", [{"op": "replace", "path": "/disable_power_off", "value": True}], expect=200
    )
    assert node["disable_power_off"] is True
    status, body = await api.call(
        v95, "PATCH", "/v1/nodes/dpo", [{"op": "replace", "path": "/disable_power_off", "value": "maybe"}]
    )
    assert status == 400, body
    # Power off is refused (409) at any version once set; power on and reboot work.
    await api.call(v95, "PUT", "/v1/nodes/dpo/states/power", {"target": "power on"}, expect=202)
    await wait_state(api, "dpo", "enroll")
    for version, target in ((v95, "power off"), (v95, "soft power off"), ((1, 1), "power off")):
        status, body = await api.call(version, "PUT", f"/v1/nodes/{node['uuid']}/states/power", {"target": target})
        assert status == 409 and fault(body) == f"Failed to set node power state to {target}.", body
    await api.call(v95, "PUT", "/v1/nodes/dpo/states/power", {"target": "rebooting"}, expect=202)
    node = await wait_state(api, "dpo", "enroll")
    assert node["power_state"] == "power on" and node["last_error"] is None
    # The native gRPC Node carries the field (and the firmware interface among the interfaces).
    channel = grpc.aio.insecure_channel(stack.endpoints["api gRPC"])
    try:
        message = await pb_grpc.NodeServiceStub(channel).GetNode(pb.GetNodeRequest(ident="dpo"))
    finally:
        await channel.close()
    assert message.disable_power_off is True and message.interfaces["firmware"] == "no-firmware"
    # The conductor's own power_off step is refused too; the clean fails and the power stays on.
    await provision(api, "dpo", {"target": "manage"}, "manageable")
    steps = [{"interface": "power", "step": "power_off"}]
    failed = await provision(api, "dpo", {"target": "clean", "clean_steps": steps}, "clean failed", version=v95)
    assert "disable_power_off" in failed["last_error"] and failed["power_state"] == "power on"
    _, listed = await api.call(v95, "GET", "/v1/nodes?fields=name,disable_power_off", expect=200)
    assert {"name": "dpo", "disable_power_off": True} in [
        {k: n[k] for k in ("name", "disable_power_off")} for n in listed["nodes"]
    ]


# -- 1.89 attach and detach virtual media, 1.93 list it ---------------------------------------------


async def test_virtual_media_from_1_89_and_1_93(api: VersionedApi, sim: Simulator, tmp_path: Path) -> None:
    image = tmp_path / "boot.iso"
    image.write_bytes(b"\0" * 64 * 1024)
    fetched: list[str] = []
    async with serving_files({"/boot.iso": image}, fetched) as port:
        await check_virtual_media(api, sim, f"http://127.0.0.1:{port}/boot.iso")
    assert fetched == ["/boot.iso"]  # the simulated BMC read the image; the fake interface did not


async def check_virtual_media(api: VersionedApi, sim: Simulator, iso: str) -> None:
    v88, v89, v92, v93 = (1, 88), (1, 89), (1, 92), (1, 93)
    await new_node(api, "vm-fake")
    attach = {"device_type": "cdrom", "image_url": iso}
    status, _ = await api.call(v88, "POST", "/v1/nodes/vm-fake/vmedia", attach)
    assert status == 404
    status, _ = await api.call(v92, "GET", "/v1/nodes/vm-fake/vmedia")
    assert status == 404
    for bad in (
        {"device_type": "tape", "image_url": iso},
        {"device_type": "cdrom", "image_url": "file:///etc/passwd"},
        {"device_type": "cdrom"},
        {**attach, "username": "x"},
        {**attach, "image_download_source": "local"},
    ):
        status, body = await api.call(v89, "POST", "/v1/nodes/vm-fake/vmedia", bad)
        assert status == 400, (bad, body)
    status, _ = await api.call(v89, "DELETE", "/v1/nodes/vm-fake/vmedia?device_types=tape")
    assert status == 400
    status, _ = await api.call(v89, "POST", "/v1/nodes/5c9dcd04-2073-49bc-9618-99ae634d8971/vmedia", attach)
    assert status == 404

    # The fake management interface keeps what is attached in the node.
    await api.call(v89, "POST", "/v1/nodes/vm-fake/vmedia", attach, expect=204)
    _, slots = await api.call(v93, "GET", "/v1/nodes/vm-fake/vmedia", expect=200)
    assert {"media_types": ["cdrom"], "image": iso, "inserted": True} in slots
    await api.call(v89, "DELETE", "/v1/nodes/vm-fake/vmedia", expect=204)
    _, slots = await api.call(v93, "GET", "/v1/nodes/vm-fake/vmedia", expect=200)
    assert not any(s["inserted"] for s in slots)

    # A Redfish BMC (the simulator) gets the image in its virtual CD; ipmitool management cannot: 400.
    machine = sim.machines[1]
    body = {"driver": "redfish", "name": "vm-redfish", "driver_info": sim.driver_info(machine)}
    await api.call(v89, "POST", "/v1/nodes", body, expect=201)
    await api.call(v89, "POST", "/v1/nodes/vm-redfish/vmedia", attach, expect=204)
    _, slots = await api.call(v93, "GET", "/v1/nodes/vm-redfish/vmedia", expect=200)
    cd = next(s for s in slots if "CD" in s["media_types"])
    assert cd["inserted"] is True and cd["image"] == iso
    status, body = await api.call(v89, "POST", "/v1/nodes/vm-redfish/vmedia", attach)
    assert status >= 400 and "already holds media" in fault(body), body
    await api.call(v89, "DELETE", "/v1/nodes/vm-redfish/vmedia?device_types=cdrom", expect=204)
    _, slots = await api.call(v93, "GET", "/v1/nodes/vm-redfish/vmedia", expect=200)
    assert not any(s["inserted"] for s in slots)
    ipmi = {
        "driver": "ipmi",
        "name": "vm-ipmi",
        "driver_info": {"ipmi_address": "127.0.0.1", "ipmi_username": "u", "ipmi_password": "p"},
    }
    await api.call(v89, "POST", "/v1/nodes", ipmi, expect=201)
    status, body = await api.call(v89, "POST", "/v1/nodes/vm-ipmi/vmedia", attach)
    assert status == 400 and "does not support attaching virtual media" in fault(body), body


# -- 1.91: no special .json suffix --------------------------------------------------------------------


async def test_json_suffix_until_1_91(api: VersionedApi) -> None:
    v90, v91 = (1, 90), (1, 91)
    plain = await new_node(api, "js")
    dotted = await new_node(api, "js-only.json")
    # Below 1.91 the suffix is dropped; a name that exists only with it is still found.
    _, got = await api.call(v90, "GET", "/v1/nodes/js.json", expect=200)
    assert got["uuid"] == plain["uuid"]
    _, got = await api.call(v90, "GET", "/v1/nodes/js-only.json", expect=200)
    assert got["uuid"] == dotted["uuid"]
    _, listed = await api.call(v90, "GET", "/v1/nodes.json", expect=200)
    assert plain["uuid"] in {n["uuid"] for n in listed["nodes"]}
    # From 1.91 the path is the name.
    status, _ = await api.call(v91, "GET", "/v1/nodes/js.json")
    assert status == 404
    _, got = await api.call(v91, "GET", "/v1/nodes/js-only.json", expect=200)
    assert got["uuid"] == dotted["uuid"]
    status, _ = await api.call(v91, "GET", "/v1/nodes.json")
    assert status == 404
