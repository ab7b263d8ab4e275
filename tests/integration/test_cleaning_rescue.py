"""Issue 21 end to end on the machine simulator: cleaning and rescue that do
their work, over real protocols (REST, Redfish, iPXE scripts from the
renderer, the real agent on sparse-file disks).

- automated cleaning after undeploy leaves no partition table, no config-2
  and no filesystem signature on the disk;
- manual cleaning runs exactly the requested steps and refuses unknown ones
  with a 400 that lists the offered steps, changing nothing;
- a step the agent fails leaves ``clean failed`` naming the step and the
  agent's error; an agent that dies mid-step runs into the clean timeout
  with a last_error that names the step;
- rescue hands the rescue ramdisk a crypt(3) hash that verifies against the
  password (the clear text is stored nowhere), and unrescue boots the
  instance again and returns to ``active``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from services.common.password_hash import verify_password
from services.demo_image import build_demo_image
from services.runtime import ALL_SERVICES_ORDER, RunningStack
from services.simulator.agents import AgentLaunch, real_agent
from services.simulator.disk import inspect_disk
from services.simulator.options import SimulatorOptions
from services.simulator.service import Simulator
from tests.conftest import test_settings
from tests.diskcheck import disk_signatures, find_bytes
from tests.restclient import call, wait_state

USER, PASSWORD = "admin", "clean-secret"
MiB = 1024 * 1024
DISK = 96 * MiB
CLEAN_TIMEOUT = 12.0
# Machine index -> what is wrong with its disk (the agent of that machine sees this path).
HUNG_DISK = 3  # a FIFO: opening it blocks, so the erase step never finishes
BROKEN_DISK = 4  # a directory: the erase step fails at once
ABORTED_DISK = 5  # another FIFO, for abort in clean wait


@pytest.fixture(scope="module")
async def env(database_url: str, tmp_path_factory: pytest.TempPathFactory) -> Any:
    tmp = tmp_path_factory.mktemp("cleaning")
    settings = test_settings(
        database_url,
        tmp / "state",
        conductor={
            "hostname": "clean-conductor",
            "deploy_callback_timeout": 60.0,
            "clean_callback_timeout": CLEAN_TIMEOUT,
            "rescue_callback_timeout": 60.0,
            "timeout_check_interval": 1.0,
        },
    )
    stack = RunningStack()
    await stack.start(settings, list(ALL_SERVICES_ORDER))
    fifos = [tmp / "hung-disk", tmp / "aborted-disk"]
    for fifo in fifos:
        os.mkfifo(fifo)
    (tmp / "broken-disk").mkdir()
    odd_disks = {
        f"{HUNG_DISK}": str(fifos[0]),
        f"{BROKEN_DISK}": str(tmp / "broken-disk"),
        f"{ABORTED_DISK}": str(fifos[1]),
    }
    simulator: Simulator

    def agent_factory(launch: AgentLaunch) -> Any:
        """The real agent; two machines have a disk that hangs or fails."""
        index = next(str(m.index) for m in simulator.machines if m.name == launch.machine)
        if index in odd_disks:
            launch = dataclasses.replace(launch, disk_path=odd_disks[index])
        return real_agent(launch)

    simulator = Simulator(
        SimulatorOptions(
            machines=6,
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
    conductor: Any = next(s for s in stack.services if s.name == "conductor")  # ConductorService: its object store
    image = build_demo_image(tmp / "images", size_mib=24, marker="cleaning")
    await conductor.objectstore.put_file("clean", "disk.raw", image.path)
    await conductor.objectstore.put_bytes("clean", "kernel", b"k")
    try:
        yield {
            "stack": stack,
            "sim": simulator,
            "api": stack.endpoints["api REST (Ironic v1)"],
            "session": session,
            "image_url": await conductor.objectstore.temp_url("clean", "disk.raw", lifetime=1800),
            "image_sha256": image.sha256,
            "kernel": await conductor.objectstore.temp_url("clean", "kernel", lifetime=1800),
        }
    finally:
        await session.close()
        await stack.close()
        await simulator.stop()
        # Release the agent threads still blocked opening the FIFOs.
        for fifo in fifos:
            with contextlib.suppress(OSError):
                os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))


async def enroll(env: dict[str, Any], index: int, *, automated_clean: bool | None = None) -> dict[str, Any]:
    machine = env["sim"].machines[index]
    body: dict[str, Any] = {
        "name": machine.name,
        "driver": "redfish",
        "boot_interface": "ipxe",
        "deploy_interface": "direct",
        "rescue_interface": "agent",
        "driver_info": {
            "redfish_address": env["sim"].redfish_url,
            "redfish_system_id": machine.system_path,
            "redfish_username": USER,
            "redfish_password": PASSWORD,
            "deploy_kernel": env["kernel"],
            "deploy_ramdisk": env["kernel"],
        },
        "instance_info": {
            "image_source": env["image_url"],
            "image_os_hash_algo": "sha256",
            "image_os_hash_value": env["image_sha256"],
        },
    }
    if automated_clean is not None:
        body["automated_clean"] = automated_clean
    _, node = await call(env, "POST", "/v1/nodes", body, expect=201)
    await call(env, "POST", "/v1/ports", {"node_uuid": node["uuid"], "address": machine.macs[0]}, expect=201)
    await provision(env, node["uuid"], "manage", "manageable")
    return node


async def provision(env: dict[str, Any], ident: str, target: str, state: str, **body: Any) -> dict[str, Any]:
    await call(env, "PUT", f"/v1/nodes/{ident}/states/provision", {"target": target, **body}, expect=202)
    return await wait_state(env, ident, state, timeout=180)


async def history(env: dict[str, Any], uuid: str) -> list[str]:
    rows = await env["stack"].pool.fetch(
        "SELECT h.event FROM node_history h JOIN nodes n ON n.id = h.node_id WHERE n.uuid = $1::uuid ORDER BY h.id",
        uuid,
    )
    return [r["event"] for r in rows]


def steps_run(events: list[str]) -> list[str]:
    return [e.split()[2] for e in events if e.startswith("clean step ") and e.endswith(" started")]


async def test_undeploy_cleans_away_table_config_drive_and_filesystem(env: dict[str, Any]) -> None:
    node = await enroll(env, 0)
    machine = env["sim"].machines[0]
    available = await provision(env, node["uuid"], "provide", "available")
    assert available["power_state"] == "power off" and available["clean_step"] == {}
    assert steps_run(await history(env, node["uuid"])) == ["deploy.erase_devices_metadata"]
    await provision(
        env,
        node["uuid"],
        "active",
        "active",
        configdrive={"meta_data": {"hostname": "tenant-1"}, "user_data": "#cloud-config\n"},
    )
    deadline = time.monotonic() + 60
    while machine.os_report is None:
        assert time.monotonic() < deadline, "the machine did not boot its disk"
        await asyncio.sleep(0.1)
    before = inspect_disk(machine.disk_path)
    assert before["table"] == "gpt" and before["config_drive"]["hostname"] == "tenant-1"
    assert find_bytes(machine.disk_path, b"CD001") and disk_signatures(machine.disk_path)

    after = await provision(env, node["uuid"], "deleted", "available")
    assert after["last_error"] is None and after["power_state"] == "power off"
    assert steps_run(await history(env, node["uuid"])) == ["deploy.erase_devices_metadata"] * 2
    report = inspect_disk(machine.disk_path)
    assert report["table"] is None and not report["partitions"] and not report.get("config_drive")
    assert disk_signatures(machine.disk_path) == []
    assert not find_bytes(machine.disk_path, b"CD001"), "the config-2 ISO survived cleaning"
    with open(machine.disk_path, "rb") as disk:  # primary GPT (LBA 1) and backup (last LBA)
        assert disk.read(MiB) == bytes(MiB)
        disk.seek(-MiB, os.SEEK_END)
        assert disk.read(MiB) == bytes(MiB)
    with open(machine.disk_path, "rb") as disk:  # ext4's superblock magic, in the partition
        disk.seek(2 * MiB)
        assert b"ferrum-root" not in disk.read(4 * MiB)


async def test_manual_cleaning_runs_exactly_the_requested_steps(env: dict[str, Any]) -> None:
    node = await enroll(env, 1, automated_clean=False)
    machine = env["sim"].machines[1]
    await provision(env, node["uuid"], "provide", "available")
    with open(machine.disk_path, "r+b") as disk:  # data a whole-disk erase must remove
        disk.seek(40 * MiB)
        disk.write(b"TENANT-DATA" * 1000)
    await provision(env, node["uuid"], "manage", "manageable")

    # Unknown and misnamed steps: 400 listing what is offered, and nothing changes.
    for steps, words in (
        ([{"interface": "deploy", "step": "erase_everything"}], "no interface of the node offers"),
        ([{"interface": "deploy", "step": "erase_devices", "args": {"passes": 3}}], "unexpected arguments passes"),
        ([{"interface": "nonsense", "step": "erase_devices"}], "is not an interface with clean steps"),
    ):
        status, body = await call(
            env, "PUT", f"/v1/nodes/{node['uuid']}/states/provision", {"target": "clean", "clean_steps": steps}
        )
        assert status == 400, body
        assert words in body["error_message"], body
        assert "deploy.erase_devices (priority 0)" in body["error_message"]
        assert "deploy.erase_devices_metadata (priority 99)" in body["error_message"]
        _, unchanged = await call(env, "GET", f"/v1/nodes/{node['uuid']}", expect=200)
        assert unchanged["provision_state"] == "manageable" and unchanged["last_error"] is None

    events_before = len(await history(env, node["uuid"]))
    cleaned = await provision(
        env, node["uuid"], "clean", "manageable", clean_steps=[{"interface": "deploy", "step": "erase_devices"}]
    )
    assert cleaned["last_error"] is None and cleaned["clean_step"] == {}
    assert steps_run((await history(env, node["uuid"]))[events_before:]) == ["deploy.erase_devices"]
    assert not find_bytes(machine.disk_path, b"TENANT-DATA"), "erase_devices left data on the disk"


async def test_a_failing_step_names_the_step_and_the_agent_error(env: dict[str, Any]) -> None:
    node = await enroll(env, BROKEN_DISK)
    await call(env, "PUT", f"/v1/nodes/{node['uuid']}/states/provision", {"target": "provide"}, expect=202)
    failed = await wait_state(env, node["uuid"], "clean failed", timeout=120)
    error = failed["last_error"]
    assert "deploy.erase_devices_metadata" in error and "Is a directory" in error, error
    assert failed["maintenance"] is True and failed["fault"] == "clean failure"
    assert failed["power_state"] == "power off"


async def running_step(env: dict[str, Any], uuid: str) -> dict[str, Any]:
    """Wait until the node is in clean wait with a step sent to its agent."""
    deadline = time.monotonic() + 120
    while True:
        _, current = await call(env, "GET", f"/v1/nodes/{uuid}", expect=200)
        if current["provision_state"] == "clean wait" and current["clean_step"]:
            return current
        assert time.monotonic() < deadline, current
        await asyncio.sleep(0.1)


async def test_an_agent_dying_mid_step_hits_the_clean_timeout(env: dict[str, Any]) -> None:
    node = await enroll(env, HUNG_DISK)
    machine = env["sim"].machines[HUNG_DISK]
    await call(env, "PUT", f"/v1/nodes/{node['uuid']}/states/provision", {"target": "provide"}, expect=202)
    current = await running_step(env, node["uuid"])  # the step is running (and hangs on the disk)
    assert current["clean_step"]["step"] == "erase_devices_metadata"
    await machine.agent.stop()  # the ramdisk dies: no more heartbeats
    failed = await wait_state(env, node["uuid"], "clean failed", timeout=CLEAN_TIMEOUT + 30)
    assert "Timeout reached while cleaning the node" in failed["last_error"]
    assert "Failed on step deploy.erase_devices_metadata" in failed["last_error"]
    assert failed["power_state"] == "power off"


async def test_abort_in_clean_wait_stops_the_ramdisk(env: dict[str, Any]) -> None:
    node = await enroll(env, ABORTED_DISK)
    machine = env["sim"].machines[ABORTED_DISK]
    await call(env, "PUT", f"/v1/nodes/{node['uuid']}/states/provision", {"target": "provide"}, expect=202)
    await running_step(env, node["uuid"])
    await call(env, "PUT", f"/v1/nodes/{node['uuid']}/states/provision", {"target": "abort"}, expect=202)
    aborted = await wait_state(env, node["uuid"], "clean failed", timeout=60)
    assert aborted["last_error"] == (
        "By request, the clean operation was aborted during or after the completion of step "
        '"deploy.erase_devices_metadata"'
    )
    assert aborted["clean_step"] == {} and aborted["maintenance"] is False
    assert aborted["power_state"] == "power off" and machine.power_state == "Off"
    await provision(env, node["uuid"], "manage", "manageable")


async def test_rescue_hands_over_a_verifiable_hash_and_unrescue_returns_to_active(env: dict[str, Any]) -> None:
    node = await enroll(env, 2, automated_clean=False)
    machine = env["sim"].machines[2]
    await provision(env, node["uuid"], "provide", "available")
    await provision(env, node["uuid"], "active", "active")
    status, body = await call(env, "PUT", f"/v1/nodes/{node['uuid']}/states/provision", {"target": "rescue"})
    assert status == 400 and "rescue_password" in body["error_message"]

    secret = "let-me-in-7"
    rescued = await provision(env, node["uuid"], "rescue", "rescue", rescue_password=secret)
    assert rescued["last_error"] is None and rescued["power_state"] == "power on"
    hashed = machine.rescue_password_hash
    assert hashed is not None and hashed.startswith("$5$"), hashed  # sha256-crypt by default, as Ironic
    assert verify_password(secret, hashed) and not verify_password("wrong", hashed)
    row = await env["stack"].pool.fetchrow(
        "SELECT instance_info::text AS i, driver_internal_info::text AS d FROM nodes WHERE uuid = $1::uuid",
        node["uuid"],
    )
    assert secret not in row["i"] and secret not in row["d"]
    assert "hashed_rescue_password" not in rescued["instance_info"]  # dropped once handed over

    booted = len(machine.events("os_booted"))
    unrescued = await provision(env, node["uuid"], "unrescue", "active")
    assert unrescued["last_error"] is None and unrescued["power_state"] == "power on"
    deadline = time.monotonic() + 60
    while len(machine.events("os_booted")) == booted:
        assert time.monotonic() < deadline, "the instance did not boot again after unrescue"
        await asyncio.sleep(0.1)
    assert machine.rescue_password_hash is None


def test_disk_helpers_see_what_they_look_for(tmp_path: Path) -> None:
    """The checks above could fail: they find a GPT and an ISO when there is one."""
    disk = tmp_path / "d.img"
    with open(disk, "wb") as f:
        f.truncate(8 * MiB)
    subprocess.run(["sgdisk", "-n", "1:2048:+4M", str(disk)], check=True, capture_output=True)
    assert find_bytes(str(disk), b"EFI PART") and any(s.startswith("PTTYPE=") for s in disk_signatures(str(disk)))
