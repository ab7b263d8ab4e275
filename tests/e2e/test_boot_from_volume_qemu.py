"""Boot from volume (seed 004) on a real machine, over REST only.

The machine is a QEMU VM (TCG) behind the simulator's Redfish BMC (QEMU
backend): Ferrum powers it on, its firmware (SeaBIOS + iPXE) network-boots
the renderer's script, and what it boots is not Ferrum's:

- scenario 1: an iSCSI LUN on tgtd (CHAP, an initiator ACL) whose boot
  sector prints a marker through the BIOS;
- scenario 5: Debian's kernel with an initramfs that mounts the NFS root
  named by ``instance_info.nfs_root`` (NFS-Ganesha on 127.0.0.1) and runs the
  export's own init, which prints a marker and writes a file back.

No image is written and no SQL is touched: the node is enrolled, its volume
connector and targets created, and it is deployed and torn down through the
Ironic REST API with ``storage_interface=external``.
"""

from __future__ import annotations

import asyncio
import time
import uuid as uuidlib
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from services.runtime import ALL_SERVICES_ORDER, RunningStack
from services.simulator.options import SimulatorOptions
from services.simulator.service import Simulator
from tests.conftest import test_settings
from tests.e2e import san_target
from tests.e2e.bootfiles import NFS_ROOT_MARKER_PREFIX, NfsBootFiles, ensure_nfs_initramfs, ensure_packages
from tests.e2e.nfs_server import NfsServer, ensure_nfs_packages, running_nfs_server
from tests.fileserver import serving_files
from tests.restclient import call

pytestmark = pytest.mark.timeout(900)
USER, PASSWORD = "admin", "bfv-secret"
BOOT_WAIT = 240.0  # power on -> the volume's marker on the console, under TCG on a shared 2-core box
HISTORY = {"X-OpenStack-Ironic-API-Version": "1.78"}


@pytest.fixture(scope="module")
def nfs_files() -> NfsBootFiles:
    """Packages, Debian's kernel and the NFS-root initramfs, before any stack starts."""
    ensure_packages()
    ensure_nfs_packages()
    return ensure_nfs_initramfs()


@pytest.fixture(scope="module")
def lun(tmp_path_factory: pytest.TempPathFactory) -> Iterator[san_target.SanTarget]:
    with san_target.running_san_target(tmp_path_factory.mktemp("tgt")) as target:
        yield target


@pytest.fixture(scope="module")
def nfs(tmp_path_factory: pytest.TempPathFactory, nfs_files: NfsBootFiles) -> Iterator[NfsServer]:
    with running_nfs_server(tmp_path_factory.mktemp("nfs"), marker=f"bfv-nfs-{uuidlib.uuid4().hex[:12]}") as server:
        yield server


@pytest.fixture(scope="module")
async def lab(
    nfs_files: NfsBootFiles, database_url: str, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[dict[str, Any]]:
    """A stack, one QEMU machine behind the simulator's BMC, and an HTTP server
    for the NFS root's kernel and initramfs (10.0.2.2 from the guest)."""
    tmp = tmp_path_factory.mktemp("bfv-lab")
    settings = test_settings(
        database_url,
        tmp / "state",
        conductor={"hostname": "bfv-conductor", "automated_clean": False},
        ipxe={"api_url": "http://10.0.2.2:6385", "retry_delay": 5},
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
            disk_size=64 * 1024 * 1024,
            name_prefix="bfv-",
            backend="qemu",
        ).validate()
    )
    await simulator.start()
    files = {"/vmlinuz": nfs_files.kernel, "/initrd": nfs_files.initramfs}
    try:
        async with serving_files(files) as port, aiohttp.ClientSession() as session:
            yield {
                "stack": stack,
                "sim": simulator,
                "api": stack.endpoints["api REST (Ironic v1)"],
                "session": session,
                "files_url": f"http://10.0.2.2:{port}",
            }
    finally:
        await stack.close()
        await simulator.stop()


async def reach(lab: dict[str, Any], uuid: str, wanted: str, timeout: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        _, node = await call(lab, "GET", f"/v1/nodes/{uuid}", expect=200)
        if node["provision_state"] == wanted and node["reservation"] is None:
            return node
        assert "failed" not in node["provision_state"], f"{node['provision_state']}: {node['last_error']}"
        assert time.monotonic() < deadline, f"still {node['provision_state']} after {timeout} s ({node['last_error']})"
        await asyncio.sleep(0.5)


async def wait_serial(machine: Any, text: str, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    while True:
        log = Path(machine.serial_log).read_text(errors="replace") if Path(machine.serial_log).exists() else ""
        if text in log:
            return log
        assert time.monotonic() < deadline, f"the console never showed {text!r}; it ends with:\n{log[-3000:]}"
        await asyncio.sleep(1)


async def history(lab: dict[str, Any], uuid: str) -> list[dict[str, Any]]:
    async with lab["session"].get(f"{lab['api']}/v1/nodes/{uuid}/history?detail=True", headers=HISTORY) as r:
        assert r.status == 200, await r.text()
        return list((await r.json())["history"])


async def enrolled(lab: dict[str, Any]) -> str:
    """The machine's node, available, with an iqn connector and no targets (enrolled once per module)."""
    machine = lab["sim"].machines[0]
    status, node = await call(lab, "GET", "/v1/nodes/bfv-vm-0")
    if status == 200:
        return str(node["uuid"])
    body = {
        "name": "bfv-vm-0",
        "driver": "redfish",
        "driver_info": lab["sim"].driver_info(machine),
        "boot_interface": "ipxe",
        "deploy_interface": "direct",
        "storage_interface": "external",
        "properties": {"capabilities": "boot_mode:bios"},
    }
    _, node = await call(lab, "POST", "/v1/nodes", body, expect=201)
    uuid = str(node["uuid"])
    await call(lab, "POST", "/v1/ports", {"node_uuid": uuid, "address": machine.macs[0]}, expect=201)
    connector = {"node_uuid": uuid, "type": "iqn", "connector_id": san_target.INITIATOR_IQN}
    await call(lab, "POST", "/v1/volume/connectors", connector, expect=201)
    await call(lab, "PUT", f"/v1/nodes/{uuid}/states/provision", {"target": "manage"}, expect=202)
    await reach(lab, uuid, "manageable", 60)
    await call(lab, "PUT", f"/v1/nodes/{uuid}/states/provision", {"target": "provide"}, expect=202)
    await reach(lab, uuid, "available", 60)
    return uuid


async def undeploy(lab: dict[str, Any], uuid: str) -> None:
    await call(lab, "PUT", f"/v1/nodes/{uuid}/states/provision", {"target": "deleted"}, expect=202)
    await reach(lab, uuid, "available", 120)


async def test_scenario_1_a_real_vm_san_boots_its_iscsi_volume(lab: dict[str, Any], lun: san_target.SanTarget) -> None:
    machine = lab["sim"].machines[0]
    uuid = await enrolled(lab)
    await call(
        lab,
        "PATCH",
        f"/v1/nodes/{uuid}",
        [{"op": "replace", "path": "/properties/capabilities", "value": "boot_mode:bios,iscsi_boot:true"}],
        expect=200,
    )
    target = {
        "node_uuid": uuid,
        "volume_type": "iscsi",
        "boot_index": 0,
        "volume_id": "san-vol-1",
        "properties": {
            "target_portal": f"10.0.2.2:{lun.port}",
            "target_iqn": lun.iqn,
            "target_lun": lun.lun,
            "auth_method": "CHAP",
            "auth_username": san_target.CHAP_USER,
            "auth_password": san_target.CHAP_SECRET,
        },
    }
    _, created = await call(lab, "POST", "/v1/volume/targets", target, expect=201)
    started = time.monotonic()
    await call(lab, "PUT", f"/v1/nodes/{uuid}/states/provision", {"target": "active"}, expect=202)
    active = await reach(lab, uuid, "active", 120)
    deployed_in = time.monotonic() - started
    assert active["last_error"] is None and active["power_state"] == "power on"
    assert active["instance_info"]["boot_option"] == "netboot"
    assert active["driver_internal_info"]["boot_from_volume"] == created["uuid"]
    log = await wait_serial(machine, san_target.MARKER, BOOT_WAIT)
    booted_in = time.monotonic() - started
    assert "Ferrum: booting from volume san-vol-1 (bios)" in log
    sessions = await asyncio.to_thread(lun.show)
    assert san_target.INITIATOR_IQN in sessions  # iPXE logged in under the connector's IQN
    print(f"\nscenario 1: deploy request -> active {deployed_in:.1f} s, -> SAN boot sector running {booted_in:.1f} s")

    await undeploy(lab, uuid)
    events = [e["event"] for e in await history(lab, uuid) if e["event"].startswith(("detaching", "detached"))]
    assert events == [
        "detaching 1 volume(s) through storage interface external",
        "detached 1 volume(s) through storage interface external",
    ], events
    _, node = await call(lab, "GET", f"/v1/nodes/{uuid}", expect=200)
    assert "boot_from_volume" not in node["driver_internal_info"] and node["instance_info"] == {}
    await call(lab, "DELETE", f"/v1/volume/targets/{created['uuid']}", expect=204)


async def test_scenario_5_a_real_vm_runs_on_its_nfs_root(lab: dict[str, Any], nfs: NfsServer) -> None:
    machine = lab["sim"].machines[0]
    uuid = await enrolled(lab)
    await call(
        lab,
        "PATCH",
        f"/v1/nodes/{uuid}",
        [
            {"op": "replace", "path": "/properties/capabilities", "value": "boot_mode:bios,nfs_boot:true"},
            {
                "op": "add",
                "path": "/instance_info",
                "value": {
                    "kernel": f"{lab['files_url']}/vmlinuz",
                    "ramdisk": f"{lab['files_url']}/initrd",
                    "nfs_root": nfs.nfsroot(),
                    "kernel_append_params": "console=ttyS0",
                },
            },
        ],
        expect=200,
    )
    target = {"node_uuid": uuid, "volume_type": "nfs", "boot_index": 0, "volume_id": "nfs-root-1", "properties": {}}
    _, created = await call(lab, "POST", "/v1/volume/targets", target, expect=201)
    marker = (nfs.export / "ferrum-marker").read_text().strip()
    started = time.monotonic()
    await call(lab, "PUT", f"/v1/nodes/{uuid}/states/provision", {"target": "active"}, expect=202)
    active = await reach(lab, uuid, "active", 120)
    assert active["last_error"] is None and active["instance_info"]["boot_option"] == "netboot"
    log = await wait_serial(machine, NFS_ROOT_MARKER_PREFIX + marker, BOOT_WAIT)
    print(f"\nscenario 5: deploy request -> the NFS root's init running {time.monotonic() - started:.1f} s")
    assert f"nfsroot={nfs.nfsroot()}" in log  # the kernel line the renderer wrote
    deadline = time.monotonic() + 60
    while not (nfs.export / "ferrum-booted").exists():  # the export's init writes it back, then powers off
        assert time.monotonic() < deadline, "the NFS root's init never wrote /ferrum-booted"
        await asyncio.sleep(1)
    await undeploy(lab, uuid)
    await call(lab, "DELETE", f"/v1/volume/targets/{created['uuid']}", expect=204)
