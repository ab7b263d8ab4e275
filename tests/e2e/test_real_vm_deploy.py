"""Issue 20 end to end: a real machine (a QEMU VM, TCG) provisioned by Ferrum.

Nothing on the machine's side is Ferrum's Python playing a part: the VM's
firmware (SeaBIOS + iPXE) network-boots the renderer's script, which loads
the deploy ramdisk built by ``ferrum ramdisk build`` (Debian's kernel,
busybox, Debian's Python running Ferrum's agent); the agent writes the demo
OS image built by ``ferrum image build-demo`` and the config drive to the
virtio disk; the conductor sets the next boot to the disk over Redfish and
power-cycles the VM, whose OS prints the hostname from its config drive on
the serial console. The BMC is the simulator's Redfish service with the
QEMU backend (power and media over QMP).

The ramdisk and the image are built (or found current) before the stack
starts: ``tests/e2e/vmfiles.py``, also run by ``scripts/bootstrap.sh``.
Every wait is bounded; the module takes about two minutes on two cores.
"""

from __future__ import annotations

import asyncio
import base64
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from services.common.ports import unused_tcp_port
from services.conductor.service import ConductorService
from services.runtime import ALL_SERVICES_ORDER, RunningStack
from services.simulator.options import SimulatorOptions
from services.simulator.service import Simulator
from tests.conftest import test_settings
from tests.diskcheck import disk_signatures, find_bytes
from tests.e2e.vmfiles import VmFiles, ensure_vm_files
from tests.restclient import call, wait_state

pytestmark = pytest.mark.timeout(900)
USER, PASSWORD = "admin", "vm-secret"
HOSTNAME = "real-vm-0.ferrum.test"
USER_DATA = "#cloud-config provisioned by Ferrum in a real VM\nsecond line is not printed\n"
ACTIVE_WAIT = 420.0  # deploy request -> active: ramdisk boot and image write under TCG on a shared 2-core box
OS_WAIT = 180.0  # active -> the deployed OS printed its hostname


@pytest.fixture(scope="module")
def vm_files() -> VmFiles:
    """Built before the stack starts (the stack fixture depends on this)."""
    return ensure_vm_files()


@pytest.fixture(scope="module")
async def lab(vm_files: VmFiles, database_url: str, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Any]:
    """A stack whose api and object store the guest reaches at 10.0.2.2, and one QEMU machine."""
    tmp = tmp_path_factory.mktemp("vm-lab")
    api_port, objects_port = unused_tcp_port(), unused_tcp_port()
    settings = test_settings(
        database_url,
        tmp / "state",
        api={"port": api_port},
        conductor={
            "hostname": "vm-conductor",
            "automated_clean": False,
            "deploy_callback_timeout": 600.0,
            "enabled_boot_interfaces": ("fake", "ipxe", "redfish-virtual-media"),
            # what the parameters floppy tells the agent in the VM (virtual-media boot)
            "vmedia_api_url": f"http://10.0.2.2:{api_port}",
        },
        ipxe={"api_url": f"http://10.0.2.2:{api_port}", "retry_delay": 5},
        objectstore={"http_port": objects_port, "public_url": f"http://10.0.2.2:{objects_port}"},
    )
    stack = RunningStack()
    await stack.start(settings, list(ALL_SERVICES_ORDER))
    simulator = Simulator(
        SimulatorOptions(
            machines=1,
            state_dir=str(tmp / "machines"),
            boot_url=stack.endpoints["ipxe HTTP"],
            username=USER,
            password=PASSWORD,
            disk_size=512 * 1024 * 1024,
            name_prefix="vm-",
            backend="qemu",
        ).validate()
    )
    await simulator.start()
    session = aiohttp.ClientSession()
    conductor = next(s for s in stack.services if s.name == "conductor")
    assert isinstance(conductor, ConductorService) and conductor.objectstore is not None
    store = conductor.objectstore
    for name, path in (
        ("ferrum-agent.kernel", vm_files.ramdisk.kernel),
        ("ferrum-agent.initramfs", vm_files.ramdisk.initramfs),
        ("ferrum-demo-os.raw", vm_files.os_image.path),
    ):
        await store.put_file("vm-e2e", name, Path(path), content_type="application/octet-stream", via="grpc")
    urls = {
        name: await store.temp_url("vm-e2e", name, lifetime=3600)
        for name in ("ferrum-agent.kernel", "ferrum-agent.initramfs", "ferrum-demo-os.raw")
    }
    try:
        yield {
            "stack": stack,
            "sim": simulator,
            "api": stack.endpoints["api REST (Ironic v1)"],
            "session": session,
            "urls": urls,
            "files": vm_files,
        }
    finally:
        await session.close()
        await stack.close()
        await simulator.stop()


FAILED_STATES = ("deploy failed", "clean failed", "inspect failed", "error")
RAMDISK_WAIT = 300.0  # a ramdisk boot and one short job (cleaning, inspection) under TCG


async def reach(lab: dict[str, Any], uuid: str, wanted: str, timeout: float) -> dict[str, Any]:
    """Like tests.restclient.wait_state, but a failed state ends the wait at once (no idle minutes in TCG)."""
    deadline = time.monotonic() + timeout
    while True:
        _, node = await call(lab, "GET", f"/v1/nodes/{uuid}", expect=200)
        if node["provision_state"] == wanted and node["reservation"] is None:
            return node
        assert node["provision_state"] not in FAILED_STATES, f"{node['provision_state']}: {node['last_error']}"
        assert time.monotonic() < deadline, f"still {node['provision_state']} after {timeout} s ({node['last_error']})"
        await asyncio.sleep(1)


async def console(lab: dict[str, Any], machine: Any) -> list[str]:
    """The machine's console lines as its BMC serves them (Redfish Console LogService)."""
    url = f"{lab['sim'].redfish_url}{machine.system_path}/LogServices/Console/Entries"
    credentials = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
    async with lab["session"].get(url, headers={"Authorization": f"Basic {credentials}"}) as response:
        assert response.status == 200, await response.text()
        return [member["Message"] for member in (await response.json())["Members"]]


async def wait_console(lab: dict[str, Any], machine: Any, prefix: str, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    while True:
        lines = await console(lab, machine)
        found = [line for line in lines if line.startswith(prefix)]
        if found:
            return found[-1]
        assert time.monotonic() < deadline, f"the console never showed {prefix!r}; it ends with {lines[-15:]}"
        await asyncio.sleep(2)


async def test_real_vm_network_boots_the_ramdisk_and_boots_its_deployed_os(lab: dict[str, Any]) -> None:
    machine = lab["sim"].machines[0]
    urls = lab["urls"]
    driver_info = {
        **lab["sim"].driver_info(machine),
        "redfish_username": USER,
        "redfish_password": PASSWORD,
        "deploy_kernel": urls["ferrum-agent.kernel"],
        "deploy_ramdisk": urls["ferrum-agent.initramfs"],
    }
    assert "ipa-advertise-port=" in driver_info["kernel_append_params"]
    _, node = await call(
        lab,
        "POST",
        "/v1/nodes",
        {
            "name": "real-vm-0",
            "driver": "redfish",
            "boot_interface": "ipxe",
            "deploy_interface": "direct",
            "driver_info": driver_info,
            "properties": {"root_device": {"serial": machine.disk_serial}},
            "instance_info": {
                "image_source": urls["ferrum-demo-os.raw"],
                "image_os_hash_algo": "sha256",
                "image_os_hash_value": lab["files"].os_image.sha256,
            },
        },
        expect=201,
    )
    uuid = node["uuid"]
    await call(lab, "POST", "/v1/ports", {"node_uuid": uuid, "address": machine.macs[0]}, expect=201)
    for verb, state in (("manage", "manageable"), ("provide", "available")):
        await call(lab, "PUT", f"/v1/nodes/{uuid}/states/provision", {"target": verb}, expect=202)
        await wait_state(lab, uuid, state, timeout=60)

    started = time.monotonic()
    await call(
        lab,
        "PUT",
        f"/v1/nodes/{uuid}/states/provision",
        {"target": "active", "configdrive": {"meta_data": {"hostname": HOSTNAME}, "user_data": USER_DATA}},
        expect=202,
    )
    active = await reach(lab, uuid, "active", ACTIVE_WAIT)
    deployed_in = time.monotonic() - started
    assert active["power_state"] == "power on" and active["last_error"] is None
    shown = await wait_console(lab, machine, "hostname=", OS_WAIT)
    booted_in = time.monotonic() - started
    lines = await console(lab, machine)
    print(f"\nreal VM: deploy request -> active {deployed_in:.1f} s, -> OS printed its hostname {booted_in:.1f} s")

    # The deployed OS read the config drive the agent wrote, as cloud-init would.
    assert shown == f"hostname={HOSTNAME}"
    assert "user_data=#cloud-config provisioned by Ferrum in a real VM" in lines
    # On the way, the real ramdisk booted: DHCP, the agent, the image write.
    log = Path(machine.serial_log).read_text(errors="replace")
    for seen in (
        "ferrum-ramdisk: eth0 has 10.0.2.15",
        "ferrum-ramdisk: starting the deploy agent",
        "ferrum-demo-os: ready",
    ):
        assert seen in log, seen
    # The drivers of a virtual-media boot are there too: the IDE CD and the floppy drive.
    found = next(line for line in log.splitlines() if "ferrum-ramdisk: block devices:" in line).split(":", 2)[2].split()
    assert {"fd0", "sr0", "vda"} <= set(found), found
    for seen in (
        "image written image=ferrum-demo-os.raw device=/dev/vda",  # the agent found the virtio disk in sysfs
        "config drive written device=/dev/vda",
        "leaving the ramdisk action=power_off hook=yes",  # the conductor's soft power off, through the agent
    ):
        assert seen in log, seen
    events = [e["event"] for e in machine.boot_log]
    assert events.count("vm_started") >= 2  # the ramdisk boot, then the disk boot after the reboot
    # The disk now holds the image (its first partition, byte for byte) plus a config-2 partition.
    image = lab["files"].os_image.path.read_bytes()
    with open(machine.disk_path, "rb") as disk:
        disk.seek(1024 * 1024)
        assert disk.read(len(image) - 2 * 1024 * 1024) == image[1024 * 1024 : len(image) - 1024 * 1024]

    await call(lab, "PUT", f"/v1/nodes/{uuid}/states/provision", {"target": "deleted"}, expect=202)
    await reach(lab, uuid, "available", 120)
    assert machine.power_state == "Off" and machine.process is None
    _, shown_node = await call(lab, "GET", f"/v1/nodes/{uuid}", expect=200)
    assert shown_node["power_state"] == "power off"


async def test_the_real_vm_is_cleaned_and_inspected_by_its_ramdisk(lab: dict[str, Any]) -> None:
    """Issue 21 on a real machine: after the deploy above left an OS and a config
    drive on the disk, manual cleaning boots the ramdisk and wipes the metadata,
    and in-band inspection reports the VM's own CPU, memory, disk and NIC."""
    machine = lab["sim"].machines[0]
    status, node = await call(lab, "GET", "/v1/nodes/real-vm-0")
    assert status == 200, "the deploy test enrolls and deploys this machine first"
    uuid = node["uuid"]
    assert disk_signatures(machine.disk_path), "the deploy test left nothing on the disk to clean"
    await call(lab, "PUT", f"/v1/nodes/{uuid}/states/provision", {"target": "manage"}, expect=202)
    await reach(lab, uuid, "manageable", 60)

    step = {"interface": "deploy", "step": "erase_devices_metadata"}
    await call(lab, "PUT", f"/v1/nodes/{uuid}/states/provision", {"target": "clean", "clean_steps": [step]}, expect=202)
    cleaned = await reach(lab, uuid, "manageable", RAMDISK_WAIT)
    assert cleaned["last_error"] is None and cleaned["power_state"] == "power off"
    assert disk_signatures(machine.disk_path) == [], disk_signatures(machine.disk_path)
    assert not find_bytes(machine.disk_path, b"CD001"), "the config drive (ISO 9660) survived cleaning"
    log = Path(machine.serial_log).read_text(errors="replace")
    assert log.count("ferrum-ramdisk: starting the deploy agent") >= 2  # the deploy's boot, then cleaning's

    patch = [{"op": "replace", "path": "/inspect_interface", "value": "agent"}]
    await call(lab, "PATCH", f"/v1/nodes/{uuid}", patch, expect=200)
    await call(lab, "PUT", f"/v1/nodes/{uuid}/states/provision", {"target": "inspect"}, expect=202)
    inspected = await reach(lab, uuid, "manageable", RAMDISK_WAIT)
    assert inspected["last_error"] is None and inspected["power_state"] == "power off"
    props = inspected["properties"]
    # The VM's own hardware, as its kernel saw it: -smp 1, -m 1024, a 512 MiB virtio disk, SeaBIOS.
    assert props["cpus"] == 1 and props["cpu_arch"] == "x86_64" and props["memory_mb"] == 1024, props
    assert props["local_gb"] == 0 and "boot_mode:bios" in props["capabilities"], props
    _, ports = await call(lab, "GET", f"/v1/ports/detail?node={uuid}", expect=200)
    assert [(p["address"], p["pxe_enabled"]) for p in ports["ports"]] == [(machine.macs[0], True)]


async def test_the_real_vm_boots_virtual_media_and_is_deployed_over_iscsi(lab: dict[str, Any]) -> None:
    """Issues 17, 18 and 20 on a real machine: the conductor builds a boot ISO
    from the deploy ramdisk and a parameters floppy, and the BMC inserts both
    (QMP); the VM's SeaBIOS boots the CD, the agent reads its api URL from the
    floppy, serves the VM's virtio disk through its own tgtd (inside the VM,
    behind QEMU's port forward), and the conductor writes the image and the
    config drive over iSCSI; the deployed OS prints the hostname from that
    config drive."""
    machine = lab["sim"].machines[0]
    status, node = await call(lab, "GET", "/v1/nodes/real-vm-0")
    assert status == 200, "the deploy test enrolls this machine first"
    uuid = node["uuid"]
    if node["provision_state"] == "manageable":
        await call(lab, "PUT", f"/v1/nodes/{uuid}/states/provision", {"target": "provide"}, expect=202)
        await reach(lab, uuid, "available", 60)
    assert "ipa-iscsi-advertise-port=" in lab["sim"].driver_info(machine)["kernel_append_params"]
    patch = [
        {"op": "replace", "path": "/deploy_interface", "value": "iscsi"},
        {"op": "replace", "path": "/boot_interface", "value": "redfish-virtual-media"},
        # The conductor builds the boot ISO from these, so it fetches them as the host reaches them.
        *(
            {
                "op": "replace",
                "path": f"/driver_info/{key}",
                "value": lab["urls"][name].replace("//10.0.2.2:", "//127.0.0.1:"),
            }
            for key, name in (("deploy_kernel", "ferrum-agent.kernel"), ("deploy_ramdisk", "ferrum-agent.initramfs"))
        ),
        {
            "op": "add",
            "path": "/instance_info",
            "value": {
                # The conductor fetches the image, not the VM: the object store as the host reaches it.
                "image_source": lab["urls"]["ferrum-demo-os.raw"].replace("//10.0.2.2:", "//127.0.0.1:"),
                "image_disk_format": "raw",
                "image_os_hash_algo": "sha256",
                "image_os_hash_value": lab["files"].os_image.sha256,
            },
        },
        {
            "op": "replace",
            "path": "/driver_info/kernel_append_params",
            "value": lab["sim"].driver_info(machine)["kernel_append_params"],
        },
    ]
    await call(lab, "PATCH", f"/v1/nodes/{uuid}", patch, expect=200)
    hostname = "real-vm-iscsi.ferrum.test"
    started = time.monotonic()
    await call(
        lab,
        "PUT",
        f"/v1/nodes/{uuid}/states/provision",
        {"target": "active", "configdrive": {"meta_data": {"hostname": hostname}}},
        expect=202,
    )
    active = await reach(lab, uuid, "active", ACTIVE_WAIT)
    deployed_in = time.monotonic() - started
    assert active["last_error"] is None and active["driver_internal_info"]["iscsi_write"]["format"] == "raw"
    shown = await wait_console(lab, machine, "hostname=", OS_WAIT)
    written = active["driver_internal_info"]["iscsi_write"]
    print(
        f"\nreal VM over iSCSI: deploy request -> active {deployed_in:.1f} s; the conductor wrote "
        f"{written['bytes'] / 2**20:.0f} MiB in {written['seconds']:.1f} s"
    )
    assert shown == f"hostname={hostname}"
    log = Path(machine.serial_log).read_text(errors="replace")
    assert "iscsi target up" in log, "the agent in the VM did not serve its disk"
    assert "reading agent parameters from the virtual floppy" in log, "the agent did not read the floppy"
    assert "ISOLINUX" in log, "SeaBIOS did not boot the virtual CD"
    image = lab["files"].os_image.path.read_bytes()
    with open(machine.disk_path, "rb") as disk:
        disk.seek(1024 * 1024)
        assert disk.read(len(image) - 2 * 1024 * 1024) == image[1024 * 1024 : len(image) - 1024 * 1024]
