"""Issue 23 end to end over REST: a simulated machine driven ONLY by IPMI (the
``ipmi`` hardware type, ipmitool power and management over the simulator's
pyghmi BMC), enrolled with the simulator's ipmi driver_info, managed,
provided, deployed with a raw image and a config drive by the direct deploy
while its serial console is read over IPMI Serial-over-LAN (ipmitool-socat,
through the conductor's console proxy): the agent's start and the booted OS
show on that stream; it boots its OS and finds the config drive; undeploy
powers it off. The
password is masked by the api and not stored in the clear."""

from __future__ import annotations

import asyncio
import base64
import os
import shutil
import time
from typing import Any

import aiohttp
import pytest

from services.common.sealed_values import PREFIX
from services.demo_image import build_demo_image, payload_digest
from services.runtime import ALL_SERVICES_ORDER, RunningStack
from services.simulator.options import SimulatorOptions
from services.simulator.service import Simulator
from tests.conftest import test_settings
from tests.restclient import call, wait_state

USER, PASSWORD = "ipmi-admin", "ipmi-deploy-pw"

pytestmark = [
    pytest.mark.timeout(180),
    pytest.mark.skipif(shutil.which("ipmitool") is None, reason="ipmitool is not installed (scripts/bootstrap.sh)"),
]


@pytest.fixture(scope="module")
async def env(database_url: str, tmp_path_factory: pytest.TempPathFactory) -> Any:
    tmp = tmp_path_factory.mktemp("ipmi-deploy")
    key_file = tmp / "secret.keys"  # secrets at rest sealed, as in test_secrets_at_rest.py
    key_file.write_text(f"k1:{base64.b64encode(os.urandom(32)).decode()}\n")
    key_file.chmod(0o600)
    settings = test_settings(
        database_url,
        tmp / "state",
        conductor={
            "hostname": "ipmi-conductor",
            "deploy_callback_timeout": 30.0,
            "automated_clean": False,
            "ipmi_poll_interval": 0.1,
            "ipmi_timeout": 5.0,
            "enabled_console_interfaces": ("no-console", "ipmitool-socat"),
        },
        security={"secret_key_file": str(key_file)},
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
            ipmi=True,
        ).validate()
    )
    await simulator.start()
    session = aiohttp.ClientSession()
    try:
        yield {
            "stack": stack,
            "sim": simulator,
            "api": stack.endpoints["api REST (Ironic v1)"],
            "tmp": tmp,
            "session": session,
            "conductor": next(s for s in stack.services if s.name == "conductor"),
        }
    finally:
        await session.close()
        await stack.close()
        await simulator.stop()


async def provision(env: dict[str, Any], uuid: str, target: str, state: str, **body: Any) -> dict[str, Any]:
    await call(env, "PUT", f"/v1/nodes/{uuid}/states/provision", {"target": target, **body}, expect=202)
    return await wait_state(env, uuid, state, timeout=60)


async def test_deploy_and_undeploy_over_ipmi_only(env: dict[str, Any]) -> None:
    started = time.monotonic()
    sim, machine = env["sim"], env["sim"].machines[0]
    store = env["conductor"].objectstore
    image = build_demo_image(env["tmp"] / "images", size_mib=16, marker="ipmi deploy")
    await store.put_file("ipmi", "disk.raw", image.path)
    await store.put_bytes("ipmi", "kernel", b"k")
    kernel = await store.temp_url("ipmi", "kernel", lifetime=600)
    driver_info = {**sim.ipmi_driver_info(machine), "deploy_kernel": kernel, "deploy_ramdisk": kernel}
    _, node = await call(
        env,
        "POST",
        "/v1/nodes",
        {
            "name": machine.name,
            "driver": "ipmi",
            "console_interface": "ipmitool-socat",
            "driver_info": driver_info,
            "instance_info": {
                "image_source": await store.temp_url("ipmi", "disk.raw", lifetime=600),
                "image_os_hash_algo": "sha256",
                "image_os_hash_value": image.sha256,
                "image_disk_format": "raw",
            },
        },
        expect=201,
    )
    uuid = node["uuid"]
    # The type's defaults: ipmitool power and management, ipxe boot, direct deploy.
    assert (node["power_interface"], node["management_interface"]) == ("ipmitool", "ipmitool")
    assert (node["boot_interface"], node["deploy_interface"]) == ("ipxe", "direct")
    assert node["driver_info"]["ipmi_password"] == "******"
    assert node["driver_info"]["ipmi_port"] == driver_info["ipmi_port"]
    stored = await env["stack"].pool.fetchrow(
        "SELECT driver_info, driver_info::text AS text FROM nodes WHERE uuid = $1::uuid", uuid
    )
    assert PASSWORD not in stored["text"], "ipmi_password is stored in the clear"
    assert stored["driver_info"]["ipmi_password"].startswith(PREFIX)  # sealed like redfish_password
    assert stored["driver_info"]["ipmi_username"] == USER  # not a secret: as sent

    _, validation = await call(env, "GET", f"/v1/nodes/{uuid}/validate", expect=200)
    assert validation["power"]["result"] and validation["management"]["result"], validation
    _, driver = await call(env, "GET", "/v1/drivers/ipmi", expect=200)
    assert driver["name"] == "ipmi", driver

    await call(env, "POST", "/v1/ports", {"node_uuid": uuid, "address": machine.macs[0]}, expect=201)
    await provision(env, uuid, "manage", "manageable")
    await provision(env, uuid, "provide", "available")
    # The serial console over IPMI Serial-over-LAN (ipmitool-socat), read while the deploy runs.
    await call(env, "PUT", f"/v1/nodes/{uuid}/states/console", {"enabled": True}, expect=202)
    deadline = time.monotonic() + 30
    while True:
        _, console = await call(env, "GET", f"/v1/nodes/{uuid}/states/console", expect=200)
        if console["console_enabled"] and console["console_info"]:
            break
        assert time.monotonic() < deadline, console
        await asyncio.sleep(0.1)
    host, port = console["console_info"]["url"].removeprefix("tcp://").rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    seen = bytearray()

    async def read_console() -> None:
        while chunk := await reader.read(4096):
            seen.extend(chunk)

    reading = asyncio.create_task(read_console())
    deadline = time.monotonic() + 15
    while b"SOL Session operational" not in seen:  # ipmitool's banner: the SOL session is up
        assert time.monotonic() < deadline, f"the SOL session never came up: {bytes(seen)!r}"
        await asyncio.sleep(0.05)
    configdrive = {"meta_data": {"hostname": "ipmi-tenant"}, "user_data": "#cloud-config\n"}
    active = await provision(env, uuid, "active", "active", configdrive=configdrive)
    assert active["power_state"] == "power on" and active["last_error"] is None, active["last_error"]

    deadline = time.monotonic() + 30
    while machine.os_report is None:
        assert time.monotonic() < deadline, f"the machine did not boot its disk: {list(machine.boot_log)[-6:]}"
        await asyncio.sleep(0.05)
    drive = machine.os_report.get("config_drive") or {}
    assert drive.get("meta_data", {}).get("hostname") == "ipmi-tenant", machine.os_report
    assert payload_digest(machine.disk_path, image) == payload_digest(image.path, image)
    # Every power change and boot override came over IPMI; nothing used Redfish.
    assert machine.events("power_pending") and all(e["via"] == "ipmi" for e in machine.events("power_pending"))
    overrides = machine.events("boot_override")
    assert overrides and all(e.get("via") == "ipmi" for e in overrides), overrides
    assert [e["target"] for e in overrides][:1] == ["Pxe"], overrides
    # The agent's progress and the booted OS reached the console stream over SOL.
    deadline = time.monotonic() + 15
    while b"os_booted" not in seen:
        assert time.monotonic() < deadline, f"the console showed only: {bytes(seen[-2000:])!r}"
        await asyncio.sleep(0.1)
    text = seen.decode(errors="replace")
    assert text.index("agent_started") < text.index("os_booted"), text[-2000:]
    writer.close()
    reading.cancel()
    await call(env, "PUT", f"/v1/nodes/{uuid}/states/console", {"enabled": False}, expect=202)

    done = await provision(env, uuid, "deleted", "available")
    assert done["power_state"] == "power off" and machine.power_state == "Off"
    _, state = await call(env, "GET", f"/v1/nodes/{uuid}/states", expect=200)
    assert state["power_state"] == "power off"
    took = time.monotonic() - started
    assert took < 60, took
