"""Issue 18 end to end on the machine simulator: the ``iscsi`` deploy over
REST, with real protocols all the way (Redfish, iPXE scripts, the real
agent serving its sparse disk file through a real ``tgtd``, and the
conductor writing it with libiscsi inside ``qemu-img``).

- a raw whole-disk image through ``pass_deploy_info`` and the same image
  through heartbeat call-backs, on two machines at once: both disks hold
  the image, both machines boot it and read their config drive, and the
  conductor downloaded the image once (its cache is keyed by content);
- a qcow2 image, converted on its way onto the LUN;
- ``pass_deploy_info`` refusals: no key, a wrong key, a wrong or missing
  iqn, a bad port (400), a node not waiting (409, also a replay after the
  deploy finished), an unknown node (404), and none of them changes the node;
- an ``error`` in ``pass_deploy_info`` fails the deploy with the message in
  ``last_error``; a login that fails does too, and a second deploy succeeds.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from services.agent.iscsi_target import IscsiTarget, TargetSpec
from services.common.iscsi_chap import chap_credentials
from services.demo_image import build_demo_image
from services.runtime import ALL_SERVICES_ORDER, RunningStack
from services.simulator.agents import AgentLaunch, real_agent
from services.simulator.disk import inspect_disk
from services.simulator.options import SimulatorOptions
from services.simulator.service import Simulator
from tests.conftest import test_settings
from tests.restclient import call, wait_state

USER, PASSWORD = "admin", "iscsi-secret"
MiB = 1024 * 1024
DISK = 4 * 1024 * MiB  # sparse; room for a partition image's 1 GiB root and ephemeral
QUIET = {4, 5, 8}  # machines whose first ramdisk boot brings no agent: the test speaks for it


class QuietAgent:
    """A ramdisk that boots and says nothing (the test plays the agent's part)."""

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        return None


@pytest.fixture(scope="module")
async def env(database_url: str, tmp_path_factory: pytest.TempPathFactory) -> Any:
    tmp = tmp_path_factory.mktemp("iscsi")
    settings = test_settings(
        database_url,
        tmp / "state",
        conductor={
            "hostname": "iscsi-conductor",
            "deploy_callback_timeout": 120.0,
            "automated_clean": False,
            "iscsi_stall_timeout": 4.0,  # the cut write fails this soon; healthy writes here take well under 1 s
        },
    )
    stack = RunningStack()
    await stack.start(settings, list(ALL_SERVICES_ORDER))
    simulator: Simulator
    launches: dict[int, int] = {}

    def agent_factory(launch: AgentLaunch) -> Any:
        index = next(m.index for m in simulator.machines if m.name == launch.machine)
        launches[index] = launches.get(index, 0) + 1
        if index in QUIET and launches[index] == 1:
            return QuietAgent()
        return real_agent(launch)

    simulator = Simulator(
        SimulatorOptions(
            machines=9,
            state_dir=str(tmp / "machines"),
            boot_url=stack.endpoints["ipxe HTTP"],
            username=USER,
            password=PASSWORD,
            disk_size=DISK,
            agent_factory=agent_factory,
        ).validate()
    )
    await simulator.start()
    session = aiohttp.ClientSession()
    conductor: Any = next(s for s in stack.services if s.name == "conductor")
    raw = build_demo_image(tmp / "images", size_mib=24, marker="iscsi deploy")
    rootfs = tmp / "images" / "root-partition.img"
    (tmp / "rootfs" / "etc").mkdir(parents=True)
    (tmp / "rootfs" / "etc" / "ferrum-demo").write_text("partition image\n")
    subprocess.run(
        ["mke2fs", "-q", "-F", "-t", "ext4", "-L", "instance-root", "-d", str(tmp / "rootfs"), str(rootfs), "32M"],
        check=True,
    )
    await conductor.objectstore.put_file("iscsi", "root.img", rootfs)
    qcow2 = tmp / "images" / "demo-disk.qcow2"
    subprocess.run(["qemu-img", "convert", "-f", "raw", "-O", "qcow2", str(raw.path), str(qcow2)], check=True)
    await conductor.objectstore.put_file("iscsi", "disk.raw", raw.path)
    await conductor.objectstore.put_file("iscsi", "disk.qcow2", qcow2)
    await conductor.objectstore.put_bytes("iscsi", "kernel", b"k")
    try:
        yield {
            "stack": stack,
            "sim": simulator,
            "conductor": conductor,
            "api": stack.endpoints["api REST (Ironic v1)"],
            "session": session,
            "raw": raw.path,
            "raw_url": await conductor.objectstore.temp_url("iscsi", "disk.raw", lifetime=1800),
            "raw_sha256": raw.sha256,
            "qcow2_url": await conductor.objectstore.temp_url("iscsi", "disk.qcow2", lifetime=1800),
            "qcow2_sha256": hashlib.sha256(qcow2.read_bytes()).hexdigest(),
            "kernel": await conductor.objectstore.temp_url("iscsi", "kernel", lifetime=1800),
            "rootfs": rootfs,
            "rootfs_url": await conductor.objectstore.temp_url("iscsi", "root.img", lifetime=1800),
            "rootfs_sha256": hashlib.sha256(rootfs.read_bytes()).hexdigest(),
        }
    finally:
        await session.close()
        await stack.close()
        await simulator.stop()


async def enroll(
    env: dict[str, Any],
    index: int,
    *,
    image: str = "raw",
    callback: str = "",
    instance: dict[str, Any] | None = None,
    deploy: str = "iscsi",
) -> dict[str, Any]:
    machine = env["sim"].machines[index]
    driver_info = {
        "redfish_address": env["sim"].redfish_url,
        "redfish_system_id": machine.system_path,
        "redfish_username": USER,
        "redfish_password": PASSWORD,
        "deploy_kernel": env["kernel"],
        "deploy_ramdisk": env["kernel"],
    }
    if callback:
        driver_info["iscsi_callback"] = callback
    body: dict[str, Any] = {
        "name": machine.name,
        "driver": "redfish",
        "boot_interface": "ipxe",
        "deploy_interface": deploy,
        "driver_info": driver_info,
        "instance_info": {
            "image_source": env[f"{image}_url"],
            "image_disk_format": image,
            "image_os_hash_algo": "sha256",
            "image_os_hash_value": env[f"{image}_sha256"],
            **(instance or {}),
        },
    }
    _, node = await call(env, "POST", "/v1/nodes", body, expect=201)
    await call(env, "POST", "/v1/ports", {"node_uuid": node["uuid"], "address": machine.macs[0]}, expect=201)
    await provision(env, node["uuid"], "manage", "manageable")
    await provision(env, node["uuid"], "provide", "available")
    return node


async def provision(env: dict[str, Any], ident: str, target: str, state: str, **body: Any) -> dict[str, Any]:
    await call(env, "PUT", f"/v1/nodes/{ident}/states/provision", {"target": target, **body}, expect=202)
    return await wait_state(env, ident, state, timeout=180)


async def booted(machine: Any) -> dict[str, Any]:
    deadline = time.monotonic() + 60
    while machine.os_report is None:
        assert time.monotonic() < deadline, f"the machine did not boot: {list(machine.boot_log)[-6:]}"
        await asyncio.sleep(0.1)
    return dict(machine.os_report)


def disk_starts_with(disk_path: str, image: Path) -> bool:
    """The disk holds the image (outside the first and last MiB, where the
    config drive's partition entry and the moved backup GPT differ)."""
    expected = image.read_bytes()
    with open(disk_path, "rb") as disk:
        disk.seek(MiB)
        return disk.read(len(expected) - 2 * MiB) == expected[MiB : len(expected) - MiB]


async def internal_info(env: dict[str, Any], uuid: str) -> dict[str, Any]:
    """driver_internal_info as the conductor sees it (decrypted): where the deploy key is."""
    node = await env["conductor"].manager.nodes.get(uuid)
    return dict(node["driver_internal_info"])


async def pass_deploy_info(env: dict[str, Any], ident: str, body: Any) -> tuple[int, Any]:
    return await call(env, "POST", f"/v1/nodes/{ident}/vendor_passthru/pass_deploy_info", body)


async def test_raw_image_by_pass_deploy_info_and_by_heartbeat(env: dict[str, Any]) -> None:
    seed, beat = await asyncio.gather(enroll(env, 0), enroll(env, 1, callback="heartbeat"))
    cache = env["conductor"].manager.image_cache
    downloads = cache.downloads
    configdrive = {"meta_data": {"hostname": "iscsi-tenant"}, "user_data": "#cloud-config\n"}
    done = await asyncio.gather(
        provision(env, seed["uuid"], "active", "active", configdrive=configdrive),
        provision(env, beat["uuid"], "active", "active", configdrive=configdrive),
    )
    for node, index in zip(done, (0, 1), strict=True):
        machine = env["sim"].machines[index]
        assert node["last_error"] is None and node["power_state"] == "power on"
        info = node["driver_internal_info"]
        assert not any(key.startswith("iscsi_deploy_key") or key == "iscsi_portal" for key in info), info
        assert info["iscsi_write"]["format"] == "raw" and info["iscsi_write"]["disk_bytes"] == DISK
        assert disk_starts_with(machine.disk_path, env["raw"]), "the disk does not hold the image"
        report = await booted(machine)
        assert report, report
        disk = inspect_disk(machine.disk_path)
        assert disk["table"] == "gpt" and disk["config_drive"]["hostname"] == "iscsi-tenant", disk
    assert cache.downloads - downloads <= 1, "the shared image was downloaded more than once"
    assert (cache.directory / f"sha256-{env['raw_sha256']}").exists()
    events = await env["stack"].pool.fetch(
        "SELECT h.event FROM node_history h JOIN nodes n ON n.id = h.node_id WHERE n.uuid = $1::uuid",
        seed["uuid"],
    )
    assert any("exposed its disk" in r["event"] for r in events), [r["event"] for r in events]

    # A replay after the deploy finished: refused, and the node is unchanged.
    status, body = await pass_deploy_info(
        env, seed["uuid"], {"key": "x" * 43, "address": "127.0.0.1", "iqn": "iqn.2008-10.org.openstack:x"}
    )
    assert status == 409 and "not waiting for deploy information" in body["error_message"], body
    _, again = await call(env, "GET", f"/v1/nodes/{seed['uuid']}", expect=200)
    assert again["provision_state"] == "active" and again["last_error"] is None


async def test_qcow2_image_is_converted_onto_the_lun(env: dict[str, Any]) -> None:
    node = await enroll(env, 2, image="qcow2", callback="heartbeat")
    done = await provision(env, node["uuid"], "active", "active")
    assert done["last_error"] is None
    assert done["driver_internal_info"]["iscsi_write"]["format"] == "qcow2"
    machine = env["sim"].machines[2]
    assert disk_starts_with(machine.disk_path, env["raw"])
    assert await booted(machine)


async def test_pass_deploy_info_refusals_change_nothing(env: dict[str, Any]) -> None:
    node = await enroll(env, 4)
    uuid = node["uuid"]
    await call(env, "PUT", f"/v1/nodes/{uuid}/states/provision", {"target": "active"}, expect=202)
    await wait_state(env, uuid, "wait call-back", timeout=60)
    info = await internal_info(env, uuid)
    key, iqn = info["iscsi_deploy_key"], info["iscsi_target_iqn"]
    _, shown = await call(env, "GET", f"/v1/nodes/{uuid}", expect=200)
    assert shown["driver_internal_info"]["iscsi_deploy_key"] == "******", "the deploy key is shown"

    cases: list[tuple[Any, int, str]] = [
        ({"address": "127.0.0.1", "iqn": iqn}, 400, "deploy key"),
        ({"key": "wrong-" + key[6:], "address": "127.0.0.1", "iqn": iqn}, 400, "Deploy key does not match"),
        ({"key": key, "address": "127.0.0.1"}, 400, "lacks iqn"),
        ({"key": key, "iqn": iqn}, 400, "lacks address"),
        ({"key": key, "address": "127.0.0.1", "iqn": iqn + "x"}, 400, "not the target of this deploy"),
        ({"key": key, "address": "127.0.0.1", "iqn": iqn, "port": 70000}, 400, "TCP port"),
        ({"key": key, "address": "127.0.0.1", "iqn": iqn, "sneaky": 1}, 400, "Unknown argument"),
        (["not", "an", "object"], 400, "JSON object"),
    ]
    for body, status, words in cases:
        got, answer = await pass_deploy_info(env, uuid, body)
        assert got == status and words in answer["error_message"], (body, got, answer)
    got, answer = await pass_deploy_info(env, "00000000-0000-4000-8000-000000000000", {"key": key})
    assert got == 404, answer
    after = await internal_info(env, uuid)
    assert after.get("iscsi_portal") is None and after["iscsi_deploy_key"] == key
    _, current = await call(env, "GET", f"/v1/nodes/{uuid}", expect=200)
    assert current["provision_state"] == "wait call-back" and current["last_error"] is None

    # The ramdisk's own error fails the deploy with its message.
    got, answer = await pass_deploy_info(env, uuid, {"key": key, "iqn": iqn, "error": "tgtd: no disk found"})
    assert got == 200, answer
    failed = await wait_state(env, uuid, "deploy failed", timeout=60)
    assert "tgtd: no disk found" in failed["last_error"], failed["last_error"]
    assert "iscsi_deploy_key" not in (await internal_info(env, uuid))


async def test_a_failed_login_fails_the_deploy_and_a_second_deploy_succeeds(env: dict[str, Any]) -> None:
    node = await enroll(env, 5)
    uuid = node["uuid"]
    await call(env, "PUT", f"/v1/nodes/{uuid}/states/provision", {"target": "active"}, expect=202)
    await wait_state(env, uuid, "wait call-back", timeout=60)
    info = await internal_info(env, uuid)
    # The quiet ramdisk "exposes" its disk where nothing listens; the conductor
    # can only continue once an agent has called back, so point it at one.
    await env["conductor"].manager.nodes.merge_internal_info(
        uuid, {"agent_url": "http://127.0.0.1:9", "deploy_phase": "iscsi_target"}
    )
    got, answer = await pass_deploy_info(
        env, uuid, {"key": info["iscsi_deploy_key"], "iqn": info["iscsi_target_iqn"], "address": "127.0.0.1", "port": 9}
    )
    assert got == 200, answer
    failed = await wait_state(env, uuid, "deploy failed", timeout=90)
    assert "Logging in to the iSCSI target" in failed["last_error"], failed["last_error"]

    done = await provision(env, uuid, "active", "active")
    assert done["last_error"] is None
    assert disk_starts_with(env["sim"].machines[5].disk_path, env["raw"])


PARTITIONED = {
    "image_disk_format": "raw",
    "root_gb": 1,
    "swap_mb": 64,
    "ephemeral_gb": 1,
    "ephemeral_format": "ext4",
}


@pytest.mark.parametrize(("index", "deploy"), [(3, "iscsi"), (6, "direct")])
async def test_partition_image_with_root_swap_ephemeral_and_config_drive(
    env: dict[str, Any], index: int, deploy: str
) -> None:
    """Nova's flavor on a partition image, by either deploy interface (one
    layout code): ephemeral, swap, config drive and root (last) partitions,
    the image in root, and the instance kernel netbooted with root=UUID= of
    that file system."""
    node = await enroll(
        env,
        index,
        deploy=deploy,
        image="rootfs",
        instance={**PARTITIONED, "kernel": env["kernel"], "ramdisk": env["kernel"]},
    )
    done = await provision(
        env, node["uuid"], "active", "active", configdrive={"meta_data": {"hostname": "partitioned"}}
    )
    assert done["last_error"] is None, done["last_error"]
    info = done["driver_internal_info"]
    assert info["is_whole_disk_image"] is False
    if deploy == "iscsi":
        assert info["iscsi_write"]["partitions"] == {"ephemeral": 1, "swap": 2, "config_drive": 3, "root": 4}
    machine = env["sim"].machines[index]
    report = await booted(machine)
    assert report.get("netboot") and f"root=UUID={info['root_uuid_or_disk_id']}" in report["cmdline"], report
    parts = {p["number"]: p for p in report["partitions"]}
    assert report["table"] == "mbr" and sorted(parts) == [1, 2, 3, 4], report
    assert parts[1]["size"] == 1024 * MiB and parts[1]["filesystem"] == "ext" and parts[1]["label"] == "ephemeral0"
    assert parts[2]["size"] == 64 * MiB and parts[2]["filesystem"] == "swap"
    assert parts[3]["filesystem"] == "iso9660" and report["config_drive"]["hostname"] == "partitioned"
    assert parts[4]["size"] == 1024 * MiB and parts[4]["label"] == "instance-root"
    assert report["root"]["number"] == 4
    image = env["rootfs"].read_bytes()
    with open(machine.disk_path, "rb") as disk:
        disk.seek(parts[4]["start"])
        assert disk.read(len(image)) == image, "the root partition does not hold the image"


async def test_partition_image_refusals(env: dict[str, Any]) -> None:
    """A partition image without a kernel to netboot, a flavor larger than the
    disk, or an unknown ephemeral format: 400 before anything runs."""
    _, node = await call(
        env,
        "POST",
        "/v1/nodes",
        {
            "driver": "redfish",
            "deploy_interface": "iscsi",
            "boot_interface": "ipxe",
            "driver_info": {
                "redfish_address": env["sim"].redfish_url,
                "redfish_system_id": env["sim"].machines[0].system_path,
                "deploy_kernel": env["kernel"],
                "deploy_ramdisk": env["kernel"],
            },
            "instance_info": {
                "image_source": env["rootfs_url"],
                "image_os_hash_algo": "sha256",
                "image_os_hash_value": env["rootfs_sha256"],
                "image_type": "partition",
                "root_gb": 1,
            },
        },
        expect=201,
    )
    _, checked = await call(env, "GET", f"/v1/nodes/{node['uuid']}/validate", expect=200)
    assert checked["deploy"]["result"] is False and "netboot" in checked["deploy"]["reason"], checked["deploy"]
    await call(
        env,
        "PATCH",
        f"/v1/nodes/{node['uuid']}",
        [
            {"op": "add", "path": "/instance_info/kernel", "value": env["kernel"]},
            {"op": "add", "path": "/instance_info/ramdisk", "value": env["kernel"]},
            {"op": "add", "path": "/instance_info/ephemeral_format", "value": "ntfs"},
        ],
        expect=200,
    )
    _, checked = await call(env, "GET", f"/v1/nodes/{node['uuid']}/validate", expect=200)
    assert checked["deploy"]["result"] is False and "ephemeral_format" in checked["deploy"]["reason"]


async def test_a_target_lost_mid_deploy_fails_clearly_and_a_second_deploy_succeeds(env: dict[str, Any]) -> None:
    """The ramdisk's tgtd dies while the conductor works on the disk (a crashed
    target, a pulled cable): the deploy fails naming the iSCSI target, and a
    new deploy boots a new ramdisk, a new target, and succeeds."""
    node = await enroll(env, 7, image="qcow2")
    uuid = node["uuid"]
    machine = env["sim"].machines[7]
    await call(env, "PUT", f"/v1/nodes/{uuid}/states/provision", {"target": "active"}, expect=202)
    deadline = time.monotonic() + 60
    while True:
        agent = machine.agent
        target = getattr(agent, "iscsi_target", None)
        if target is not None and target.pid is not None:
            break
        assert time.monotonic() < deadline, "the agent never exposed its disk"
        await asyncio.sleep(0.005)
    os.kill(target.pid, signal.SIGKILL)
    failed = await wait_state(env, uuid, "deploy failed", timeout=90)
    assert "iSCSI" in failed["last_error"], failed["last_error"]
    assert "iscsi_deploy_key" not in (await internal_info(env, uuid))

    done = await provision(env, uuid, "active", "active")
    assert done["last_error"] is None
    assert disk_starts_with(machine.disk_path, env["raw"])


class CuttingProxy:
    """A TCP relay to an iSCSI portal that cuts the write midway: the ``cut_at``-th
    connection (1 = the conductor's size probe, 2 = the partition table, 3 = the root
    file system) is closed once it has carried ``after`` bytes towards the target,
    and every connection after that is refused, as when a cable is pulled."""

    def __init__(self, port: int, *, cut_at: int, after: int) -> None:
        self.port, self.cut_at, self.after = port, cut_at, after
        self.connections = 0
        self.cut = False
        self.server: asyncio.Server | None = None

    async def start(self) -> int:
        self.server = await asyncio.start_server(self._relay, "127.0.0.1", 0)
        return int(self.server.sockets[0].getsockname()[1])

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        number = self.connections
        if self.cut:
            writer.close()
            return
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.port)

        async def pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter, counted: bool) -> None:
            sent = 0
            while data := await src.read(65536):
                dst.write(data)
                await dst.drain()
                sent += len(data)
                if counted and number == self.cut_at and sent >= self.after:
                    self.cut = True
                    if self.server is not None:
                        self.server.close()  # reconnects are refused from now on
                    return
            return

        try:
            await asyncio.wait(
                [
                    asyncio.ensure_future(pump(reader, up_writer, True)),
                    asyncio.ensure_future(pump(up_reader, writer, False)),
                ],
                return_when=asyncio.FIRST_COMPLETED,
            )
        except (ConnectionError, OSError):
            pass
        finally:
            for w in (writer, up_writer):
                w.transport.abort()


async def test_a_partition_write_cut_midway_fails_the_deploy_and_a_second_deploy_succeeds(
    env: dict[str, Any], tmp_path: Path
) -> None:
    """Issue 18: the connection carrying the root file system drops midway (the
    ramdisk's side plays the agent: a real tgtd behind a relay that cuts it). The
    deploy fails naming the iSCSI write, and a new deploy (a real agent) succeeds."""
    node = await enroll(
        env, 8, image="rootfs", instance={**PARTITIONED, "kernel": env["kernel"], "ramdisk": env["kernel"]}
    )
    uuid = node["uuid"]
    await call(env, "PUT", f"/v1/nodes/{uuid}/states/provision", {"target": "active"}, expect=202)
    await wait_state(env, uuid, "wait call-back", timeout=60)
    info = await internal_info(env, uuid)
    user, password = chap_credentials(info["iscsi_deploy_key"], uuid)
    backing = tmp_path / "ramdisk-disk.img"
    with open(backing, "wb") as disk:
        disk.truncate(DISK)
    target = IscsiTarget(
        TargetSpec(
            iqn=info["iscsi_target_iqn"],
            backing_path=str(backing),
            chap_username=user,
            chap_password=password,
            initiator_iqn="",
        ),
        work_dir=str(tmp_path),
    )
    portal = await target.start()
    proxy = CuttingProxy(portal.port, cut_at=3, after=256 * 1024)
    try:
        port = await proxy.start()
        await env["conductor"].manager.nodes.merge_internal_info(
            uuid, {"agent_url": "http://127.0.0.1:9", "deploy_phase": "iscsi_target"}
        )
        got, answer = await pass_deploy_info(
            env,
            uuid,
            {"key": info["iscsi_deploy_key"], "iqn": info["iscsi_target_iqn"], "address": "127.0.0.1", "port": port},
        )
        assert got == 200, answer
        failed = await wait_state(env, uuid, "deploy failed", timeout=90)
    finally:
        if proxy.server is not None:
            proxy.server.close()
        await target.stop()
    assert proxy.cut, f"the relay never cut the write ({proxy.connections} connections)"
    assert "Writing the image to the iSCSI target" in failed["last_error"], failed["last_error"]
    assert "stalled" in failed["last_error"], failed["last_error"]
    assert info["iscsi_target_iqn"] in failed["last_error"]
    assert "iscsi_deploy_key" not in (await internal_info(env, uuid))

    done = await provision(env, uuid, "active", "active")
    assert done["last_error"] is None, done["last_error"]
    assert done["driver_internal_info"]["iscsi_write"]["partitions"] == {"ephemeral": 1, "swap": 2, "root": 3}
