"""`ferrum agent` as its own process: settings from a kernel command line
file, lookup + heartbeats against the test api, a command over HTTP, and a
clean exit on standby.power_off."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path

import aiohttp

from services.common.aiohttp_serving import start_http_site
from tests.integration.test_agent_deploy import TOKEN, FakeIronic, wait_for

REPO = Path(__file__).resolve().parents[2]


async def test_agent_process_from_kernel_cmdline(tmp_path: Path) -> None:
    ironic = FakeIronic()
    node = ironic.register("52:54:00:00:00:09")
    runner, port = await start_http_site(ironic.app(), "127.0.0.1", 0)
    disk = tmp_path / "disk.img"
    with open(disk, "wb") as fh:
        fh.truncate(8 * 1024 * 1024)
    cmdline = tmp_path / "cmdline"
    cmdline.write_text(
        f"nofb ipa-api-url=http://127.0.0.1:{port} BOOTIF=01-52-54-00-00-00-09 "
        "ipa-lookup-interval=0.1 ipa-heartbeat-interval=0.2 initrd=deploy_ramdisk\n"
    )
    ports = tmp_path / "ports.json"
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "services.cli",
        "agent",
        "--kernel-cmdline",
        str(cmdline),
        "--disk",
        f"{disk},name=/dev/vda,serial=S9",
        "--listen-port",
        "0",
        "--ports-file",
        str(ports),
        "--exit-on-power-off",
        cwd=str(REPO),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        await wait_for(lambda: ports.exists() and len(ironic.heartbeats) >= 2, 30, "agent process heartbeats")
        url = json.loads(ports.read_text())["agent"]
        assert ironic.heartbeats[0][0] == node["uuid"] and ironic.heartbeats[0][1]["callback_url"] == url
        async with aiohttp.ClientSession() as session:
            async with session.post(
                f"{url}/v1/commands/",
                params={"agent_token": TOKEN},
                json={"name": "poll.get_hardware_info", "params": {}},
            ) as resp:
                inventory = (await resp.json())["command_result"]
            assert inventory["disks"][0] == {
                **inventory["disks"][0],
                "name": "/dev/vda",
                "serial": "S9",
                "size": 8 * 1024 * 1024,
            }
            assert inventory["interfaces"][0]["mac_address"] == "52:54:00:00:00:09"
            async with session.post(
                f"{url}/v1/commands/",
                params={"agent_token": TOKEN, "wait": "true"},
                json={"name": "standby.power_off", "params": {}},
            ) as resp:
                assert (await resp.json())["command_status"] == "SUCCEEDED"
        deadline = time.monotonic() + 20
        while proc.returncode is None and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert proc.returncode == 0
    finally:
        if proc.returncode is None:
            proc.kill()
        await proc.wait()
        await runner.cleanup()


def test_agent_cli_rejects_missing_settings(tmp_path: Path) -> None:
    run = subprocess.run(
        [sys.executable, "-m", "services.cli", "agent", "--api-url", "http://127.0.0.1:1"],
        cwd=str(REPO),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert run.returncode == 2 and "missing: macs, disks" in run.stderr
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "services.cli",
            "agent",
            "--api-url",
            "http://127.0.0.1:1",
            "--mac",
            "52:54:00:00:00:01",
            "--disk",
            f"{tmp_path}/d,colour=red",
        ],
        cwd=str(REPO),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert run.returncode == 2 and "bad --disk field" in run.stderr
