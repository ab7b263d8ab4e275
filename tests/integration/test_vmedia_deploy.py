"""Issue 17 over REST: deploys that boot from virtual media, on the machine simulator.

A live stack (api, conductor, object store, renderer) and simulated machines
whose BMCs insert media by URL. The conductor builds the boot ISOs itself
(ISOLINUX + GRUB, from a stub kernel the simulator never runs: its firmware
reads the boot loader's kernel line from the ISO) and puts the agent's
parameters on a TTL'd floppy. Checked here: the direct deploy (disk equals
image, config drive read, nothing left behind), 20 ramdisk deploys of one
image sharing one ISO built once (usage counted, re-attached on reboot,
deleted with the last node), and bad input refused or failed with the
reason.
"""

from __future__ import annotations

import asyncio
import base64
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from services.agent import vmedia as agent_vmedia
from services.cli import build_parser, settings_from
from services.common import errors
from services.demo import run_demo
from services.demo_image import build_demo_image, payload_digest
from services.runtime import ALL_SERVICES_ORDER, RunningStack
from services.simulator.options import SimulatorOptions
from services.simulator.service import Simulator
from tests.conftest import test_settings
from tests.restclient import call, wait_state

USER, PASSWORD = "admin", "vmedia-secret"
CONTAINER = "vmedia-test"
MACHINES = 28
FLEET = 20  # ramdisk deploys of one image at once

BZIMAGE = bytearray(4096)
BZIMAGE[0x1FE:0x200] = b"\x55\xaa"
BZIMAGE[0x202:0x206] = b"HdrS"
RAMDISK = b"\x1f\x8b\x08\x00" + b"\0" * 4000


@pytest.fixture(scope="module")
async def env(database_url: str, tmp_path_factory: pytest.TempPathFactory) -> Any:
    tmp = tmp_path_factory.mktemp("vmedia")
    settings = test_settings(
        database_url,
        tmp / "state",
        conductor={
            "hostname": "vmedia-conductor",
            "deploy_callback_timeout": 30.0,
            "timeout_check_interval": 1.0,
            "enabled_hardware_types": ("fake-hardware", "redfish", "ilo"),
            "enabled_power_interfaces": ("fake", "redfish", "ilo"),
            "enabled_management_interfaces": ("fake", "redfish", "ilo"),
            "enabled_boot_interfaces": ("fake", "ipxe", "redfish-virtual-media", "ilo-virtual-media"),
            "enabled_deploy_interfaces": ("fake", "direct", "ramdisk", "iscsi"),
            "deploy_helper_images_ttl": 300,
        },
    )
    stack = RunningStack()
    await stack.start(settings, list(ALL_SERVICES_ORDER))
    simulator = Simulator(
        SimulatorOptions(
            machines=MACHINES,
            state_dir=str(tmp / "machines"),
            boot_url=stack.endpoints["ipxe HTTP"],
            username=USER,
            password=PASSWORD,
            disk_size=64 * 1024 * 1024,
        ).validate()
    )
    await simulator.start()
    ilo = Simulator(
        SimulatorOptions(
            machines=1,
            state_dir=str(tmp / "ilo-machines"),
            username=USER,
            password=PASSWORD,
            disk_size=64 * 1024 * 1024,
            name_prefix="ilo-",
            first_index=1000,
            bmc_profile="ilo",
        ).validate()
    )
    await ilo.start()
    session = aiohttp.ClientSession()
    conductor: Any = next(s for s in stack.services if s.name == "conductor")
    store = conductor.objectstore
    await store.put_bytes(CONTAINER, "vmlinuz", bytes(BZIMAGE))
    await store.put_bytes(CONTAINER, "initrd", RAMDISK)
    try:
        yield {
            "stack": stack,
            "sim": simulator,
            "ilo": ilo,
            "api": stack.endpoints["api REST (Ironic v1)"],
            "tmp": tmp,
            "session": session,
            "store": store,
            "vmedia": conductor.manager.vmedia,
            "kernel": await store.temp_url(CONTAINER, "vmlinuz", lifetime=3600),
            "ramdisk": await store.temp_url(CONTAINER, "initrd", lifetime=3600),
        }
    finally:
        await session.close()
        await stack.close()
        await simulator.stop()
        await ilo.stop()


def bmc(env: dict[str, Any], machine: Any, **extra: Any) -> dict[str, Any]:
    return {
        "redfish_address": env["sim"].redfish_url,
        "redfish_system_id": machine.system_path,
        "redfish_username": USER,
        "redfish_password": PASSWORD,
        **extra,
    }


async def enroll(env: dict[str, Any], machine: Any, body: dict[str, Any]) -> dict[str, Any]:
    _, node = await call(
        env,
        "POST",
        "/v1/nodes",
        # These tests look at what the deploy does by virtual media (boot log, objects,
        # failures), so cleaning, which boots the same ramdisk first, stays off here.
        {
            "name": machine.name,
            "driver": "redfish",
            "boot_interface": "redfish-virtual-media",
            "automated_clean": False,
            **body,
        },
        expect=201,
    )
    await call(env, "POST", "/v1/ports", {"node_uuid": node["uuid"], "address": machine.macs[0]}, expect=201)
    for verb, state in (("manage", "manageable"), ("provide", "available")):
        await call(env, "PUT", f"/v1/nodes/{node['uuid']}/states/provision", {"target": verb}, expect=202)
        await wait_state(env, node["uuid"], state)
    return node


async def objects(env: dict[str, Any]) -> dict[str, Any]:
    """The conductor's virtual-media objects by name (none once the container is gone)."""
    try:
        return {o.name: o for o in await env["store"].list(env["vmedia"].container)}
    except errors.NotFound:
        return {}


def events(machine: Any, name: str) -> list[dict[str, Any]]:
    return [e for e in machine.boot_log if e["event"] == name]


async def wait_for(predicate: Any, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.1)


async def test_direct_deploy_boots_the_agent_from_a_virtual_cd_with_a_floppy(env: dict[str, Any]) -> None:
    machine = env["sim"].machines[0]
    image = build_demo_image(env["tmp"] / "images", size_mib=16, marker="vmedia")
    await env["store"].put_file(CONTAINER, "disk.raw", image.path)
    node = await enroll(
        env,
        machine,
        {
            "deploy_interface": "direct",
            "driver_info": bmc(env, machine, deploy_kernel=env["kernel"], deploy_ramdisk=env["ramdisk"]),
            "instance_info": {
                "image_source": await env["store"].temp_url(CONTAINER, "disk.raw", lifetime=3600),
                "image_os_hash_algo": "sha256",
                "image_os_hash_value": image.sha256,
            },
        },
    )
    builds = env["vmedia"].builds
    await call(
        env,
        "PUT",
        f"/v1/nodes/{node['uuid']}/states/provision",
        {"target": "active", "configdrive": {"meta_data": {"hostname": "vm0.vmedia"}}},
        expect=202,
    )
    active = await wait_state(env, node["uuid"], "active", timeout=120)
    assert active["last_error"] is None and active["power_state"] == "power on"
    await wait_for(lambda: machine.os_report is not None, "the machine did not boot its disk")
    assert payload_digest(Path(machine.disk_path), image) == payload_digest(image.path, image)
    assert (machine.os_report or {}).get("config_drive", {}).get("meta_data", {}).get("hostname") == "vm0.vmedia"

    # The agent booted from the CD; its command line carried no node data, the floppy did.
    (cd_boot,) = events(machine, "cd_boot")
    assert "boot_method=vmedia" in cd_boot["cmdline"]
    assert node["uuid"] not in cd_boot["cmdline"] and "ipa-agent-token" not in cd_boot["cmdline"]
    assert "ipa-api-url" not in cd_boot["cmdline"]
    (floppy,) = events(machine, "removable_media")
    assert f"/image-{node['uuid']}" in floppy["image"]
    assert events(machine, "agent_started"), machine.boot_log
    assert env["vmedia"].builds == builds + 1
    # Clean up ejected both media, deleted the floppy and gave the shared deploy ISO back (deleted at zero).
    assert not machine.virtual_media["Cd"].inserted and not machine.virtual_media["Floppy"].inserted
    left = await objects(env)
    assert f"image-{node['uuid']}" not in left
    assert not [n for n in left if n.startswith("boot-")], left

    await call(env, "PUT", f"/v1/nodes/{node['uuid']}/states/provision", {"target": "deleted"}, expect=202)
    done = await wait_state(env, node["uuid"], "available", timeout=120)
    assert done["power_state"] == "power off"


async def test_ilo_virtual_media_deploy_boots_once_from_the_cd_by_boot_on_next_server_reset(
    env: dict[str, Any],
) -> None:
    machine = env["ilo"].machines[0]
    base = f"{env['ilo'].redfish_url}/redfish/v1"
    auth = {"Authorization": "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()}
    async with env["session"].get(f"{base}/Managers/{machine.name}/VirtualMedia", headers=auth) as reply:
        members = [m["@odata.id"] for m in (await reply.json())["Members"]]
    assert members == [f"/redfish/v1/Managers/{machine.name}/VirtualMedia/{n}" for n in ("1", "2")]
    async with env["session"].get(
        f"{base}{machine.system_path.removeprefix('/redfish/v1')}/VirtualMedia", headers=auth
    ) as reply:
        assert reply.status == 404  # iLO 5 has virtual media under its Manager only

    image = build_demo_image(env["tmp"] / "ilo-images", size_mib=16, marker="ilo")
    await env["store"].put_file(CONTAINER, "ilo.raw", image.path)
    node = await enroll(
        env,
        machine,
        {
            "driver": "ilo",
            "boot_interface": "ilo-virtual-media",
            "deploy_interface": "direct",
            "driver_info": {
                "ilo_address": env["ilo"].redfish_url,
                "ilo_username": USER,
                "ilo_password": PASSWORD,
                "ilo_system_id": machine.system_path,
                "deploy_kernel": env["kernel"],
                "deploy_ramdisk": env["ramdisk"],
            },
            "instance_info": {
                "image_source": await env["store"].temp_url(CONTAINER, "ilo.raw", lifetime=3600),
                "image_os_hash_algo": "sha256",
                "image_os_hash_value": image.sha256,
            },
        },
    )
    assert node["driver_info"]["ilo_password"] == "******"
    await call(
        env,
        "PUT",
        f"/v1/nodes/{node['uuid']}/states/provision",
        {"target": "active", "configdrive": {"meta_data": {"hostname": "ilo0.vmedia"}}},
        expect=202,
    )
    active = await wait_state(env, node["uuid"], "active", timeout=120)
    assert active["last_error"] is None
    await wait_for(lambda: machine.os_report is not None, "the iLO machine did not boot its disk")
    assert payload_digest(Path(machine.disk_path), image) == payload_digest(image.path, image)
    assert (machine.os_report or {}).get("config_drive", {}).get("meta_data", {}).get("hostname") == "ilo0.vmedia"
    # The CD boot came from BootOnNextServerReset, not from a standard boot override to Cd.
    (flag,) = events(machine, "virtual_media_boot_on_next_reset")
    assert flag["device"] == "Cd" and flag["value"] is True
    (cd_boot,) = events(machine, "cd_boot")
    assert cd_boot["at"] >= flag["at"] and "boot_method=vmedia" in cd_boot["cmdline"]
    assert not [e for e in machine.boot_log if e["event"] == "firmware_start" and "Cd" in e["sequence"].split(",")[1:]]
    (floppy,) = events(machine, "removable_media")
    assert f"/image-{node['uuid']}" in floppy["image"]
    assert not machine.virtual_media["Cd"].boot_on_next_reset and not machine.virtual_media["Cd"].inserted
    assert f"image-{node['uuid']}" not in await objects(env)


async def test_twenty_ramdisk_deploys_of_one_image_share_one_iso(env: dict[str, Any]) -> None:
    machines = env["sim"].machines[1 : 1 + FLEET]
    nodes = await asyncio.gather(
        *(
            enroll(
                env,
                m,
                {
                    "deploy_interface": "ramdisk",
                    "driver_info": bmc(env, m, deploy_kernel=env["kernel"], deploy_ramdisk=env["ramdisk"]),
                    "instance_info": {
                        "kernel": env["kernel"],
                        "ramdisk": env["ramdisk"],
                        "image_source": "fleet-image",
                    },
                },
            )
            for m in machines
        )
    )
    builds = env["vmedia"].builds
    await asyncio.gather(
        *(
            call(
                env,
                "PUT",
                f"/v1/nodes/{n['uuid']}/states/provision",
                {"target": "active", "configdrive": {"meta_data": {"hostname": f"{n['name']}.ramdisk"}}},
                expect=202,
            )
            for n in nodes
        )
    )
    actives = [await wait_state(env, n["uuid"], "active", timeout=180) for n in nodes]
    assert env["vmedia"].builds == builds + 1  # concurrent deploys of one image built it once
    names = {a["instance_info"]["boot_iso"] for a in actives}
    assert len(names) == 1 and next(iter(names)).startswith("swift:boot-")
    shared = next(iter(names)).removeprefix("swift:")
    assert (await objects(env))[shared].usage_count == FLEET

    # Each machine runs the ISO's kernel as its OS and reads config-2 from the second device.
    await wait_for(lambda: all(m.os_report is not None for m in machines), "machines did not boot the ISO")
    for machine in machines:
        report = machine.os_report or {}
        assert report.get("ramdisk") is True and "root=/dev/ram0" in report["cmdline"]
        assert (report.get("config_drive") or {}).get("meta_data", {}).get("hostname") == f"{machine.name}.ramdisk"

    # A reboot attaches the boot ISO again (fresh temp URL) before the machine restarts.
    first, node = machines[0], nodes[0]
    boots = len(events(first, "cd_boot"))
    first.virtual_media["Cd"].inserted = False  # as a BMC that dropped its media over a reset
    await call(env, "PUT", f"/v1/nodes/{node['uuid']}/states/power", {"target": "rebooting"}, expect=202)
    await wait_for(lambda: len(events(first, "cd_boot")) > boots, "the reboot did not boot the CD again")
    assert first.virtual_media["Cd"].inserted and shared in first.virtual_media["Cd"].image

    await asyncio.gather(
        *(call(env, "PUT", f"/v1/nodes/{n['uuid']}/states/provision", {"target": "deleted"}, expect=202) for n in nodes)
    )
    for n in nodes:
        done = await wait_state(env, n["uuid"], "available", timeout=120)
        assert "boot_iso" not in done["instance_info"]
    left = await objects(env)
    assert shared not in left and not [o for o in left if o.startswith(("configdrive-", "image-"))], left


async def test_unreachable_deploy_iso_fails_the_deploy_naming_the_url(env: dict[str, Any]) -> None:
    machine = env["sim"].machines[21]
    missing = env["kernel"].replace("/vmlinuz", "/no-such.iso")
    node = await enroll(
        env,
        machine,
        {
            "deploy_interface": "direct",
            "driver_info": bmc(env, machine, deploy_iso=missing),
            "instance_info": {
                "image_source": env["kernel"],
                "image_os_hash_algo": "sha256",
                "image_os_hash_value": "0" * 64,
            },
        },
    )
    started = time.monotonic()
    await call(env, "PUT", f"/v1/nodes/{node['uuid']}/states/provision", {"target": "active"}, expect=202)
    failed = await wait_state(env, node["uuid"], "deploy failed", timeout=60)
    assert time.monotonic() - started < 30
    assert "no-such.iso" in failed["last_error"] and "unreachable" in failed["last_error"]
    assert not machine.virtual_media["Cd"].inserted
    assert f"image-{node['uuid']}" not in await objects(env)


async def test_a_bmc_without_a_virtual_cd_is_refused_at_validate(env: dict[str, Any]) -> None:
    machine = env["sim"].machines[22]
    node = await enroll(
        env,
        machine,
        {
            "deploy_interface": "direct",
            "driver_info": bmc(env, machine, deploy_kernel=env["kernel"], deploy_ramdisk=env["ramdisk"]),
            "instance_info": {
                "image_source": env["kernel"],
                "image_os_hash_algo": "sha256",
                "image_os_hash_value": "0" * 64,
            },
        },
    )
    del machine.virtual_media["Cd"]  # this BMC only has a floppy
    status, body = await call(env, "PUT", f"/v1/nodes/{node['uuid']}/states/provision", {"target": "active"})
    assert status == 400, body
    assert "no virtual CD" in str(body)
    _, after = await call(env, "GET", f"/v1/nodes/{node['uuid']}", expect=200)
    assert after["provision_state"] == "available"
    _, checks = await call(env, "GET", f"/v1/nodes/{node['uuid']}/validate", expect=200)
    assert checks["boot"]["result"] is False and "no virtual CD" in checks["boot"]["reason"]


async def test_a_bad_kernel_fails_the_deploy_and_leaves_no_object(env: dict[str, Any]) -> None:
    machine = env["sim"].machines[23]
    await env["store"].put_bytes(CONTAINER, "not-a-kernel", b"MZ" + b"\0" * 1000)
    bad = await env["store"].temp_url(CONTAINER, "not-a-kernel", lifetime=3600)
    node = await enroll(
        env,
        machine,
        {
            "deploy_interface": "direct",
            "driver_info": bmc(env, machine, deploy_kernel=bad, deploy_ramdisk=env["ramdisk"]),
            "instance_info": {
                "image_source": env["kernel"],
                "image_os_hash_algo": "sha256",
                "image_os_hash_value": "0" * 64,
            },
        },
    )
    await call(env, "PUT", f"/v1/nodes/{node['uuid']}/states/provision", {"target": "active"}, expect=202)
    failed = await wait_state(env, node["uuid"], "deploy failed", timeout=60)
    assert "not an x86 Linux kernel" in failed["last_error"]
    left = await objects(env)
    assert not [n for n in left if n.startswith("boot-")] and f"image-{node['uuid']}" not in left, left


async def test_the_demo_boots_by_virtual_media(env: dict[str, Any]) -> None:
    """``ferrum demo --boot virtual-media``: its settings enable the interface, and the run itself
    (enroll, deploy, byte-for-byte check, undeploy) goes through the virtual CD."""
    args = build_parser().parse_args(["demo", "--boot", "virtual-media", "--state-dir", str(env["tmp"] / "cli")])
    assert "redfish-virtual-media" in settings_from(args, {}).conductor.enabled_boot_interfaces
    plain = build_parser().parse_args(["demo", "--state-dir", str(env["tmp"] / "cli")])
    assert "redfish-virtual-media" not in settings_from(plain, {}).conductor.enabled_boot_interfaces

    simulators: list[Any] = []
    try:
        await run_demo(env["stack"], nodes=2, simulators=simulators, boot="virtual-media")
        (simulator,) = simulators
        for machine in simulator.machines:
            # The deploy, and the cleaning after the demo's undeploy, each boot the ramdisk from the CD.
            cd_boots = events(machine, "cd_boot")
            assert cd_boots and all("boot_method=vmedia" in boot["cmdline"] for boot in cd_boots)
            assert events(machine, "removable_media") and not events(machine, "kernel")  # no iPXE kernel
    finally:
        for simulator in simulators:
            await simulator.stop()


async def test_a_one_slot_bmc_gets_the_config_drive_folded_into_the_instance_iso(env: dict[str, Any]) -> None:
    """A BMC with a CD only: the ramdisk instance's config drive goes into its own ISO (label
    config-2), which the OS reads as cloud-init reads a config-2 CD; tear down deletes it."""
    machine = env["sim"].machines[24]
    del machine.virtual_media["Floppy"]
    node = await enroll(
        env,
        machine,
        {
            "deploy_interface": "ramdisk",
            "driver_info": bmc(env, machine, deploy_kernel=env["kernel"], deploy_ramdisk=env["ramdisk"]),
            "instance_info": {"kernel": env["kernel"], "ramdisk": env["ramdisk"], "image_source": "one-slot"},
        },
    )
    await call(
        env,
        "PUT",
        f"/v1/nodes/{node['uuid']}/states/provision",
        {"target": "active", "configdrive": {"meta_data": {"hostname": "one-slot.vmedia"}}},
        expect=202,
    )
    active = await wait_state(env, node["uuid"], "active", timeout=120)
    assert active["last_error"] is None
    await wait_for(lambda: machine.os_report is not None, "the machine did not boot the ISO")
    report = machine.os_report or {}
    assert report.get("ramdisk") is True
    assert (report.get("config_drive") or {}).get("meta_data", {}).get("hostname") == "one-slot.vmedia"
    assert f"/boot-{node['uuid']}.iso" in machine.virtual_media["Cd"].image
    assert f"boot-{node['uuid']}.iso" in await objects(env)

    await call(env, "PUT", f"/v1/nodes/{node['uuid']}/states/provision", {"target": "deleted"}, expect=202)
    await wait_state(env, node["uuid"], "available", timeout=120)
    left = await objects(env)
    assert f"boot-{node['uuid']}.iso" not in left and f"configdrive-{node['uuid']}.iso" not in left, left


async def test_setting_up_and_cleaning_up_twice_changes_nothing(env: dict[str, Any]) -> None:
    """What a conductor that adopts a deploy does: run the set up again. The ISO is counted once,
    the floppy is the same object with the same token; a second clean up releases nothing twice."""
    machine = env["sim"].machines[25]
    node = await enroll(
        env,
        machine,
        {
            "deploy_interface": "direct",
            "driver_info": bmc(env, machine, deploy_kernel=env["kernel"], deploy_ramdisk=env["ramdisk"]),
        },
    )
    conductor = next(s for s in env["stack"].services if s.name == "conductor")
    uuid = node["uuid"]

    async def floppy_parameters() -> dict[str, str]:
        data = await env["store"].get_bytes(env["vmedia"].container, f"image-{uuid}")
        return await asyncio.to_thread(agent_vmedia.image_parameters, [data])

    async with conductor.manager.tasks.acquire(uuid, "repeat") as task:
        await task.driver.boot.prepare_ramdisk(task, {})
        first = await floppy_parameters()
        shared = task.node["driver_internal_info"]["vmedia_deploy_iso"]
        await task.driver.boot.prepare_ramdisk(task, {})
        assert await floppy_parameters() == first and first["ipa-node-uuid"] == uuid
        assert first["ipa-agent-token"] and first["boot_method"] == "vmedia"
        assert (await objects(env))[shared].usage_count == 1
        assert machine.virtual_media["Cd"].inserted and machine.virtual_media["Floppy"].inserted
        await task.driver.boot.clean_up_ramdisk(task)
        await task.driver.boot.clean_up_ramdisk(task)
    left = await objects(env)
    assert shared not in left and f"image-{uuid}" not in left, left
    assert not machine.virtual_media["Cd"].inserted and not machine.virtual_media["Floppy"].inserted


async def test_config_via_removable_leaves_the_config_drive_in_the_removable_slot(env: dict[str, Any]) -> None:
    """A disk-booting instance with config_via_removable: its config drive stays attached as a
    second device, where the OS finds it as cloud-init would; tear down ejects and deletes it."""
    machine = env["sim"].machines[26]
    image = build_demo_image(env["tmp"] / "removable-images", size_mib=16, marker="removable")
    await env["store"].put_file(CONTAINER, "removable.raw", image.path)
    node = await enroll(
        env,
        machine,
        {
            "deploy_interface": "direct",
            "driver_info": bmc(
                env, machine, deploy_kernel=env["kernel"], deploy_ramdisk=env["ramdisk"], config_via_removable="true"
            ),
            "instance_info": {
                "image_source": await env["store"].temp_url(CONTAINER, "removable.raw", lifetime=3600),
                "image_os_hash_algo": "sha256",
                "image_os_hash_value": image.sha256,
            },
        },
    )
    await call(
        env,
        "PUT",
        f"/v1/nodes/{node['uuid']}/states/provision",
        {"target": "active", "configdrive": {"meta_data": {"hostname": "removable.vmedia"}}},
        expect=202,
    )
    active = await wait_state(env, node["uuid"], "active", timeout=120)
    assert active["last_error"] is None
    await wait_for(lambda: machine.os_report is not None, "the machine did not boot its disk")
    assert f"/configdrive-{node['uuid']}.iso" in (machine.virtual_media["Floppy"].image or "")
    media = (machine.os_report or {}).get("media_config_drive") or {}
    assert media.get("meta_data", {}).get("hostname") == "removable.vmedia"

    await call(env, "PUT", f"/v1/nodes/{node['uuid']}/states/provision", {"target": "deleted"}, expect=202)
    await wait_state(env, node["uuid"], "available", timeout=120)
    assert not machine.virtual_media["Floppy"].inserted
    assert f"configdrive-{node['uuid']}.iso" not in await objects(env)


async def test_iscsi_deploy_boots_the_agent_from_a_virtual_cd(env: dict[str, Any]) -> None:
    """Issue 18 with virtual-media boot: the agent boots from the virtual CD
    (its parameters on the floppy), serves its disk through tgtd, and the
    conductor writes the image and the config drive over iSCSI."""
    machine = env["sim"].machines[27]
    image = build_demo_image(env["tmp"] / "images-iscsi", size_mib=16, marker="vmedia iscsi")
    await env["store"].put_file(CONTAINER, "disk-iscsi.raw", image.path)
    node = await enroll(
        env,
        machine,
        {
            "deploy_interface": "iscsi",
            "driver_info": bmc(env, machine, deploy_kernel=env["kernel"], deploy_ramdisk=env["ramdisk"]),
            "instance_info": {
                "image_source": await env["store"].temp_url(CONTAINER, "disk-iscsi.raw", lifetime=3600),
                "image_os_hash_algo": "sha256",
                "image_os_hash_value": image.sha256,
            },
        },
    )
    await call(
        env,
        "PUT",
        f"/v1/nodes/{node['uuid']}/states/provision",
        {"target": "active", "configdrive": {"meta_data": {"hostname": "vm27.iscsi"}}},
        expect=202,
    )
    active = await wait_state(env, node["uuid"], "active", timeout=120)
    assert active["last_error"] is None and active["driver_internal_info"]["iscsi_write"]["format"] == "raw"
    await wait_for(lambda: machine.os_report is not None, "the machine did not boot its disk")
    assert payload_digest(Path(machine.disk_path), image) == payload_digest(image.path, image)
    assert (machine.os_report or {}).get("config_drive", {}).get("meta_data", {}).get("hostname") == "vm27.iscsi"
    (cd_boot,) = events(machine, "cd_boot")
    assert "boot_method=vmedia" in cd_boot["cmdline"]
    assert not machine.virtual_media["Cd"].inserted and not machine.virtual_media["Floppy"].inserted
