"""Ferrum's deploy agent driven by the real Ironic 39 (issue 22, item 5).

Ironic runs as its own process (``tests/support/ironic_service.py``: API and
conductor in one, SQLite, fake power and boot, the ``direct`` deploy
interface). Ferrum's agent runs as ``python -m services.agent``, as on a
deploy ramdisk, with a sparse file as its disk. Ironic's conductor boots the
"ramdisk" (fake power) and waits; the agent looks the node up by its port's
MAC, takes the token and heartbeats; Ironic reads the agent's deploy steps,
sends ``write_image`` with the image's HTTP URL and checksum, polls it, reads
the partition UUIDs, powers the machine off through the agent and the node
becomes ``active``. The disk file then holds the image, byte for byte.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from tests.support.ironic_service import IronicService, ensure_ironic_venv, ironic_service

MiB = 1024 * 1024
MAC = "52:54:00:1b:00:01"
REPO = Path(__file__).resolve().parents[2]
HEADERS = {"X-OpenStack-Ironic-API-Version": "1.78"}


def make_image(path: Path) -> bytes:
    """A small GPT whole-disk image with a marker in its one partition."""
    with open(path, "wb") as f:
        f.truncate(8 * MiB)
    subprocess.run(["sgdisk", "-n", "1:2048:+4M", "-c", "1:root", str(path)], check=True, capture_output=True)
    with open(path, "r+b") as f:
        f.seek(2048 * 512)
        f.write(b"FERRUM-AGENT-ON-IRONIC" * 256)
    return path.read_bytes()


@pytest.fixture(scope="module")
async def env(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[dict[str, Any]]:
    bin_dir = await asyncio.to_thread(ensure_ironic_venv)
    tmp = tmp_path_factory.mktemp("ironic")
    image = make_image(tmp / "image.raw")
    app = web.Application()
    app.router.add_static("/images/", tmp)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]  # aiohttp keeps the server private
    with ironic_service(tmp / "ironic", bin_dir) as ironic:
        async with aiohttp.ClientSession(headers=HEADERS) as session:
            yield {
                "ironic": ironic,
                "session": session,
                "tmp": tmp,
                "image": image,
                "image_url": f"http://127.0.0.1:{port}/images/image.raw",
            }
    await runner.cleanup()


async def rest(env: dict[str, Any], method: str, path: str, body: Any = None, expect: int = 200) -> Any:
    ironic: IronicService = env["ironic"]
    async with env["session"].request(method, ironic.url + path, json=body) as response:
        text = await response.text()
        assert response.status == expect, f"{method} {path}: {response.status} {text}"
        return json.loads(text) if text else None


async def wait_state(
    env: dict[str, Any], node: str, wanted: str, agent: subprocess.Popen[bytes] | None = None, timeout: float = 90.0
) -> dict[str, Any]:
    """Poll Ironic until the node is in ``wanted``; fail at once on a failed state, with both logs."""
    deadline = time.monotonic() + timeout
    while True:
        body = await rest(env, "GET", f"/v1/nodes/{node}")
        state = body["provision_state"]
        settled = body["target_provision_state"] is None or wanted == "wait call-back"
        if state == wanted and settled:
            return dict(body)
        if state.endswith("failed") or state == "error" or time.monotonic() > deadline:
            agent_log = (env["tmp"] / "agent.log").read_text(errors="replace")[-3000:] if agent else ""
            raise AssertionError(
                f"{node} is {state} ({body['last_error']})\n--- agent log ---\n{agent_log}\n"
                f"--- ironic log ---\n{env['ironic'].tail(40)}"
            )
        await asyncio.sleep(0.2)


def start_agent(env: dict[str, Any], disk: Path) -> subprocess.Popen[bytes]:
    """Ferrum's agent as a ramdisk runs it: its own process, the machine's MAC and disk."""
    command = [
        sys.executable,
        "-m",
        "services.agent",
        "--api-url",
        env["ironic"].url,
        "--mac",
        MAC,
        "--disk",
        f"{disk},name=/dev/sda,serial=FERRUM-1",
        "--listen-host",
        "127.0.0.1",
        "--listen-port",
        "0",
        "--lookup-interval",
        "0.5",
        "--heartbeat-interval",
        "1",
        "--lookup-timeout",
        "60",
        "--exit-on-power-off",
        "--ports-file",
        str(env["tmp"] / "agent-ports.json"),
    ]
    with open(env["tmp"] / "agent.log", "wb") as log:
        return subprocess.Popen(
            command,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=REPO,
            env={**os.environ, "PYTHONPATH": str(REPO)},
            start_new_session=True,
        )


async def test_ferrum_agent_deploys_for_real_ironic(env: dict[str, Any]) -> None:
    sha = hashlib.sha256(env["image"]).hexdigest()
    node = await rest(
        env,
        "POST",
        "/v1/nodes",
        {
            "driver": "fake-hardware",
            "name": "ferrum-agent-1",
            "deploy_interface": "direct",
            "boot_interface": "fake",
            "management_interface": "noop",
            "instance_info": {
                "image_source": env["image_url"],
                "image_checksum": sha,
                "image_disk_format": "raw",
            },
        },
        expect=201,
    )
    await rest(env, "POST", "/v1/ports", {"node_uuid": node["uuid"], "address": MAC}, expect=201)
    await rest(env, "PUT", f"/v1/nodes/{node['uuid']}/states/provision", {"target": "manage"}, expect=202)
    await wait_state(env, node["uuid"], "manageable")
    await rest(env, "PUT", f"/v1/nodes/{node['uuid']}/states/provision", {"target": "provide"}, expect=202)
    await wait_state(env, node["uuid"], "available")
    await rest(env, "PUT", f"/v1/nodes/{node['uuid']}/states/provision", {"target": "active"}, expect=202)
    await wait_state(env, node["uuid"], "wait call-back")

    disk = env["tmp"] / "disk.img"
    with open(disk, "wb") as f:
        f.truncate(64 * MiB)
    agent = start_agent(env, disk)
    try:
        active = await wait_state(env, node["uuid"], "active", agent)
        # The agent powered the machine off when Ironic asked (standby.power_off) and exited.
        assert await asyncio.to_thread(agent.wait, 10) == 0
    finally:
        if agent.poll() is None:
            agent.terminate()
            agent.wait(10)
    assert active["last_error"] is None
    written = disk.read_bytes()
    assert written[: len(env["image"])] == env["image"]
    assert written[len(env["image"]) :].count(0) == len(written) - len(env["image"])
    log = (env["tmp"] / "agent.log").read_text(errors="replace")
    ironic_log = env["ironic"].log.read_text(errors="replace")
    # Ironic's conductor took the agent's steps and ran write_image through it.
    assert "get_deploy_steps" in ironic_log or "deploy_steps" in ironic_log, ironic_log[-2000:]
    assert "write_image" in log or "execute_deploy_step" in log, log[-2000:]
