"""The direct deploy through every real piece but the machine: the REST api,
the conductor's heartbeat-driven steps, the object store holding the config
drive, and the real deploy agent writing a sparse disk file from a real HTTP
image server. The test plays the machine: it starts the agent when the
conductor has booted the "ramdisk" (fake power), as the simulator does."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from services.agent.agent import Agent, AgentOptions, Disk
from services.runtime import ALL_SERVICES_ORDER, RunningStack
from tests.conftest import test_settings
from tests.restclient import call, wait_state

MiB = 1024 * 1024


def make_image(path: Path) -> bytes:
    """A small GPT whole-disk image with a marker in its one partition."""
    with open(path, "wb") as f:
        f.truncate(8 * MiB)
    subprocess.run(["sgdisk", "-n", "1:2048:+4M", "-c", "1:root", str(path)], check=True, capture_output=True)
    with open(path, "r+b") as f:
        f.seek(2048 * 512)
        f.write(b"FERRUM-ROOT-MARKER" + os.urandom(4096))
    return path.read_bytes()


@pytest.fixture(scope="module")
async def env(database_url: str, tmp_path_factory: pytest.TempPathFactory) -> Any:
    tmp = tmp_path_factory.mktemp("direct")
    image = make_image(tmp / "image.raw")
    app = web.Application()
    app.router.add_static("/images/", tmp)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    image_base = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}/images"  # type: ignore[union-attr]
    settings = test_settings(
        database_url,
        tmp / "state",
        conductor={
            "hostname": "direct-conductor",
            "deploy_callback_timeout": 8.0,
            "timeout_check_interval": 1.0,
            "agent_power_off_timeout": 1.0,
            "enabled_boot_interfaces": ("fake", "ipxe"),
            # The test plays the machine only for deploys: cleaning runs no agent step
            # (tests/integration/test_cleaning_rescue.py cleans on the simulator).
            "erase_devices_metadata_priority": 0,
        },
    )
    stack = RunningStack()
    await stack.start(settings, list(ALL_SERVICES_ORDER))
    session = aiohttp.ClientSession()
    agents: list[Agent] = []
    try:
        yield {
            "stack": stack,
            "api": stack.endpoints["api REST (Ironic v1)"],
            "image": image,
            "image_url": f"{image_base}/image.raw",
            "tmp": tmp,
            "session": session,
            "agents": agents,
        }
    finally:
        for agent in agents:
            await agent.stop()
        await session.close()
        await stack.close()
        await runner.cleanup()


async def enroll(env: dict[str, Any], name: str, mac: str, *, sha256: str) -> dict[str, Any]:
    _, node = await call(
        env,
        "POST",
        "/v1/nodes",
        {
            "driver": "fake-hardware",
            "name": name,
            "deploy_interface": "direct",
            "boot_interface": "fake",
            "instance_info": {
                "image_source": env["image_url"],
                "image_os_hash_algo": "sha256",
                "image_os_hash_value": sha256,
            },
        },
        expect=201,
    )
    await call(env, "POST", "/v1/ports", {"node_uuid": node["uuid"], "address": mac}, expect=201)
    for verb, state in (("manage", "manageable"), ("provide", "available")):
        await call(env, "PUT", f"/v1/nodes/{name}/states/provision", {"target": verb}, expect=202)
        await wait_state(env, name, state)
    return node


async def boot_agent(env: dict[str, Any], mac: str, disk: Path) -> Agent:
    """What the machine does once the deploy ramdisk boots."""
    with open(disk, "wb") as f:
        f.truncate(128 * MiB)
    agent = Agent(
        AgentOptions(
            api_url=env["api"],
            macs=(mac,),
            disks=(Disk(path=str(disk), serial="S1"),),
            heartbeat_interval=0.5,
            lookup_interval=0.2,
        )
    )
    env["agents"].append(agent)
    await agent.start()
    return agent


async def test_deploy_writes_image_and_config_drive(env: dict[str, Any]) -> None:
    sha = hashlib.sha256(env["image"]).hexdigest()
    node = await enroll(env, "direct-1", "52:54:00:d0:00:01", sha256=sha)
    await call(
        env,
        "PUT",
        "/v1/nodes/direct-1/states/provision",
        {
            "target": "active",
            "configdrive": {
                "meta_data": {"hostname": "direct-1", "public_keys": {"k": "ssh-ed25519 AAA"}},
                "user_data": "#cloud-config\n",
            },
        },
        expect=202,
    )
    await wait_state(env, "direct-1", "wait call-back")
    disk = env["tmp"] / "disk-1.img"
    await boot_agent(env, "52:54:00:d0:00:01", disk)
    active = await wait_state(env, "direct-1", "active")
    assert active["last_error"] is None and active["deploy_step"] == {}
    history = [
        r["event"]
        for r in await env["stack"].pool.fetch(
            "SELECT h.event FROM node_history h JOIN nodes n ON n.id = h.node_id WHERE n.uuid = $1::uuid ORDER BY h.id",
            node["uuid"],
        )
    ]
    ran = [e.split()[2] for e in history if e.startswith("deploy step ")]
    assert ran == [
        "deploy.deploy",
        "deploy.write_image",
        "deploy.prepare_instance_boot",
        "deploy.tear_down_agent",
        "deploy.boot_instance",
    ], history
    with open(disk, "rb") as f:
        written = f.read(len(env["image"]))
    # The partition entries change (config-2 added), so compare the payload past the tables.
    assert written[2048 * 512 :] == env["image"][2048 * 512 :]
    table = json.loads(
        subprocess.run(["sfdisk", "--json", str(disk)], check=True, capture_output=True, text=True).stdout
    )
    parts = table["partitiontable"]["partitions"]
    assert len(parts) == 2 and parts[-1].get("name") == "config-2"
    assert (parts[-1]["start"] + parts[-1]["size"]) * 512 > 128 * MiB - 64 * MiB
    info = active["driver_internal_info"]
    assert info.get("deploy_progress", {}).get("bytes_written", 0) >= len(env["image"]) - 2048 * 512
    assert "agent_url" not in info and info.get("agent_secret_token") in (None, "******")
    # The drive went through the object store and the node keeps only a masked URL.
    assert active["instance_info"]["configdrive"] == "******"
    store = conductor(env).objectstore
    assert store is not None, "the stack's conductor must use the stack's object store"
    obj = await store.stat("ironic_configdrive_container", f"configdrive-{node['uuid']}")
    assert obj is not None and obj.size > 0
    await call(env, "PUT", "/v1/nodes/direct-1/states/provision", {"target": "deleted"}, expect=202)
    await wait_state(env, "direct-1", "available")
    assert await store.stat("ironic_configdrive_container", f"configdrive-{node['uuid']}") is None


async def test_bad_checksum_fails_then_redeploys(env: dict[str, Any]) -> None:
    await enroll(env, "direct-2", "52:54:00:d0:00:02", sha256="0" * 64)
    await call(env, "PUT", "/v1/nodes/direct-2/states/provision", {"target": "active"}, expect=202)
    await wait_state(env, "direct-2", "wait call-back")
    first = await boot_agent(env, "52:54:00:d0:00:02", env["tmp"] / "disk-2.img")
    failed = await wait_state(env, "direct-2", "deploy failed")
    assert "checksum" in failed["last_error"].lower() and "'type'" not in failed["last_error"]
    await first.stop()
    sha = hashlib.sha256(env["image"]).hexdigest()
    await call(
        env,
        "PATCH",
        "/v1/nodes/direct-2",
        [{"op": "replace", "path": "/instance_info/image_os_hash_value", "value": sha}],
        expect=200,
    )
    await call(env, "PUT", "/v1/nodes/direct-2/states/provision", {"target": "active"}, expect=202)
    await wait_state(env, "direct-2", "wait call-back")
    await boot_agent(env, "52:54:00:d0:00:02", env["tmp"] / "disk-2b.img")
    await wait_state(env, "direct-2", "active")
    await call(env, "PUT", "/v1/nodes/direct-2/states/provision", {"target": "deleted"}, expect=202)
    node = await wait_state(env, "direct-2", "available")
    assert node["power_state"] == "power off" and node["instance_info"] == {}


async def test_token_rules(env: dict[str, Any]) -> None:
    sha = hashlib.sha256(env["image"]).hexdigest()
    node = await enroll(env, "direct-3", "52:54:00:d0:00:03", sha256=sha)
    status, _ = await call(env, "GET", "/v1/lookup?addresses=52:54:00:d0:00:03")
    assert status == 404  # available: no lookup
    await call(env, "PUT", "/v1/nodes/direct-3/states/provision", {"target": "active"}, expect=202)
    await wait_state(env, "direct-3", "wait call-back")
    status, first = await call(env, "GET", "/v1/lookup?addresses=52:54:00:d0:00:03,not-a-mac", expect=200)
    token = first["config"]["agent_token"]
    assert len(token) >= 32 and first["node"]["uuid"] == node["uuid"]
    _, second = await call(env, "GET", f"/v1/lookup?node_uuid={node['uuid']}", expect=200)
    assert second["config"]["agent_token"] == "******"
    status, _ = await call(env, "GET", "/v1/lookup?addresses=zz")
    assert status == 400
    hb = {"callback_url": "http://127.0.0.1:9/", "agent_version": "9.0"}
    assert (await call(env, "POST", f"/v1/heartbeat/{node['uuid']}", hb))[0] == 400  # no token
    status, body = await call(env, "POST", f"/v1/heartbeat/{node['uuid']}", {**hb, "agent_token": "x" * 43})
    assert status == 400 and "token" in body["error_message"].lower()
    status, _ = await call(
        env, "POST", f"/v1/heartbeat/{node['uuid']}", {**hb, "callback_url": "ftp://x", "agent_token": token}
    )
    assert status == 400
    bad_progress = {**hb, "agent_token": token, "deploy_progress": {"bytes_written": "many"}}
    status, body = await call(env, "POST", f"/v1/heartbeat/{node['uuid']}", bad_progress)
    assert status == 400 and "deploy_progress.bytes_written" in body["error_message"]
    _, unchanged = await call(env, "GET", f"/v1/nodes/{node['uuid']}", expect=200)
    assert "agent_url" not in unchanged["driver_internal_info"]  # the refused heartbeat recorded nothing
    progress = {"stage": "writing", "bytes_written": 4096, "total": None, "rate": 2.5}
    good = {**hb, "agent_token": token, "deploy_progress": progress}
    await call(env, "POST", f"/v1/heartbeat/{node['uuid']}", good, expect=202)
    _, seen = await call(env, "GET", f"/v1/nodes/{node['uuid']}", expect=200)
    stored = seen["driver_internal_info"]["deploy_progress"]
    assert {k: stored[k] for k in progress} == progress and stored["bytes_downloaded"] == 0
    status, body = await call(
        env,
        "POST",
        f"/v1/heartbeat/{node['uuid']}",
        {**hb, "callback_url": "http://127.0.0.1:10/", "agent_token": token},
    )
    assert status == 400 and "callback_url" in body["error_message"]
    # Nothing answers at that callback URL: the deploy fails and says why.
    failed = await wait_state(env, "direct-3", "deploy failed", timeout=60)
    assert "unreachable" in failed["last_error"]


async def test_a_token_stranded_by_a_dead_conductor_is_reissued_once(env: dict[str, Any]) -> None:
    """The conductor that stored the token died before its reply reached the agent (the api
    retries the lookup on the survivor): masking it would lock the ramdisk out until the
    call-back timeout. A token of a live conductor, or one already used, stays masked."""
    sha = hashlib.sha256(env["image"]).hexdigest()
    node = await enroll(env, "direct-strand", "52:54:00:d0:00:0e", sha256=sha)
    await call(env, "PUT", "/v1/nodes/direct-strand/states/provision", {"target": "active"}, expect=202)
    await wait_state(env, "direct-strand", "wait call-back")
    lookup = f"/v1/lookup?node_uuid={node['uuid']}"
    _, first = await call(env, "GET", lookup, expect=200)
    first_token = first["config"]["agent_token"]
    _, again = await call(env, "GET", lookup, expect=200)
    assert again["config"]["agent_token"] == "******"  # issued by this live conductor: masked

    async def issued_by(hostname: str) -> None:
        await env["stack"].pool.execute(
            "UPDATE nodes SET driver_internal_info = driver_internal_info || "
            "jsonb_build_object('agent_token_issuer', $2::text) WHERE uuid = $1::uuid",
            node["uuid"],
            hostname,
        )

    await issued_by("conductor-that-died")  # registered nowhere, so not alive
    _, reissued = await call(env, "GET", lookup, expect=200)
    token = reissued["config"]["agent_token"]
    assert token not in ("******", first_token) and len(token) >= 32
    _, once_more = await call(env, "GET", lookup, expect=200)
    assert once_more["config"]["agent_token"] == "******"  # now this conductor's: masked again
    hb = {"callback_url": "http://127.0.0.1:9/", "agent_version": "9.0"}
    status, _ = await call(env, "POST", f"/v1/heartbeat/{node['uuid']}", {**hb, "agent_token": first_token})
    assert status == 400  # the stranded token is gone
    events = await env["stack"].pool.fetch(
        "SELECT h.event FROM node_history h JOIN nodes n ON n.id = h.node_id WHERE n.uuid = $1::uuid", node["uuid"]
    )
    assert any("token re-issued: conductor conductor-that-died" in row["event"] for row in events)
    await call(env, "POST", f"/v1/heartbeat/{node['uuid']}", {**hb, "agent_token": token}, expect=202)
    await issued_by("conductor-that-died")
    _, used = await call(env, "GET", lookup, expect=200)
    assert used["config"]["agent_token"] == "******"  # an agent used it: never re-issued
    await wait_state(env, "direct-strand", "deploy failed", timeout=60)  # nothing listens at :9


async def test_callback_timeout(env: dict[str, Any]) -> None:
    sha = hashlib.sha256(env["image"]).hexdigest()
    await enroll(env, "direct-4", "52:54:00:d0:00:04", sha256=sha)
    await call(env, "PUT", "/v1/nodes/direct-4/states/provision", {"target": "active"}, expect=202)
    await wait_state(env, "direct-4", "wait call-back")
    failed = await wait_state(env, "direct-4", "deploy failed", timeout=60)  # no agent ever calls back
    assert (
        "Timeout reached while waiting for callback" in failed["last_error"]
        or "timed out" in failed["last_error"].lower()
    )


def conductor(env: dict[str, Any]) -> Any:
    return next(s for s in env["stack"].services if s.name == "conductor")


async def test_openstacksdk_configdrive_reaches_cloud_init(env: dict[str, Any], tmp_path: Path) -> None:
    """Nova's path: the string openstacksdk builds, deployed, read back by cloud-init."""
    import io

    from openstack.baremetal import configdrive as sdk_configdrive

    from services.common.images import iso9660
    from services.common.images.configdrive_partition import read_configdrive_partition
    from tests.unit.test_configdrive import KEY, cloud_init_read

    sha = hashlib.sha256(env["image"]).hexdigest()
    node = await enroll(env, "direct-5", "52:54:00:d0:00:05", sha256=sha)
    value = sdk_configdrive.build(
        {"uuid": node["uuid"], "hostname": "sdk-host", "public_keys": {"0": KEY}},
        user_data=b"#cloud-config\nfinal_message: hello\n",
    )
    value = value.decode() if isinstance(value, bytes) else value
    await call(
        env, "PUT", "/v1/nodes/direct-5/states/provision", {"target": "active", "configdrive": value}, expect=202
    )
    await wait_state(env, "direct-5", "wait call-back")
    disk = env["tmp"] / "disk-5.img"
    await boot_agent(env, "52:54:00:d0:00:05", disk)
    await wait_state(env, "direct-5", "active")
    _part, iso = read_configdrive_partition(disk)
    iso9660.extract_iso(io.BytesIO(iso), tmp_path / "cd")
    v2 = cloud_init_read(tmp_path / "cd")["v2"]
    assert v2["metadata"]["uuid"] == node["uuid"] and v2["metadata"]["local-hostname"] == "sdk-host"
    assert v2["metadata"]["public_keys"] == {"0": KEY}
    assert v2["userdata"] == "#cloud-config\nfinal_message: hello\n"
    # A string this small (a few KiB, under FERRUM_CONDUCTOR_CONFIGDRIVE_UPLOAD_THRESHOLD) stayed in
    # instance_info as sent, as Ironic keeps every drive by default: the agent got it inline, and
    # nothing was uploaded for it or is deleted on tear down.
    assert len(value) < 64 * 1024
    row = await env["stack"].pool.fetchrow("SELECT instance_info FROM nodes WHERE uuid = $1::uuid", node["uuid"])
    assert row["instance_info"]["configdrive"] == value
    store = conductor(env).objectstore
    assert await store.stat("ironic_configdrive_container", f"configdrive-{node['uuid']}") is None


async def test_vfat_configdrive_is_written_by_the_agent(env: dict[str, Any], tmp_path: Path) -> None:
    """Nova's config_drive_format=vfat: the FAT image, labelled config-2, reaches the disk as sent."""
    from services.common.images import configdrive, configdrive_reader
    from services.common.images.configdrive_partition import read_configdrive_partition
    from tests.unit.test_configdrive import vfat_drive

    sha = hashlib.sha256(env["image"]).hexdigest()
    node = await enroll(env, "direct-vfat", "52:54:00:d0:00:0f", sha256=sha)
    drive = vfat_drive(tmp_path)
    body = {"target": "active", "configdrive": configdrive.encode_configdrive(drive)}
    await call(env, "PUT", "/v1/nodes/direct-vfat/states/provision", body, expect=202)
    await wait_state(env, "direct-vfat", "wait call-back")
    disk = env["tmp"] / "disk-vfat.img"
    await boot_agent(env, "52:54:00:d0:00:0f", disk)
    await wait_state(env, "direct-vfat", "active")
    _part, found = read_configdrive_partition(disk)
    assert found == drive
    read = configdrive_reader.read_configdrive(found)
    assert read.hostname == "vfat-host" and node["uuid"]


async def test_mbr_with_four_primaries_fails_clearly(env: dict[str, Any]) -> None:
    image = env["tmp"] / "mbr4.raw"
    with open(image, "wb") as f:
        f.truncate(8 * MiB)
    layout = "label: dos\n" + "".join(f"start={2048 + i * 2048}, size=2048, type=83\n" for i in range(4))
    subprocess.run(
        ["sfdisk", "-q", "--no-reread", "--no-tell-kernel", str(image)],
        input=layout,
        text=True,
        check=True,
        capture_output=True,
    )
    data = image.read_bytes()
    _, node = await call(
        env,
        "POST",
        "/v1/nodes",
        {
            "driver": "fake-hardware",
            "name": "direct-6",
            "deploy_interface": "direct",
            "boot_interface": "fake",
            "instance_info": {
                "image_source": env["image_url"].replace("image.raw", "mbr4.raw"),
                "image_os_hash_algo": "sha256",
                "image_os_hash_value": hashlib.sha256(data).hexdigest(),
            },
        },
        expect=201,
    )
    await call(env, "POST", "/v1/ports", {"node_uuid": node["uuid"], "address": "52:54:00:d0:00:06"}, expect=201)
    for verb, state in (("manage", "manageable"), ("provide", "available")):
        await call(env, "PUT", "/v1/nodes/direct-6/states/provision", {"target": verb}, expect=202)
        await wait_state(env, "direct-6", state)
    await call(
        env,
        "PUT",
        "/v1/nodes/direct-6/states/provision",
        {"target": "active", "configdrive": {"meta_data": {"hostname": "mbr"}}},
        expect=202,
    )
    await wait_state(env, "direct-6", "wait call-back")
    await boot_agent(env, "52:54:00:d0:00:06", env["tmp"] / "disk-6.img")
    failed = await wait_state(env, "direct-6", "deploy failed")
    assert "primary" in failed["last_error"].lower(), failed["last_error"]
    assert failed["instance_info"]["image_source"].endswith("mbr4.raw")  # the record is intact


async def test_object_store_restart_mid_deploy_is_survived(env: dict[str, Any]) -> None:
    """The config drive's object store goes away while the agent works; the agent
    retries the download and the deploy completes once it is back."""
    import dataclasses

    from services.objectstore.service import ObjectStoreService

    stack = env["stack"]
    sha = hashlib.sha256(env["image"]).hexdigest()
    await enroll(env, "direct-7", "52:54:00:d0:00:07", sha256=sha)
    await call(
        env,
        "PUT",
        "/v1/nodes/direct-7/states/provision",
        {"target": "active", "configdrive": {"meta_data": {"hostname": "restart"}}},
        expect=202,
    )
    await wait_state(env, "direct-7", "wait call-back")
    old = next(s for s in stack.services if s.name == "objectstore")
    grpc_port = int(old.grpc_address.rsplit(":", 1)[1])
    http_port = int(old.http_url.rsplit(":", 1)[1])
    await old.stop()
    disk = env["tmp"] / "disk-7.img"
    await boot_agent(env, "52:54:00:d0:00:07", disk)
    await asyncio.sleep(2.0)  # the agent writes the image, then fails to fetch the drive and retries
    _, node = await call(env, "GET", "/v1/nodes/direct-7", expect=200)
    assert node["provision_state"] == "wait call-back", node["last_error"]
    settings = dataclasses.replace(
        old.settings,
        objectstore=dataclasses.replace(old.settings.objectstore, grpc_port=grpc_port, http_port=http_port),
    )
    new = ObjectStoreService(settings, stack.pool)
    await new.start()
    stack.services[stack.services.index(old)] = new
    await wait_state(env, "direct-7", "active", timeout=90)
    from services.common.images.configdrive_partition import read_configdrive_partition

    _part, iso = read_configdrive_partition(disk)
    assert iso[0x8001:0x8006] == b"CD001"


async def test_config_drive_published_for_virtual_media(env: dict[str, Any]) -> None:
    """The hook a virtual-media boot interface uses: the drive as an ISO behind a temp URL."""
    sha = hashlib.sha256(env["image"]).hexdigest()
    node = await enroll(env, "direct-8", "52:54:00:d0:00:08", sha256=sha)
    await call(
        env,
        "PATCH",
        "/v1/nodes/direct-8",
        [{"op": "add", "path": "/instance_info/configdrive", "value": {"meta_data": {"hostname": "vmedia"}}}],
        expect=200,
    )
    manager = conductor(env).manager
    task = await manager.tasks.build_task(await manager.nodes.get(node["uuid"]))
    assert task.publish_configdrive is not None
    url = await task.publish_configdrive(task)
    async with env["session"].get(url) as response:
        assert response.status == 200
        iso = await response.read()
    assert iso[0x8001:0x8006] == b"CD001" and iso[0x8028:0x8030] == b"config-2"
    async with env["session"].get(url + "x") as response:
        assert response.status in (401, 403, 404)  # a tampered URL serves nothing


async def test_a_new_conductor_finishes_a_waiting_deploy(env: dict[str, Any]) -> None:
    """The conductor that booted the ramdisk goes away while the node waits for its
    agent; another one owns the node now, and the agent's calls reach it: nothing
    about the deploy lived in the first conductor."""
    import dataclasses

    from services.conductor.service import ConductorService

    stack = env["stack"]
    sha = hashlib.sha256(env["image"]).hexdigest()
    await enroll(env, "direct-9", "52:54:00:d0:00:09", sha256=sha)
    await call(
        env,
        "PUT",
        "/v1/nodes/direct-9/states/provision",
        {"target": "active", "configdrive": {"meta_data": {"hostname": "handover"}}},
        expect=202,
    )
    await wait_state(env, "direct-9", "wait call-back")
    old = conductor(env)
    await old.stop()
    settings = dataclasses.replace(
        stack.settings, conductor=dataclasses.replace(stack.settings.conductor, hostname="direct-conductor-2")
    )
    new = ConductorService(settings, stack.pool)
    await new.start()
    stack.services[stack.services.index(old)] = new
    disk = env["tmp"] / "disk-9.img"
    await boot_agent(env, "52:54:00:d0:00:09", disk)
    active = await wait_state(env, "direct-9", "active")
    assert active["conductor"] == "direct-conductor-2"
    history = await stack.pool.fetch(
        "SELECT h.conductor, h.event FROM node_history h JOIN nodes n ON n.id = h.node_id "
        "WHERE n.name = 'direct-9' ORDER BY h.id"
    )
    assert {r["conductor"] for r in history if "write_image" in r["event"]} == {"direct-conductor-2"}
    with open(disk, "rb") as f:
        f.seek(2048 * 512)
        assert f.read(18) == b"FERRUM-ROOT-MARKER"
