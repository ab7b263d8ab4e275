"""The real ironic-python-agent 13 driven by Ferrum's conductor (issue 22, item 5).

IPA runs as a process (``tests/support/ipa_agent.py``) on a machine described
by ``tests/interop/ipa_machine.py``: one NIC with the node's port MAC and a
sparse file as its disk. Ferrum's stack runs in this process with fake power
and the ``direct`` deploy interface. What is checked, each against what IPA
itself did:

* cleaning: IPA looks the node up by MAC, gets the one-time token and
  heartbeats; the conductor reads IPA's clean steps (``clean.get_clean_steps``)
  and runs ``erase_devices_metadata`` (``clean.execute_clean_step``) to
  completion;
* deploying (a second IPA, as after the machine's reboot): the conductor reads
  IPA's deploy steps (``deploy.get_deploy_steps``), sends ``write_image``
  with IPA's hardware manager versions, IPA downloads, verifies and writes the
  image onto the disk file, the conductor reads the partition UUIDs and
  powers the machine off through IPA (``standby.power_off``), and the node
  is ``active`` with the disk byte-identical to the image.
"""

from __future__ import annotations

import asyncio
import hashlib
import subprocess
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from services.runtime import ALL_SERVICES_ORDER, RunningStack
from tests.conftest import test_settings
from tests.restclient import call, wait_state
from tests.support.ipa_agent import IpaProcess, ensure_ipa_venv, ipa_agent

MiB = 1024 * 1024
MAC = "52:54:00:1a:00:01"


def make_image(path: Path) -> bytes:
    """A small GPT whole-disk image with one partition (IPA checks the table after writing)."""
    with open(path, "wb") as f:
        f.truncate(8 * MiB)
    subprocess.run(["sgdisk", "-n", "1:2048:+4M", "-c", "1:root", str(path)], check=True, capture_output=True)
    with open(path, "r+b") as f:
        f.seek(2048 * 512)
        f.write(b"FERRUM-IPA-MARKER" * 256)
    return path.read_bytes()


@pytest.fixture(scope="module")
async def env(database_url: str, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[dict[str, Any]]:
    python = await asyncio.to_thread(ensure_ipa_venv)
    tmp = tmp_path_factory.mktemp("ipa")
    image = make_image(tmp / "image.raw")
    app = web.Application()
    app.router.add_static("/images/", tmp)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]  # aiohttp keeps the server private
    settings = test_settings(
        database_url,
        tmp / "state",
        api={"ramdisk_heartbeat_timeout": 10},  # IPA heartbeats every 3-6 s (its own jitter, 5 s floor when forced)
        conductor={
            "hostname": "ipa-conductor",
            "deploy_callback_timeout": 120.0,
            "clean_callback_timeout": 120.0,
            "timeout_check_interval": 1.0,
            "agent_power_off_timeout": 1.0,
            "erase_devices_priority": 0,
        },
    )
    stack = RunningStack()
    await stack.start(settings, list(ALL_SERVICES_ORDER))
    session = aiohttp.ClientSession()
    try:
        yield {
            "api": stack.endpoints["api REST (Ironic v1)"],
            "session": session,
            "tmp": tmp,
            "image": image,
            "image_url": f"http://127.0.0.1:{port}/images/image.raw",
            "python": python,
        }
    finally:
        await session.close()
        await stack.close()
        await runner.cleanup()


async def node_detail(env: dict[str, Any], name: str) -> dict[str, Any]:
    _, node = await call(env, "GET", f"/v1/nodes/{name}", expect=200)
    return dict(node)


async def wait_for(
    env: dict[str, Any], name: str, wanted: str, ipa: IpaProcess, timeout: float = 90.0
) -> dict[str, Any]:
    """The node in ``wanted`` and unlocked; fails at once on a failed state or a dead IPA, with IPA's log."""
    deadline = time.monotonic() + timeout
    while True:
        node = await node_detail(env, name)
        state = node["provision_state"]
        if state == wanted and node["reservation"] is None:
            return node
        problem = None
        if state.endswith("failed") or state == "error":
            problem = f"{name} is {state}: {node['last_error']}"
        elif ipa.proc.poll() is not None:
            problem = f"IPA exited ({ipa.proc.returncode}) with {name} in {state}"
        elif time.monotonic() > deadline:
            problem = f"{name} still {state} after {timeout}s ({node['last_error']})"
        if problem:
            raise AssertionError(f"{problem}\n--- IPA log ---\n{ipa.tail()}")
        await asyncio.sleep(0.2)


async def test_real_ipa_cleans_and_deploys(env: dict[str, Any]) -> None:
    started = time.monotonic()
    sha = hashlib.sha256(env["image"]).hexdigest()
    _, node = await call(
        env,
        "POST",
        "/v1/nodes",
        {"driver": "fake-hardware", "name": "ipa-1", "deploy_interface": "direct", "boot_interface": "fake"},
        expect=201,
    )
    await call(env, "POST", "/v1/ports", {"node_uuid": node["uuid"], "address": MAC}, expect=201)
    await call(env, "PUT", "/v1/nodes/ipa-1/states/provision", {"target": "manage"}, expect=202)
    await wait_state(env, "ipa-1", "manageable")
    disk = env["tmp"] / "disk.img"
    with open(disk, "wb") as f:
        f.truncate(64 * MiB)

    # Cleaning: the conductor boots the "ramdisk" (fake power) and waits for IPA.
    await call(env, "PUT", "/v1/nodes/ipa-1/states/provision", {"target": "provide"}, expect=202)
    await wait_state(env, "ipa-1", "clean wait")
    with ipa_agent(env["api"], mac=MAC, disk=disk, workdir=env["tmp"] / "ipa-clean", python=env["python"]) as ipa:
        await wait_for(env, "ipa-1", "available", ipa)
        log = ipa.log_text()
    # IPA looked up by MAC, took the token and heartbeated from its own listener.
    assert "Lookup succeeded" in log or "Received lookup results" in log, log[-3000:]
    assert "heartbeat successful" in log
    # The conductor asked IPA for its clean steps and ran erase_devices_metadata on it.
    assert "get_clean_steps" in log and "execute_clean_step" in log
    assert "erase_devices_metadata" in log
    assert "Command execute_clean_step completed" in log or "execute_clean_step" in log
    cleaned = await node_detail(env, "ipa-1")
    assert cleaned["last_error"] is None and cleaned["clean_step"] == {}

    # Deploy: a fresh IPA, as the machine reboots into a new ramdisk.
    await call(
        env,
        "PATCH",
        "/v1/nodes/ipa-1",
        [
            {"op": "add", "path": "/instance_info/image_source", "value": env["image_url"]},
            {"op": "add", "path": "/instance_info/image_os_hash_algo", "value": "sha256"},
            {"op": "add", "path": "/instance_info/image_os_hash_value", "value": sha},
            {"op": "add", "path": "/instance_info/image_disk_format", "value": "raw"},
        ],
        expect=200,
    )
    await call(env, "PUT", "/v1/nodes/ipa-1/states/provision", {"target": "active"}, expect=202)
    await wait_state(env, "ipa-1", "wait call-back")
    with ipa_agent(env["api"], mac=MAC, disk=disk, workdir=env["tmp"] / "ipa-deploy", python=env["python"]) as ipa:
        active = await wait_for(env, "ipa-1", "active", ipa)
        log = ipa.log_text()
        shutdowns = ipa.shutdowns()
    assert active["last_error"] is None
    assert "get_deploy_steps" in log and "execute_deploy_step" in log and "get_partition_uuids" in log
    # IPA's poweroff ran (the shim stands in for the machine going down).
    assert shutdowns == ["poweroff"], log[-3000:]
    assert disk.read_bytes()[: len(env["image"])] == env["image"]
    # The versions IPA reported with its deploy steps, sent back with write_image.
    assert active["driver_internal_info"]["hardware_manager_version"] == {"ferrum_file_disk": "1.0"}
    assert "Mismatched hardware managers versions" not in log
    print(f"real IPA clean + deploy took {time.monotonic() - started:.1f}s")
