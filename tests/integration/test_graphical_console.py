"""The ``redfish-graphical`` console end to end (issue 23): REST on an in-process
stack, the conductor's relay, and a QEMU-backed simulated machine whose BMC
advertises QEMU's VNC server as its Redfish GraphicalConsole.

- enabling while the VM is off is refused (the BMC says ServiceEnabled false),
  with the reason in ``last_error``;
- powered on, enabling answers ``console_info`` type ``vnc``; a VNC client
  through the raw TCP relay and another through the WebSocket each complete a
  real RFB handshake (version banner, security type None, ServerInit) with
  QEMU and read the VM's name as the desktop name: one BMC connection each;
- a machine whose BMC has no GraphicalConsole is refused clearly, changing
  nothing; disabling closes the relay and its clients.
"""

from __future__ import annotations

import asyncio
import json
import struct
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import pytest

from services.runtime import ALL_SERVICES_ORDER, RunningStack
from services.simulator import Simulator, SimulatorOptions
from services.simulator.qemu_machine import QemuMachine
from tests.conftest import test_settings

V = {"X-OpenStack-Ironic-API-Version": "1.56"}

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
async def env(database_url: str, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("graphical")
    settings = test_settings(
        database_url,
        tmp / "state",
        conductor={
            "hostname": "graphical-conductor-1",
            "enabled_console_interfaces": ("no-console", "redfish-graphical"),
            "console_max_clients": 2,
            "redfish_poll_interval": 0.1,
        },
    )
    stack = RunningStack()
    await stack.start(settings, list(ALL_SERVICES_ORDER))
    vms = Simulator(
        SimulatorOptions(
            machines=1,
            state_dir=str(tmp / "vms"),
            boot_url="http://127.0.0.1:9/boot.ipxe",
            disk_size=16 * 1024**2,
            backend="qemu",
            qemu_memory_mib=128,
            boot_order=("Hdd",),
        )
    )
    plain = Simulator(SimulatorOptions(machines=1, state_dir=str(tmp / "plain"), disk_size=1024**2))
    await vms.start()
    await plain.start()
    session = aiohttp.ClientSession()
    try:
        yield {
            "stack": stack,
            "vms": vms,
            "plain": plain,
            "api": stack.endpoints["api REST (Ironic v1)"],
            "session": session,
        }
    finally:
        await session.close()
        await stack.close()
        await vms.stop()
        await plain.stop()


async def call(env: dict[str, Any], method: str, path: str, body: Any = None) -> tuple[int, Any]:
    async with env["session"].request(method, env["api"] + path, json=body, headers=V) as r:
        text = await r.text()
        return r.status, (json.loads(text) if text else None)


def fault(body: dict[str, Any]) -> str:
    return str(json.loads(body["error_message"])["faultstring"])


async def enroll(env: dict[str, Any], sim: Simulator, suffix: str) -> str:
    machine = sim.machines[0]
    status, node = await call(
        env,
        "POST",
        "/v1/nodes",
        {"name": f"{machine.name}-{suffix}", "driver": "redfish", "console_interface": "redfish-graphical",
         "driver_info": sim.driver_info(machine)},
    )  # fmt: skip
    assert status == 201, node
    return str(node["uuid"])


async def power_on(env: dict[str, Any], ident: str) -> None:
    status, body = await call(env, "PUT", f"/v1/nodes/{ident}/states/power", {"target": "power on"})
    assert status == 202, body
    deadline = time.monotonic() + 30
    while True:
        _, node = await call(env, "GET", f"/v1/nodes/{ident}")
        if node["power_state"] == "power on" and node["target_power_state"] is None:
            return
        assert time.monotonic() < deadline, node
        await asyncio.sleep(0.1)


async def rfb_handshake(recv: Callable[[int], Awaitable[bytes]], send: Callable[[bytes], Awaitable[None]]) -> str:
    """A VNC client's side of RFB 3.8 up to ServerInit; returns the desktop name."""
    banner = await recv(12)
    assert banner == b"RFB 003.008\n", banner
    await send(b"RFB 003.008\n")
    count = (await recv(1))[0]
    types = await recv(count)
    assert 1 in types, f"QEMU without a password offers security type None; got {types!r}"
    await send(b"\x01")
    assert await recv(4) == b"\x00\x00\x00\x00"  # SecurityResult OK
    await send(b"\x01")  # ClientInit: shared
    width, height = struct.unpack(">HH", await recv(4))
    await recv(16)  # pixel format
    (length,) = struct.unpack(">I", await recv(4))
    assert width > 0 and height > 0
    return (await recv(length)).decode()


async def refused(host: str, port: int) -> bool:
    try:
        _, writer = await asyncio.open_connection(host, port)
    except ConnectionRefusedError:
        return True
    writer.close()
    return False


async def test_vnc_console_of_a_qemu_machine_through_tcp_and_websocket(env: dict[str, Any]) -> None:
    vms: Simulator = env["vms"]
    machine = vms.machines[0]
    assert isinstance(machine, QemuMachine)
    ident = await enroll(env, vms, "vm")

    # Off: the BMC offers no graphical console yet, and says so.
    status, body = await call(env, "PUT", f"/v1/nodes/{ident}/states/console", {"enabled": True})
    assert status == 400 and "ServiceEnabled is false" in fault(body), body
    _, node = await call(env, "GET", f"/v1/nodes/{ident}")
    assert node["console_enabled"] is False and "ServiceEnabled is false" in node["last_error"]

    await power_on(env, ident)
    status, body = await call(env, "PUT", f"/v1/nodes/{ident}/states/console", {"enabled": True})
    assert status == 202, body
    status, state = await call(env, "GET", f"/v1/nodes/{ident}/states/console")
    info = state["console_info"]
    assert state["console_enabled"] is True and info["type"] == "vnc", state
    url = urlsplit(info["url"])
    assert url.scheme == "vnc" and url.hostname == "127.0.0.1" and url.port
    assert url.port != machine.vnc_port  # the conductor's relay, not QEMU's own port

    reader, writer = await asyncio.open_connection(url.hostname, url.port)
    ws = await env["session"].ws_connect(info["websocket_url"])
    pending = bytearray()

    async def ws_recv(n: int) -> bytes:
        while len(pending) < n:
            message = await asyncio.wait_for(ws.receive(), 10)
            assert message.type == aiohttp.WSMsgType.BINARY, message
            pending.extend(message.data)
        data = bytes(pending[:n])
        del pending[:n]
        return data

    async def tcp_send(data: bytes) -> None:
        writer.write(data)
        await writer.drain()

    try:
        tcp_name = await rfb_handshake(lambda n: asyncio.wait_for(reader.readexactly(n), 10), tcp_send)
        ws_name = await rfb_handshake(ws_recv, ws.send_bytes)
        assert tcp_name == ws_name == f"QEMU ({machine.name})"  # QEMU names the desktop after -name: this VM

        status, body = await call(env, "PUT", f"/v1/nodes/{ident}/states/console", {"enabled": False})
        assert status == 202, body
        assert await asyncio.wait_for(reader.read(), 10) is not None  # the relay closed the client
        assert await refused(url.hostname, url.port)
        message = await asyncio.wait_for(ws.receive(), 10)
        while message.type == aiohttp.WSMsgType.BINARY:
            message = await asyncio.wait_for(ws.receive(), 10)
        assert message.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED, aiohttp.WSMsgType.CLOSING)
    finally:
        writer.close()
        await ws.close()
        await call(env, "PUT", f"/v1/nodes/{ident}/states/power", {"target": "power off"})
    status, state = await call(env, "GET", f"/v1/nodes/{ident}/states/console")
    assert state == {"console_enabled": False, "console_info": None}


async def test_a_bmc_without_a_graphical_console_is_refused(env: dict[str, Any]) -> None:
    ident = await enroll(env, env["plain"], "plain")
    status, body = await call(env, "PUT", f"/v1/nodes/{ident}/states/console", {"enabled": True})
    assert status == 400, body
    assert "advertises no graphical console" in fault(body) and "GraphicalConsole" in fault(body)
    status, state = await call(env, "GET", f"/v1/nodes/{ident}/states/console")
    assert state == {"console_enabled": False, "console_info": None}
