"""Boot from volume (seed 004) over REST, on fake power: the deploy writes no
image when the OS is on the boot volume, records how the node boots, and
the renderer serves what the deploy recorded; bad volume set-ups are refused
with a 400 that names the field, and change nothing.

Scenarios 3 and 4 also run on simulated machines whose HBA presents a LUN
(a sparse file with a WWN): the firmware boots the OS already on it, or the
agent writes the image onto it, found by the WWN hint. The real boots
(scenario 1 from a tgtd LUN, scenario 5 from an NFS root) are in
tests/e2e/test_boot_from_volume_qemu.py.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import pytest

from ferrum.v1 import api_pb2 as pb
from ferrum.v1 import api_pb2_grpc as pb_grpc
from services.demo_image import build_demo_image
from services.runtime import ALL_SERVICES_ORDER, RunningStack
from services.simulator.options import SimulatorOptions
from services.simulator.service import Simulator
from tests.conftest import test_settings
from tests.restclient import call, wait_state

IQN = "iqn.2026-11.org.ferrum.test:bfv-initiator"
WWPN, WWNN = "21000024ff6a3b10", "20000024ff6a3b10"
_macs = itertools.count(0x10)
MiB = 1024 * 1024


@pytest.fixture(scope="module")
async def env(database_url: str, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[dict[str, Any]]:
    settings = test_settings(
        database_url,
        tmp_path_factory.mktemp("state"),
        conductor={"hostname": "bfv-test-conductor", "automated_clean": False},
    )
    stack = RunningStack()
    await stack.start(settings, list(ALL_SERVICES_ORDER))
    session = aiohttp.ClientSession()
    try:
        yield {"stack": stack, "session": session, "api": stack.endpoints["api REST (Ironic v1)"]}
    finally:
        await session.close()
        await stack.close()


async def node(
    env: dict[str, Any],
    *,
    capabilities: str,
    connectors: tuple[tuple[str, str], ...] = (("iqn", IQN),),
    storage: str = "external",
    instance_info: dict[str, Any] | None = None,
) -> tuple[str, str]:
    """An available fake-hardware node (ipxe boot, direct deploy) with one port; (uuid, mac)."""
    mac = f"52:54:00:bf:00:{next(_macs):02x}"
    body = {
        "driver": "fake-hardware",
        "boot_interface": "ipxe",
        "deploy_interface": "direct",
        "storage_interface": storage,
        "properties": {"capabilities": capabilities},
        "instance_info": instance_info or {},
    }
    _, created = await call(env, "POST", "/v1/nodes", body, expect=201)
    uuid = str(created["uuid"])
    await call(env, "POST", "/v1/ports", {"node_uuid": uuid, "address": mac}, expect=201)
    for kind, ident in connectors:  # connector IDs are unique across nodes
        ident = f"{ident}-{mac[-2:]}" if kind == "iqn" else f"{ident[:-2]}{mac[-2:]}"
        await call(
            env, "POST", "/v1/volume/connectors", {"node_uuid": uuid, "type": kind, "connector_id": ident}, expect=201
        )
    await call(env, "PUT", f"/v1/nodes/{uuid}/states/provision", {"target": "manage"}, expect=202)
    await wait_state(env, uuid, "manageable")
    await call(env, "PUT", f"/v1/nodes/{uuid}/states/provision", {"target": "provide"}, expect=202)
    await wait_state(env, uuid, "available")
    return uuid, mac


async def target(
    env: dict[str, Any], uuid: str, volume_type: str, properties: dict[str, Any], boot_index: int = 0
) -> str:
    body = {
        "node_uuid": uuid,
        "volume_type": volume_type,
        "boot_index": boot_index,
        "volume_id": f"vol-{volume_type}-{boot_index}",
        "properties": properties,
    }
    _, created = await call(env, "POST", "/v1/volume/targets", body, expect=201)
    return str(created["uuid"])


ISCSI = {"target_portal": "192.0.2.20:3260", "target_iqn": "iqn.2026-11.org.ferrum.test:lun", "target_lun": 1}
FC = {"target_wwn": "500a09828b3f1a20", "target_lun": 0}


async def script(env: dict[str, Any], mac: str) -> str:
    base = env["stack"].endpoints["ipxe HTTP"].removesuffix("/boot.ipxe")
    async with env["session"].get(f"{base}/ipxe?mac={mac}") as r:
        assert r.status == 200
        return await r.text()


async def deploy(env: dict[str, Any], uuid: str) -> dict[str, Any]:
    await call(env, "PUT", f"/v1/nodes/{uuid}/states/provision", {"target": "active"}, expect=202)
    return await wait_state(env, uuid, "active")


async def test_scenario_2_fc_volume_deploys_without_an_image_and_san_boots(env: dict[str, Any]) -> None:
    uuid, mac = await node(
        env, capabilities="boot_mode:bios,fibre_channel_boot:true", connectors=(("wwpn", WWPN), ("wwnn", WWNN))
    )
    boot = await target(env, uuid, "fibre_channel", FC)
    active = await deploy(env, uuid)  # no image_source, no deploy kernel: nothing is written
    assert active["last_error"] is None and active["power_state"] == "power on"
    assert active["instance_info"] == {"boot_option": "netboot"}
    assert active["driver_internal_info"]["boot_from_volume"] == boot
    _, device = await call(env, "GET", f"/v1/nodes/{uuid}/management/boot_device", expect=200)
    assert device["boot_device"] == "pxe"
    text = await script(env, mac)
    assert "sanboot --no-describe --drive 0x80" in text and "fcp:50:0a:09:82:8b:3f:1a:20:0" in text

    # Tear down detaches, with an event at its start and its end on the gRPC WatchNodes feed.
    channel = grpc.aio.insecure_channel(env["stack"].endpoints["api gRPC"])
    try:
        watch = pb_grpc.NodeServiceStub(channel).WatchNodes(pb.WatchNodesRequest(after_sequence=-1, node_uuid=uuid))
        await call(env, "PUT", f"/v1/nodes/{uuid}/states/provision", {"target": "deleted"}, expect=202)
        detach = []
        async with asyncio.timeout(30):
            async for event in watch:
                if event.event == "storage-detach":
                    detach.append(event.message)
                if len(detach) == 2:
                    break
        watch.cancel()
    finally:
        await channel.close()
    assert detach == [
        "detaching 1 volume(s) through storage interface external",
        "detached 1 volume(s) through storage interface external",
    ]
    after = await wait_state(env, uuid, "available")
    assert "boot_from_volume" not in after["driver_internal_info"] and after["instance_info"] == {}


async def test_scenario_3_hba_volume_boots_from_disk(env: dict[str, Any]) -> None:
    uuid, mac = await node(env, capabilities="hba_boot:true", connectors=(("wwpn", WWPN),))
    await target(env, uuid, "fibre_channel", FC)
    active = await deploy(env, uuid)
    assert active["instance_info"] == {"boot_option": "local"}
    assert "boot_from_volume" not in active["driver_internal_info"]
    # The HBA presents the volume as a disk (fake management can only network-boot,
    # so the renderer sends the machine to its disk).
    assert "Ferrum: booting the local disk" in await script(env, mac)


async def test_scenario_4_force_deployment_gives_the_agent_the_lun_as_root_device(env: dict[str, Any]) -> None:
    """The image goes onto the LUN the HBA presents: the agent gets a root device
    hint made from the target's WWN (the write itself runs on the simulator)."""
    image = {
        "image_source": "http://192.0.2.9/img.raw",
        "image_os_hash_algo": "sha256",
        "image_os_hash_value": "0" * 64,
        "force_deployment": True,
    }
    uuid, _ = await node(env, capabilities="hba_boot:true", connectors=(("wwpn", WWPN),), instance_info=image)
    await call(
        env,
        "PATCH",
        f"/v1/nodes/{uuid}",
        [
            {"op": "add", "path": "/driver_info/deploy_kernel", "value": "http://192.0.2.9/k"},
            {"op": "add", "path": "/driver_info/deploy_ramdisk", "value": "http://192.0.2.9/r"},
        ],
        expect=200,
    )
    boot = await target(env, uuid, "fibre_channel", FC)
    await call(env, "PUT", f"/v1/nodes/{uuid}/states/provision", {"target": "active"}, expect=202)
    waiting = await wait_state(env, uuid, "wait call-back")
    internal = waiting["driver_internal_info"]
    assert internal["boot_from_volume_deploy"] == boot and "boot_from_volume" not in internal
    assert internal["volume_root_device"] == {"wwn": "0x500a09828b3f1a20"}
    assert waiting["instance_info"]["boot_option"] == "local"
    await call(env, "PUT", f"/v1/nodes/{uuid}/states/provision", {"target": "deleted"}, expect=202)
    await wait_state(env, uuid, "available")


@pytest.mark.parametrize(
    ("capabilities", "connectors", "volume", "instance_info", "storage", "reason"),
    [
        (
            "iscsi_boot:true",
            (("wwpn", WWPN),),
            ("iscsi", ISCSI),
            {},
            "external",
            "needs a volume connector of type iqn",
        ),
        ("fibre_channel_boot:true", (("iqn", IQN),), ("fibre_channel", FC), {}, "external", "wwpn or wwnn"),
        ("iscsi_boot:true", (("iqn", IQN),), None, {}, "external", "no volume target with boot_index 0"),
        ("", (("iqn", IQN),), ("iscsi", ISCSI), {}, "external", "set iscsi_boot:true"),
        (
            "iscsi_boot:true",
            (("iqn", IQN),),
            ("iscsi", ISCSI),
            {"image_source": "http://192.0.2.9/img.raw", "image_checksum": "0" * 32},
            "external",
            "remove it to boot the volume",
        ),
        ("iscsi_boot:true", (("iqn", IQN),), ("iscsi", ISCSI), {"force_deployment": True}, "external", "hba_boot:true"),
        ("iscsi_boot:true", (("iqn", IQN),), ("iscsi", ISCSI), {}, "noop", "storage interface is noop"),
        (
            "nfs_boot:true",
            (),
            ("nfs", {"nfs_server": "192.0.2.30", "nfs_path": "/export"}),
            {},
            "external",
            "instance_info kernel",
        ),
    ],
)
async def test_bad_volume_set_ups_are_refused_and_change_nothing(
    env: dict[str, Any],
    capabilities: str,
    connectors: tuple[tuple[str, str], ...],
    volume: tuple[str, dict[str, Any]] | None,
    instance_info: dict[str, Any],
    storage: str,
    reason: str,
) -> None:
    uuid, _ = await node(
        env, capabilities=capabilities, connectors=connectors, storage=storage, instance_info=instance_info
    )
    if volume is not None:
        await target(env, uuid, *volume)
    status, body = await call(env, "PUT", f"/v1/nodes/{uuid}/states/provision", {"target": "active"})
    assert status == 400, body
    assert reason in body["error_message"], body["error_message"]
    _, after = await call(env, "GET", f"/v1/nodes/{uuid}", expect=200)
    assert after["provision_state"] == "available" and after["last_error"] is None
    assert "boot_option" not in after["instance_info"]


async def test_a_second_boot_volume_is_refused(env: dict[str, Any]) -> None:
    uuid, _ = await node(env, capabilities="iscsi_boot:true")
    await target(env, uuid, "iscsi", ISCSI)
    body = {"node_uuid": uuid, "volume_type": "iscsi", "boot_index": 0, "volume_id": "other", "properties": ISCSI}
    status, error = await call(env, "POST", "/v1/volume/targets", body)
    assert status == 409 and "boot index '0'" in error["error_message"]


async def test_a_malformed_nfs_root_is_refused(env: dict[str, Any]) -> None:
    uuid, _ = await node(env, capabilities="nfs_boot:true", connectors=())
    await target(env, uuid, "nfs", {})
    patch = [
        {
            "op": "add",
            "path": "/instance_info",
            "value": {"kernel": "http://h/k", "ramdisk": "http://h/r", "nfs_root": "h:/x;reboot"},
        }
    ]
    status, body = await call(env, "PATCH", f"/v1/nodes/{uuid}", patch)
    if status == 200:  # the api stores it; the deploy refuses it
        status, body = await call(env, "PUT", f"/v1/nodes/{uuid}/states/provision", {"target": "active"})
    assert status == 400 and "nfs_root" in body["error_message"], body


# -- scenarios 3 and 4 on the simulator: a LUN behind each machine's HBA --------------

SIM_USER, SIM_PASSWORD = "admin", "hba-secret"


@pytest.fixture(scope="module")
async def lab(env: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[dict[str, Any]]:
    """Two simulated machines, each with a 64 MiB LUN behind an HBA, booting from the stack's renderer."""
    tmp = tmp_path_factory.mktemp("hba")
    simulator = Simulator(
        SimulatorOptions(
            machines=2,
            state_dir=str(tmp / "machines"),
            boot_url=env["stack"].endpoints["ipxe HTTP"],
            username=SIM_USER,
            password=SIM_PASSWORD,
            disk_size=64 * MiB,
            hba_lun_size=64 * MiB,
            name_prefix="hba-",
        ).validate()
    )
    await simulator.start()
    conductor: Any = next(s for s in env["stack"].services if s.name == "conductor")
    image = build_demo_image(tmp / "images", size_mib=24, marker="boot from volume")
    await conductor.objectstore.put_file("bfv", "disk.raw", image.path)
    await conductor.objectstore.put_bytes("bfv", "kernel", b"k")
    try:
        yield {
            **env,
            "sim": simulator,
            "image": image,
            "image_url": await conductor.objectstore.temp_url("bfv", "disk.raw", lifetime=1800),
            "kernel": await conductor.objectstore.temp_url("bfv", "kernel", lifetime=1800),
        }
    finally:
        await simulator.stop()


async def hba_node(lab: dict[str, Any], index: int, instance_info: dict[str, Any]) -> tuple[str, Any]:
    machine = lab["sim"].machines[index]
    body = {
        "name": machine.name,
        "driver": "redfish",
        "boot_interface": "ipxe",
        "deploy_interface": "direct",
        "storage_interface": "external",
        "driver_info": {
            **lab["sim"].driver_info(machine),
            "deploy_kernel": lab["kernel"],
            "deploy_ramdisk": lab["kernel"],
        },
        "properties": {"capabilities": "hba_boot:true"},
        "instance_info": instance_info,
    }
    _, node = await call(lab, "POST", "/v1/nodes", body, expect=201)
    uuid = str(node["uuid"])
    await call(lab, "POST", "/v1/ports", {"node_uuid": uuid, "address": machine.macs[0]}, expect=201)
    wwpn = f"21000024ff6a3c{index:02x}"
    await call(
        lab, "POST", "/v1/volume/connectors", {"node_uuid": uuid, "type": "wwpn", "connector_id": wwpn}, expect=201
    )
    await target(lab, uuid, "fibre_channel", lab["sim"].hba_volume(machine))
    await call(lab, "PUT", f"/v1/nodes/{uuid}/states/provision", {"target": "manage"}, expect=202)
    await wait_state(lab, uuid, "manageable")
    await call(lab, "PUT", f"/v1/nodes/{uuid}/states/provision", {"target": "provide"}, expect=202)
    await wait_state(lab, uuid, "available")
    return uuid, machine


async def os_booted(machine: Any) -> dict[str, Any]:
    deadline = time.monotonic() + 60
    while not machine.events("os_booted"):
        assert time.monotonic() < deadline, f"the machine booted no OS: {list(machine.boot_log)[-6:]}"
        await asyncio.sleep(0.1)
    return dict(machine.events("os_booted")[-1])


async def test_scenario_3_the_simulated_hba_boots_the_os_already_on_its_lun(lab: dict[str, Any]) -> None:
    uuid, machine = await hba_node(lab, 0, {})
    Path(machine.lun_path).write_bytes(lab["image"].path.read_bytes())  # the OS was put there "by external means"
    active = await deploy(lab, uuid)
    assert active["instance_info"] == {"boot_option": "local"} and active["last_error"] is None
    booted = await os_booted(machine)
    assert booted["disk"] == "hba-lun0" and booted["partitions"] >= 1
    assert not machine.events("agent_started")  # no ramdisk ran: nothing was written
    with open(machine.disk_path, "rb") as local:
        assert local.read(MiB) == bytes(MiB)


async def test_scenario_4_force_deployment_writes_the_image_onto_the_lun_found_by_its_wwn(lab: dict[str, Any]) -> None:
    image = {
        "image_source": lab["image_url"],
        "image_disk_format": "raw",
        "image_os_hash_algo": "sha256",
        "image_os_hash_value": lab["image"].sha256,
        "force_deployment": True,
    }
    uuid, machine = await hba_node(lab, 1, image)
    hostname = "hba-written.ferrum.test"
    body = {"target": "active", "configdrive": {"meta_data": {"hostname": hostname}}}
    await call(lab, "PUT", f"/v1/nodes/{uuid}/states/provision", body, expect=202)
    active = await wait_state(lab, uuid, "active", timeout=180)
    assert active["last_error"] is None and "force_deployment" not in active["instance_info"]
    assert active["instance_info"]["boot_option"] == "local"
    booted = await os_booted(machine)
    assert booted["disk"] == "hba-lun0" and booted["hostname"] == hostname
    written = lab["image"].path.read_bytes()
    with open(machine.lun_path, "rb") as lun:
        lun.seek(MiB)
        assert lun.read(4 * MiB) == written[MiB : 5 * MiB]  # the image is on the LUN...
    with open(machine.disk_path, "rb") as local:
        assert local.read(MiB) == bytes(MiB)  # ...and not on the local disk
