"""Serial consoles end to end (issue 23): REST on an in-process stack, the
conductor's console proxies, and the simulator's machines as the consoles'
sources, over real protocols only.

- the ``simulator`` console (the BMC's Console LogService, polled over
  Redfish): enable over REST, read the URL, attach with a raw TCP socket and
  with an aiohttp WebSocket, power the machine on over REST and see its
  console text arrive on both, disable and find the port closed;
- Ironic's answers for bad bodies, ``no-console`` and unknown nodes;
  enabling twice changes nothing;
- ``max_consoles`` (2 here) refuses the next console with a 409 that says so;
- ``ipmitool-socat`` against the simulator's IPMI: Serial-over-LAN through
  Debian's ipmitool, relayed by the proxy, the password on no command line;
- a conductor stop closes its proxies, and the conductor that owns the nodes
  next starts their consoles again (console_enabled stays recorded).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import shutil
import time
import uuid as uuidlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import pytest

from services.runtime import ALL_SERVICES_ORDER, RunningStack
from services.simulator import Simulator, SimulatorOptions
from tests.conftest import test_settings

USER, PASSWORD = "console-admin", "console-secret-4711"
V = {"X-OpenStack-Ironic-API-Version": "1.56"}
MAX_CONSOLES = 2

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
async def env(database_url: str, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("console")
    settings = test_settings(
        database_url,
        tmp / "state",
        conductor={
            "hostname": "console-conductor-1",
            "enabled_console_interfaces": ("no-console", "simulator", "ipmitool-socat"),
            "max_consoles": MAX_CONSOLES,
            "console_poll_interval": 0.2,
            "console_check_interval": 0.5,
            "redfish_poll_interval": 0.1,
        },
    )
    stack = RunningStack()
    await stack.start(settings, list(ALL_SERVICES_ORDER))
    simulator = Simulator(
        SimulatorOptions(
            machines=5,
            state_dir=str(tmp / "machines"),
            disk_size=4 * 1024**2,
            username=USER,
            password=PASSWORD,
            ipmi=True,
        )
    )
    await simulator.start()
    session = aiohttp.ClientSession()
    try:
        yield {"stack": stack, "sim": simulator, "api": stack.endpoints["api REST (Ironic v1)"], "session": session}
    finally:
        await session.close()
        await stack.close()
        await simulator.stop()


async def call(env: dict[str, Any], method: str, path: str, body: Any = None) -> tuple[int, Any]:
    async with env["session"].request(method, env["api"] + path, json=body, headers=V) as r:
        text = await r.text()
        return r.status, (json.loads(text) if text else None)


def fault(body: dict[str, Any]) -> str:
    return str(json.loads(body["error_message"])["faultstring"])


async def enroll(env: dict[str, Any], index: int, console: str, **info: Any) -> dict[str, Any]:
    sim: Simulator = env["sim"]
    machine = sim.machines[index]
    status, node = await call(
        env,
        "POST",
        "/v1/nodes",
        {
            "name": f"{machine.name}-{console}-{uuidlib.uuid4().hex[:6]}",
            "driver": "redfish",
            "console_interface": console,
            "driver_info": {**sim.driver_info(machine), **info},
        },
    )
    assert status == 201, node
    return dict(node)


async def console(env: dict[str, Any], ident: str) -> dict[str, Any]:
    status, body = await call(env, "GET", f"/v1/nodes/{ident}/states/console")
    assert status == 200, body
    return dict(body)


async def set_console(env: dict[str, Any], ident: str, enabled: Any) -> tuple[int, Any]:
    return await call(env, "PUT", f"/v1/nodes/{ident}/states/console", {"enabled": enabled})


async def wait_for(check: Callable[[], Any], what: str, timeout: float = 20.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = await check()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.1)


def tcp_address(info: dict[str, Any]) -> tuple[str, int]:
    url = urlsplit(info["url"])
    assert url.scheme == "tcp" and url.hostname and url.port
    return url.hostname, url.port


async def read_until(reader: asyncio.StreamReader, marker: bytes, seen: bytearray, timeout: float = 20.0) -> None:
    async def loop() -> None:
        while marker not in seen:
            chunk = await reader.read(4096)
            if not chunk:
                raise AssertionError(f"the console closed before {marker!r}; got {bytes(seen)!r}")
            seen.extend(chunk)

    try:
        await asyncio.wait_for(loop(), timeout)
    except TimeoutError:
        raise AssertionError(f"no {marker!r} on the console within {timeout} s; got {bytes(seen)!r}") from None


async def ws_until(ws: aiohttp.ClientWebSocketResponse, marker: bytes, seen: bytearray, timeout: float = 20.0) -> None:
    async def loop() -> None:
        while marker not in seen:
            message = await ws.receive()
            if message.type != aiohttp.WSMsgType.BINARY:
                raise AssertionError(f"the websocket ended ({message.type}) before {marker!r}; got {bytes(seen)!r}")
            seen.extend(message.data)

    try:
        await asyncio.wait_for(loop(), timeout)
    except TimeoutError:
        raise AssertionError(f"no {marker!r} on the websocket within {timeout} s; got {bytes(seen)!r}") from None


async def refused(host: str, port: int) -> bool:
    try:
        _, writer = await asyncio.open_connection(host, port)
    except ConnectionRefusedError:
        return True
    writer.close()
    return False


async def history(env: dict[str, Any], node_uuid: str) -> list[dict[str, Any]]:
    rows = await env["stack"].pool.fetch(
        "SELECT h.event, h.event_type, h.conductor, h.severity FROM node_history h JOIN nodes n ON n.id = h.node_id "
        "WHERE n.uuid = $1::uuid ORDER BY h.id",
        node_uuid,
    )
    return [dict(r) for r in rows]


async def test_simulator_console_over_tcp_and_websocket(env: dict[str, Any]) -> None:
    node = await enroll(env, 0, "simulator")
    ident = node["uuid"]
    assert node["console_enabled"] is False
    assert await console(env, ident) == {"console_enabled": False, "console_info": None}

    status, body = await set_console(env, ident, True)
    assert status == 202, body
    state = await console(env, ident)
    assert state["console_enabled"] is True
    info = state["console_info"]
    assert info["type"] == "socat" and info["url"].startswith("tcp://127.0.0.1:")
    assert info["websocket_url"].startswith("ws://127.0.0.1:") and ident in info["websocket_url"]
    _, shown = await call(env, "GET", f"/v1/nodes/{ident}")
    _, states = await call(env, "GET", f"/v1/nodes/{ident}/states")
    assert shown["console_enabled"] is True and states["console_enabled"] is True

    host, port = tcp_address(info)
    reader, writer = await asyncio.open_connection(host, port)
    ws = await env["session"].ws_connect(info["websocket_url"])
    tcp_seen, ws_seen = bytearray(), bytearray()
    try:
        # A wrong token finds no console.
        wrong = info["websocket_url"].rsplit("/", 1)[0] + "/not-the-token"
        with pytest.raises(aiohttp.WSServerHandshakeError) as refused_ws:
            await env["session"].ws_connect(wrong)
        assert refused_ws.value.status == 404

        status, body = await call(env, "PUT", f"/v1/nodes/{ident}/states/power", {"target": "power on"})
        assert status == 202, body
        for marker in (b"power_on", b"firmware_start"):
            await read_until(reader, marker, tcp_seen)
            await ws_until(ws, marker, ws_seen)
        assert b"\r\n" in tcp_seen  # lines as a serial terminal shows them
        # Typing into a read-only console is harmless.
        writer.write(b"hello\r")
        await writer.drain()
        await ws.send_bytes(b"hello\r")

        status, body = await set_console(env, ident, False)
        assert status == 202, body
        assert await console(env, ident) == {"console_enabled": False, "console_info": None}
        assert await asyncio.wait_for(reader.read(), 10) is not None  # the proxy closes attached clients
        assert await refused(host, port)
        message = await asyncio.wait_for(ws.receive(), 10)
        while message.type == aiohttp.WSMsgType.BINARY:  # what was on its way, then the close
            message = await asyncio.wait_for(ws.receive(), 10)
        assert message.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED, aiohttp.WSMsgType.CLOSING)
    finally:
        writer.close()
        await ws.close()
        await call(env, "PUT", f"/v1/nodes/{ident}/states/power", {"target": "power off"})
    events = [e for e in await history(env, ident) if e["event_type"] == "console"]
    assert [e["event"] for e in events][-2:] == [
        "console enabled on conductor console-conductor-1",
        "console disabled on conductor console-conductor-1",
    ]
    _, shown = await call(env, "GET", f"/v1/nodes/{ident}")
    assert shown["console_enabled"] is False


async def test_bad_requests_are_refused_as_ironic_does(env: dict[str, Any]) -> None:
    node = await enroll(env, 1, "simulator")
    ident = node["uuid"]
    path = f"/v1/nodes/{ident}/states/console"
    status, body = await call(env, "PUT", path, {})
    assert status == 400 and fault(body) == "Missing mandatory parameter: enabled"
    status, body = await call(env, "PUT", path, {"enabled": "maybe"})
    assert status == 400 and fault(body).startswith("Invalid enabled: Unrecognized value 'maybe', acceptable values")
    status, body = await call(env, "PUT", path, {"enabled": [True]})
    assert status == 400
    status, body = await call(env, "PUT", path, {"enabled": True, "port": 1})
    assert status == 400 and fault(body) == "Unexpected arguments: port"
    status, body = await call(env, "PUT", "/v1/nodes/no-such-node/states/console", {"enabled": True})
    assert status == 404
    status, body = await call(env, "GET", "/v1/nodes/no-such-node/states/console")
    assert status == 404
    assert (await console(env, ident))["console_enabled"] is False  # nothing changed

    plain = await enroll(env, 1, "no-console")
    for enabled in (True, False):
        status, body = await set_console(env, plain["uuid"], enabled)
        assert status == 400 and "'no-console'" in fault(body), body
    status, body = await call(env, "GET", f"/v1/nodes/{plain['uuid']}/states/console")
    assert status == 200 and body == {"console_enabled": False, "console_info": None}

    # A simulator console without the Redfish address it reads is refused by validate.
    status, body = await call(
        env, "PATCH", f"/v1/nodes/{ident}", [{"op": "remove", "path": "/driver_info/redfish_address"}]
    )
    assert status == 200, body
    status, body = await set_console(env, ident, "true")
    assert status == 400 and "redfish_address" in fault(body) and "simulator console" in fault(body)


async def test_enabling_twice_is_a_no_op_and_the_bound_refuses_clearly(env: dict[str, Any]) -> None:
    nodes = [await enroll(env, i, "simulator") for i in (2, 3, 4)]
    first, second, third = (n["uuid"] for n in nodes)
    try:
        assert (await set_console(env, first, True))[0] == 202
        url = (await console(env, first))["console_info"]["url"]
        assert (await set_console(env, first, "on"))[0] == 202  # Ironic's strings work too
        assert (await console(env, first))["console_info"]["url"] == url  # the same console, not a new one
        assert (await set_console(env, second, True))[0] == 202
        status, body = await set_console(env, third, True)
        assert status == 409, body
        assert "max_consoles" in fault(body) and f"maximum of {MAX_CONSOLES}" in fault(body)
        assert (await console(env, third))["console_enabled"] is False
        # A node whose console is enabled keeps its console interface until the console is disabled.
        status, body = await call(
            env, "PATCH", f"/v1/nodes/{first}", [{"op": "replace", "path": "/console_interface", "value": "no-console"}]
        )
        assert status == 409 and "disable it" in fault(body)
        # Freeing one lets the next in.
        assert (await set_console(env, second, False))[0] == 202
        assert (await set_console(env, third, True))[0] == 202
        assert (await console(env, third))["console_enabled"] is True
    finally:
        for ident in (first, second, third):
            await set_console(env, ident, False)


@pytest.mark.skipif(shutil.which("ipmitool") is None, reason="ipmitool is not installed (scripts/bootstrap.sh)")
async def test_ipmitool_socat_console_relays_serial_over_lan(env: dict[str, Any]) -> None:
    sim: Simulator = env["sim"]
    machine = sim.machines[4]
    node = await enroll(env, 4, "ipmitool-socat", **sim.ipmi_driver_info(machine), ipmi_cipher_suite=3)
    ident = node["uuid"]
    status, body = await set_console(env, ident, True)
    assert status == 202, body
    info = (await console(env, ident))["console_info"]
    host, port = tcp_address(info)
    reader, writer = await asyncio.open_connection(host, port)
    seen = bytearray()
    try:
        await read_until(reader, b"SOL Session operational", seen)
        # The BMC password reached ipmitool through its environment, never its command line.
        command_lines = [p.read_bytes() for p in Path("/proc").glob("[0-9]*/cmdline") if p.exists()]
        assert any(b"ipmitool" in c and b"sol" in c for c in command_lines)
        assert not any(PASSWORD.encode() in c for c in command_lines)
        # Keys typed on the proxied console reach the BMC.
        bmc = sim.ipmi.bmcs[machine.uuid]  # type: ignore[union-attr]
        before = bmc.keys_received
        writer.write(b"x")
        await writer.drain()
        await wait_for(_async(lambda: bmc.keys_received > before), "the typed key at the BMC")
        status, body = await call(env, "PUT", f"/v1/nodes/{ident}/states/power", {"target": "power on"})
        assert status == 202, body
        await read_until(reader, b"power_on", seen)
        await read_until(reader, b"firmware_start", seen)
    finally:
        writer.close()
        status, body = await set_console(env, ident, False)
        assert status == 202, body
        await call(env, "PUT", f"/v1/nodes/{ident}/states/power", {"target": "power off"})
    assert await refused(host, port)
    await wait_for(_async(lambda: not _sol_processes()), "ipmitool to end")


def _sol_processes() -> list[bytes]:
    found = []
    for path in Path("/proc").glob("[0-9]*/cmdline"):
        with contextlib.suppress(OSError):
            line = path.read_bytes()
            if b"ipmitool" in line and b"activate" in line:
                found.append(line)
    return found


def _async(check: Callable[[], Any]) -> Callable[[], Any]:
    async def run() -> Any:
        return check()

    return run


async def test_conductor_stop_closes_consoles_and_the_next_owner_starts_them(env: dict[str, Any]) -> None:
    from services.conductor.service import ConductorService

    stack: RunningStack = env["stack"]
    node = await enroll(env, 3, "simulator")
    ident = node["uuid"]
    assert (await set_console(env, ident, True))[0] == 202
    host, port = tcp_address((await console(env, ident))["console_info"])
    reader, writer = await asyncio.open_connection(host, port)

    old = next(s for s in stack.services if s.name == "conductor")
    assert stack.settings is not None
    settings = dataclasses.replace(
        stack.settings, conductor=dataclasses.replace(stack.settings.conductor, hostname="console-conductor-2")
    )
    await old.stop()
    try:
        # The stopped conductor's proxy is gone: its client was closed, its port refuses.
        assert await asyncio.wait_for(reader.read(), 10) is not None
        assert await refused(host, port)
    finally:
        writer.close()
    new = ConductorService(settings, stack.pool)
    stack.services[stack.services.index(old)] = new
    await new.start()

    async def restarted() -> dict[str, Any] | None:
        status, body = await call(env, "GET", f"/v1/nodes/{ident}/states/console")
        if status == 200 and body["console_enabled"] and body["console_info"]:
            return dict(body["console_info"])
        return None

    info = await wait_for(restarted, "the console on the next conductor", timeout=30)
    assert new.manager.console_proxies.running() == {ident}
    host, port = tcp_address(info)
    reader, writer = await asyncio.open_connection(host, port)
    seen = bytearray()
    try:
        await call(env, "PUT", f"/v1/nodes/{ident}/states/power", {"target": "power on"})
        await read_until(reader, b"firmware_start", seen)
    finally:
        writer.close()
        await set_console(env, ident, False)
        await call(env, "PUT", f"/v1/nodes/{ident}/states/power", {"target": "power off"})
    events = [e for e in await history(env, ident) if e["event_type"] == "console"]
    assert "console started again on conductor console-conductor-2" in [e["event"] for e in events]


async def test_a_console_follows_its_node_when_the_ring_changes(env: dict[str, Any]) -> None:
    """A conductor joins: the nodes the ring now gives it have their consoles moved there (the old
    owner stops its proxy, the new one starts one, the api routes GET to it); when it leaves again,
    they come back."""
    from services.common.hashring import HashRing
    from services.conductor.service import ConductorService

    stack: RunningStack = env["stack"]
    assert stack.settings is not None
    current: Any = next(s for s in stack.services if s.name == "conductor")  # a ConductorService
    joining = "console-conductor-3"
    ring = HashRing([current.hostname, joining])
    moving = next(u for u in (str(uuidlib.uuid4()) for _ in range(1000)) if ring.owner(u) == joining)
    staying = next(u for u in (str(uuidlib.uuid4()) for _ in range(1000)) if ring.owner(u) == current.hostname)
    sim: Simulator = env["sim"]
    for ident in (moving, staying):
        status, body = await call(
            env,
            "POST",
            "/v1/nodes",
            {"uuid": ident, "driver": "redfish", "console_interface": "simulator",
             "driver_info": sim.driver_info(sim.machines[2])},
        )  # fmt: skip
        assert status == 201, body
        assert (await set_console(env, ident, True))[0] == 202
    assert current.manager.console_proxies.running() == {moving, staying}
    before = (await console(env, moving))["console_info"]["url"]

    settings = dataclasses.replace(
        stack.settings, conductor=dataclasses.replace(stack.settings.conductor, hostname=joining)
    )
    extra = ConductorService(settings, stack.pool)
    await extra.start()
    try:

        async def moved() -> bool:
            return extra.manager.console_proxies.running() == {
                moving
            } and current.manager.console_proxies.running() == {staying}

        await wait_for(moved, "the console of the moving node on the joining conductor", timeout=30)

        async def routed() -> bool:
            # While the api's ring and the conductors' catch up, a GET may meet the owner before
            # its proxy runs: a retryable 503 that says so.
            status, body = await call(env, "GET", f"/v1/nodes/{moving}/states/console")
            if status == 503:
                assert "retry shortly" in fault(body)
                return False
            assert status == 200, body
            return body["console_info"] is not None and body["console_info"]["url"] != before

        await wait_for(routed, "the api to route the node to its new owner", timeout=30)
        host, port = tcp_address((await console(env, moving))["console_info"])
        reader, writer = await asyncio.open_connection(host, port)
        writer.close()
        assert await asyncio.wait_for(reader.read(64), 10) is not None
    finally:
        await extra.stop()

    async def back() -> bool:
        return current.manager.console_proxies.running() == {moving, staying}

    await wait_for(back, "the console back on the remaining conductor", timeout=30)
    for ident in (moving, staying):
        assert (await set_console(env, ident, False))[0] == 202
    assert current.manager.console_proxies.running() == set()


async def test_a_console_whose_driver_info_broke_can_still_be_disabled(env: dict[str, Any]) -> None:
    node = await enroll(env, 0, "simulator")
    ident = node["uuid"]
    assert (await set_console(env, ident, True))[0] == 202
    host, port = tcp_address((await console(env, ident))["console_info"])
    status, body = await call(
        env, "PATCH", f"/v1/nodes/{ident}", [{"op": "remove", "path": "/driver_info/redfish_address"}]
    )
    assert status == 200, body
    status, body = await set_console(env, ident, False)
    assert status == 202, body
    assert await console(env, ident) == {"console_enabled": False, "console_info": None}
    assert await refused(host, port)
