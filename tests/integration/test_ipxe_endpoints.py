"""The renderer's HTTP and gRPC endpoints and the api's ipxe_config passthru,
against the in-process stack (real PostgreSQL, real servers on 127.0.0.1)."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import re
import uuid as uuidlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import bcrypt
import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from ferrum.v1 import renderer_pb2, renderer_pb2_grpc
from services.api.service import ApiService
from services.common.db.pool import create_pool
from services.common.endpoints import Endpoints
from services.common.grpc_auth import internal_token_metadata
from services.common.internal_token import internal_token
from services.ipxe.interpret import interpret_script
from services.ipxe.service import IpxeService
from services.runtime import ALL_SERVICES_ORDER, RunningStack
from tests.conftest import test_settings

V = {"X-OpenStack-Ironic-API-Version": "1.56"}
KERNEL, RAMDISK = "http://images.example/deploy.kernel", "http://images.example/deploy.initramfs"
AGENT_API = "http://api.example:6385"


@pytest.fixture(scope="module")
async def stack(database_url: str, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Any]:
    """The conftest stack, plus the api URL the agent is told (the api's own port is ephemeral)."""
    settings = test_settings(
        database_url, tmp_path_factory.mktemp("state"), conductor={"hostname": "ipxe-c"}, ipxe={"api_url": AGENT_API}
    )
    running = RunningStack()
    await running.start(settings, list(ALL_SERVICES_ORDER))
    try:
        yield running
    finally:
        await running.close()


@pytest.fixture(scope="module")
async def http(stack: Any) -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


def own_state(settings: Any, tmp_path: Path, **ipxe: Any) -> Any:
    """A replica's settings with its own state dir, so it does not replace the
    stack renderer's recorded gRPC address (the stack's api reads it)."""
    return dataclasses.replace(
        settings, state_dir=str(tmp_path / "replica-state"), ipxe=dataclasses.replace(settings.ipxe, **ipxe)
    )


def urls(stack: Any) -> tuple[str, str, str]:
    boot = stack.endpoints["ipxe HTTP"]
    return boot.rsplit("/", 1)[0], stack.endpoints["api REST (Ironic v1)"], stack.endpoints["ipxe gRPC"]


async def make_node(
    stack: Any,
    http: aiohttp.ClientSession,
    *,
    macs: list[str],
    state: str,
    driver_info: dict[str, Any] | None = None,
    **fields: Any,
) -> str:
    """A node enrolled over REST with ports, then put in ``state`` directly in the DB."""
    _, api, _ = urls(stack)
    info = {"deploy_kernel": KERNEL, "deploy_ramdisk": RAMDISK} if driver_info is None else driver_info
    async with http.post(
        f"{api}/v1/nodes", json={"driver": "fake-hardware", "driver_info": info, **fields}, headers=V
    ) as r:
        assert r.status == 201, await r.text()
        node = await r.json()
    for mac in macs:
        async with http.post(f"{api}/v1/ports", json={"node_uuid": node["uuid"], "address": mac}, headers=V) as r:
            assert r.status == 201, await r.text()
    await stack.pool.execute("UPDATE nodes SET provision_state = $1 WHERE uuid = $2::uuid", state, node["uuid"])
    return str(node["uuid"])


async def get(http: aiohttp.ClientSession, url: str, **kw: Any) -> tuple[int, str, Any]:
    async with http.get(url, **kw) as r:
        return r.status, await r.text(), r.headers


async def test_boot_ipxe_chains_by_every_mac_then_uuid(stack: Any, http: aiohttp.ClientSession) -> None:
    base, _, _ = urls(stack)
    status, body, headers = await get(http, f"{base}/boot.ipxe")
    assert status == 200 and headers["Content-Type"].startswith("text/plain")
    assert headers["Cache-Control"] == "no-store"
    assert body.startswith("#!ipxe\n")
    assert f"chain --timeout 60000 {base}/ipxe?mac=${{mac}} || goto ferrum_mac_failed" in body
    assert f"{base}/ipxe?mac=${{net${{ferrum_nic}}/mac}}" in body and f"{base}/ipxe?uuid=${{uuid}}" in body
    action = interpret_script(body, {"mac": "52:54:00:aa:00:01", "uuid": "x"})
    assert action.kind == "chain" and action.chain_url == f"{base}/ipxe?mac=52:54:00:aa:00:01"
    # A hostile Host header is not copied into the script.
    status, body, _ = await get(http, f"{base}/boot.ipxe", headers={"Host": "evil${x}||goto"})
    assert status == 200 and "evil" not in body and f"{base}/ipxe?mac=" in body


async def test_deploying_node_by_mac_and_uuid(stack: Any, http: aiohttp.ClientSession) -> None:
    base, _, _ = urls(stack)
    node = await make_node(
        stack, http, macs=["52:54:00:aa:01:01", "52:54:00:aa:01:02"], state="deploying", name="deploy-me"
    )
    for form in ("52:54:00:aa:01:02", "52-54-00-AA-01-02", "525400aa0102"):
        status, body, headers = await get(http, f"{base}/ipxe", params={"mac": form})
        assert status == 200 and headers["X-Ferrum-Boot-Kind"] == "deploy", body
        assert headers["Cache-Control"] == "no-store"
    action = interpret_script(body, {"mac": "52:54:00:aa:01:02"})
    assert action.kind == "kernel" and action.kernel_url == KERNEL and action.initrd_urls == (RAMDISK,)
    args = action.kernel_args.split()
    assert "BOOTIF=01-52-54-00-aa-01-02" in args and f"ipa-node-uuid={node}" in args
    assert f"ipa-api-url={AGENT_API}" in args and "initrd=deploy_ramdisk" in args and "console=ttyS0,115200n8" in args
    status, body, headers = await get(http, f"{base}/ipxe", params={"uuid": node.upper()})
    assert status == 200 and headers["X-Ferrum-Boot-Kind"] == "deploy"
    action = interpret_script(body, {"mac": "52:54:00:aa:01:01"})
    assert "BOOTIF=01-52-54-00-aa-01-01" in action.kernel_args.split()


async def test_errors_are_scripts_never_500(
    stack: Any, http: aiohttp.ClientSession, caplog: pytest.LogCaptureFixture
) -> None:
    base, _, _ = urls(stack)
    caplog.set_level(logging.WARNING, logger="services.ipxe.render")
    status, body, headers = await get(http, f"{base}/ipxe", params={"mac": "52:54:00:ff:ff:ff"})
    assert status == 200 and headers["X-Ferrum-Boot-Kind"] == "error"
    assert "no node has a port with MAC 52:54:00:ff:ff:ff" in body and body.rstrip().endswith("exit 1")
    assert any("52:54:00:ff:ff:ff" in r.getMessage() for r in caplog.records)
    action = interpret_script(body, {})
    assert action.kind == "error" and "no node has a port with MAC 52:54:00:ff:ff:ff" in action.message
    node = await make_node(stack, http, macs=["52:54:00:aa:02:01"], state="manageable")
    status, body, _ = await get(http, f"{base}/ipxe", params={"mac": "52:54:00:aa:02:01"})
    assert status == 200 and "provision state [manageable]" in body and f"set ferrum_node {node}" in body
    assert any("manageable" in r.getMessage() and r.levelno == logging.WARNING for r in caplog.records)
    status, body, _ = await get(http, f"{base}/ipxe", params={"uuid": str(uuidlib.uuid4())})
    assert status == 200 and "no node has UUID" in body
    status, metrics, _ = await get(http, f"{base}/metrics")
    assert status == 200 and re.search(r'ferrum_ipxe_scripts_total\{kind="error"\} [3-9]', metrics), metrics
    for params in (
        {"mac": "zz:54:00:aa:02:01"},
        {},
        {"mac": "52:54:00:aa:02:01", "uuid": node},
        {"uuid": "not-a-uuid\n||goto x"},
    ):
        status, body, headers = await get(http, f"{base}/ipxe", params=params)
        assert status == 400 and headers["X-Ferrum-Boot-Kind"] == "error", params
        assert body.startswith("#!ipxe\n") and "\ngoto" not in body and "||" not in body
        commands = [line.split()[0] for line in body.splitlines()]
        assert commands[:2] == ["#!ipxe", "#"] and commands[-1] == "exit" and set(commands[2:-1]) == {"echo"}
    # Missing deploy kernel: a clear reason, not a broken script.
    await make_node(stack, http, macs=["52:54:00:aa:02:02"], state="cleaning", driver_info={})
    status, body, _ = await get(http, f"{base}/ipxe", params={"mac": "52:54:00:aa:02:02"})
    assert status == 200 and "has no driver_info deploy_kernel" in body


async def test_active_node_boots_local_disk(stack: Any, http: aiohttp.ClientSession) -> None:
    base, _, _ = urls(stack)
    node = await make_node(stack, http, macs=["52:54:00:aa:03:01"], state="active")
    await stack.pool.execute("UPDATE nodes SET boot_mode = 'bios' WHERE uuid = $1::uuid", node)
    status, body, headers = await get(http, f"{base}/ipxe", params={"mac": "52:54:00:aa:03:01"})
    assert status == 200 and headers["X-Ferrum-Boot-Kind"] == "local_disk"
    assert "sanboot --no-describe --drive 0x80 || exit 0" in body
    assert interpret_script(body, {}).kind == "local_disk"


async def test_grpc_render_health_and_reflection(stack: Any, http: aiohttp.ClientSession) -> None:
    _, _, address = urls(stack)
    node = await make_node(stack, http, macs=["52:54:00:aa:04:01"], state="wait call-back")
    token = await internal_token(stack.settings, stack.pool)
    async with grpc.aio.insecure_channel(address, interceptors=internal_token_metadata(token)) as channel:
        stub = renderer_pb2_grpc.BootScriptRendererStub(channel)
        reply = await stub.RenderBootScript(renderer_pb2.RenderBootScriptRequest(mac="52:54:00:AA:04:01"))
        assert reply.kind == "deploy" and reply.node_uuid == node and reply.reason == ""
        assert "BOOTIF=01-52-54-00-aa-04-01" in reply.script
        reply = await stub.RenderBootScript(renderer_pb2.RenderBootScriptRequest(node_uuid=node))
        assert reply.kind == "deploy" and "BOOTIF=01-${mac:hexhyp}" in reply.script
        reply = await stub.RenderBootScript(renderer_pb2.RenderBootScriptRequest(mac="52:54:00:00:00:00"))
        assert reply.kind == "error" and reply.node_uuid == "" and "no node has a port" in reply.reason
        for bad in (renderer_pb2.RenderBootScriptRequest(mac="nope"), renderer_pb2.RenderBootScriptRequest()):
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await stub.RenderBootScript(bad)
            assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        health = health_pb2_grpc.HealthStub(channel)
        # types-grpcio-health-checking declares HealthStub without its methods.
        request = health_pb2.HealthCheckRequest(service="ferrum.v1.BootScriptRenderer")
        status = await health.Check(request)  # type: ignore[attr-defined]
        assert status.status == health_pb2.HealthCheckResponse.SERVING


async def test_api_vendor_passthru_ipxe_config(stack: Any, http: aiohttp.ClientSession) -> None:
    """The stack's api has no renderer_address: it uses the one the renderer recorded."""
    _, api, _ = urls(stack)
    assert next(s for s in stack.services if s.name == "api").settings.api.renderer_address == ""
    node = await make_node(stack, http, macs=["52:54:00:aa:05:01"], state="inspecting")
    path = f"{api}/v1/drivers/fake-hardware/vendor_passthru/ipxe_config"
    status, body, headers = await get(http, path, params={"node_uuid": node})
    assert status == 200 and headers["Content-Type"].startswith("text/plain")
    assert headers["Cache-Control"] == "no-store" and headers["X-Ferrum-Boot-Kind"] == "deploy"
    assert f"ipa-inspection-callback-url={AGENT_API}/v1/continue_inspection" in body
    status, body2, _ = await get(http, path, params={"port_address": "52:54:00:aa:05:01"})
    assert status == 200 and "BOOTIF=01-52-54-00-aa-05-01" in body2
    status, body, headers = await get(http, path, params={"port_address": "52:54:00:00:00:99"})
    assert status == 200 and headers["X-Ferrum-Boot-Kind"] == "error" and "no node has a port" in body
    for params in ({}, {"node_uuid": node, "port_address": "52:54:00:aa:05:01"}, {"port_address": "bad"}):
        status, body, _ = await get(http, path, params=params)
        assert status == 400 and body.startswith("#!ipxe\n"), params


async def test_passthru_is_public_under_http_basic(stack: Any, http: aiohttp.ClientSession, tmp_path: Any) -> None:
    """A second api with http_basic (its own state dir, the renderer's address configured)."""
    htpasswd = tmp_path / "htpasswd"
    htpasswd.write_text("admin:" + bcrypt.hashpw(b"pw", bcrypt.gensalt(4)).decode() + "\n")
    base = next(s for s in stack.services if s.name == "api").settings
    settings = dataclasses.replace(
        base,
        state_dir=str(tmp_path / "state"),
        api=dataclasses.replace(
            base.api, auth_strategy="http_basic", htpasswd_file=str(htpasswd), renderer_address=urls(stack)[2]
        ),
    )
    api = ApiService(settings, stack.pool)
    endpoints = await api.start()
    try:
        root = endpoints["api REST (Ironic v1)"]
        node = await make_node(stack, http, macs=["52:54:00:aa:06:01"], state="rescue wait")
        status, _, _ = await get(http, f"{root}/v1/nodes/{node}", headers=V)
        assert status == 401  # everything else still needs auth
        status, body, headers = await get(
            http, f"{root}/v1/drivers/fake-hardware/vendor_passthru/ipxe_config", params={"node_uuid": node}
        )
        assert status == 200 and headers["X-Ferrum-Boot-Kind"] == "deploy" and "X-OpenStack-Request-Id" in headers
        assert KERNEL in body
    finally:
        await api.stop()


async def test_replicas_answer_identically(stack: Any, http: aiohttp.ClientSession, tmp_path: Path) -> None:
    base, _, _ = urls(stack)
    settings = next(s for s in stack.services if s.name == "ipxe").settings
    replica = IpxeService(own_state(settings, tmp_path), stack.pool)
    endpoints = await replica.start()
    try:
        other = endpoints["ipxe HTTP"].rsplit("/", 1)[0]
        node = await make_node(stack, http, macs=["52:54:00:aa:07:01"], state="clean wait")
        for query in ({"mac": "52:54:00:aa:07:01"}, {"uuid": node}, {"mac": "52:54:00:aa:07:99"}):
            answers = {(await get(http, f"{url}/ipxe", params=query))[1] for url in (base, other)}
            assert len(answers) == 1, query
        same_host = {"Host": "boot.example:8080"}
        first = {(await get(http, f"{url}/boot.ipxe", headers=same_host))[1] for url in (base, other)}
        assert len(first) == 1 and "http://boot.example:8080/ipxe?mac=" in first.pop()
    finally:
        await replica.stop()


async def wait_for(predicate: Any, what: str) -> None:
    for _ in range(250):
        if predicate():
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


async def test_cache_follows_every_boot_data_change(stack: Any, http: aiohttp.ClientSession, tmp_path: Path) -> None:
    """Triggers notify ferrum_boot_data on any change, direct SQL included; only that node is evicted."""
    settings = next(s for s in stack.services if s.name == "ipxe").settings
    cached = IpxeService(own_state(settings, tmp_path, cache_ttl=300.0), stack.pool)
    endpoints = await cached.start()
    cache = cached.cache
    assert cache is not None
    try:
        url = endpoints["ipxe HTTP"].rsplit("/", 1)[0] + "/ipxe"

        async def kind(mac: str) -> str:
            return str((await get(http, url, params={"mac": mac}))[2]["X-Ferrum-Boot-Kind"])

        async def changed(sql: str, *args: Any) -> None:
            before = cache.invalidations
            await stack.pool.execute(sql, *args)
            await wait_for(lambda: cache.invalidations > before, "a ferrum_boot_data notification")

        node = await make_node(stack, http, macs=["52:54:00:aa:08:01"], state="deploying")
        other = await make_node(stack, http, macs=["52:54:00:aa:08:02"], state="deploying")
        # The set-up's own writes notify too, and a notification may arrive after the read that
        # cached its node (that read then stores nothing: its generation is stale). Read until both
        # are cached and a quiet moment passes, so each notification below is the test's own.
        for _ in range(50):
            before = cache.invalidations
            assert await kind("52:54:00:aa:08:01") == "deploy" and await kind("52:54:00:aa:08:02") == "deploy"
            await asyncio.sleep(0.05)
            cached_now = {("mac", "52:54:00:aa:08:01"), ("mac", "52:54:00:aa:08:02")} <= cache._entries.keys()
            if cached_now and cache.invalidations == before:
                break
        else:
            raise AssertionError("the set-up's notifications never settled")
        assert await kind("52:54:00:aa:08:03") == "error"  # a MAC no port has yet: "not found" is cached
        # A state change in plain SQL (no node event) evicts that node at once; the other stays cached.
        await changed("UPDATE nodes SET provision_state = 'active' WHERE uuid = $1::uuid", node)
        assert await kind("52:54:00:aa:08:01") == "local_disk"
        assert ("mac", "52:54:00:aa:08:02") in cache._entries
        # A new port makes a missing MAC bootable.
        await changed(
            "INSERT INTO ports (uuid, node_id, address) SELECT gen_random_uuid(), id, '52:54:00:aa:08:03' "
            "FROM nodes WHERE uuid = $1::uuid",
            other,
        )
        assert await kind("52:54:00:aa:08:03") == "deploy"
        # driver_info, then deleting the port, then the node.
        await changed("UPDATE nodes SET driver_info = '{}' WHERE uuid = $1::uuid", other)
        assert await kind("52:54:00:aa:08:02") == "error"
        await changed("DELETE FROM ports WHERE address = '52:54:00:aa:08:03'")
        _, body, _ = await get(http, url, params={"mac": "52:54:00:aa:08:03"})
        assert "no node has a port with MAC 52:54:00:aa:08:03" in body
        await changed("DELETE FROM nodes WHERE uuid = $1::uuid", node)
        assert await kind("52:54:00:aa:08:01") == "error"
        # A write that changes no boot data sends nothing: notifications arrive in commit order, so a
        # notification from the first UPDATE would show up as a second invalidation here.
        before = cache.invalidations
        await stack.pool.execute("UPDATE nodes SET last_error = 'x' WHERE uuid = $1::uuid", other)
        await changed("UPDATE nodes SET name = 'renamed' WHERE uuid = $1::uuid", other)
        await asyncio.sleep(0.2)
        assert cache.invalidations == before + 1
    finally:
        await cached.stop()


async def test_cache_listens_again_after_losing_its_connection(
    stack: Any, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    """The listener's backend is killed (as by a database restart): caching pauses, LISTEN comes back,
    the cache starts empty and follows changes again."""
    settings = next(s for s in stack.services if s.name == "ipxe").settings
    cached = IpxeService(own_state(settings, tmp_path, cache_ttl=300.0), stack.pool)
    endpoints = await cached.start()
    cache = cached.cache
    assert cache is not None and cache.listening
    try:
        url = endpoints["ipxe HTTP"].rsplit("/", 1)[0] + "/ipxe"
        node = await make_node(stack, http, macs=["52:54:00:aa:0b:01"], state="deploying")
        assert (await get(http, url, params={"mac": "52:54:00:aa:0b:01"}))[2]["X-Ferrum-Boot-Kind"] == "deploy"
        assert cache.listener is not None
        listener = cache.listener
        old_pid = listener.server_pid
        assert old_pid is not None
        await stack.pool.execute("SELECT pg_terminate_backend($1)", old_pid)
        await wait_for(
            lambda: cache.listening and cache.ttl == 300.0 and listener.server_pid not in (None, old_pid),
            "the listener to come back",
        )
        assert not cache._entries  # whatever changed while deaf is forgotten
        before = cache.invalidations
        await stack.pool.execute("UPDATE nodes SET provision_state = 'active' WHERE uuid = $1::uuid", node)
        await wait_for(lambda: cache.invalidations > before, "a notification on the new connection")
        assert (await get(http, url, params={"mac": "52:54:00:aa:0b:01"}))[2]["X-Ferrum-Boot-Kind"] == "local_disk"
        assert ("mac", "52:54:00:aa:0b:01") in cache._entries
    finally:
        await cached.stop()


async def test_renderer_finds_an_ephemeral_api_of_its_process(
    stack: Any, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    """Without FERRUM_IPXE_API_URL, a renderer uses the api started in its process
    (port 0: only the shared Endpoints object knows where it listens)."""
    _, api, _ = urls(stack)
    settings = next(s for s in stack.services if s.name == "ipxe").settings
    assert settings.api.port == 0
    assert stack.addresses.api_url == api
    mine = own_state(settings, tmp_path, api_url="")
    # The api's address as the runtime shares it (a copy: this second renderer
    # must not replace the stack's own in what the stack's api reads).
    plain = IpxeService(mine, stack.pool, Endpoints(api_url=stack.addresses.api_url))
    alone = IpxeService(own_state(settings, tmp_path / "alone", api_url=""), stack.pool)  # no api in its process
    endpoints = await plain.start()
    alone_endpoints = await alone.start()
    try:
        await make_node(stack, http, macs=["52:54:00:aa:09:01"], state="deploying")
        base = endpoints["ipxe HTTP"].rsplit("/", 1)[0]
        status, body, _ = await get(http, f"{base}/ipxe", params={"mac": "52:54:00:aa:09:01"})
        assert status == 200 and f"ipa-api-url={api} " in body, body.splitlines()[8]
        base = alone_endpoints["ipxe HTTP"].rsplit("/", 1)[0]
        status, body, headers = await get(http, f"{base}/ipxe", params={"mac": "52:54:00:aa:09:01"})
        assert headers["X-Ferrum-Boot-Kind"] == "error" and "FERRUM_IPXE_API_URL" in body
    finally:
        await plain.stop()
        await alone.stop()


async def test_database_outage_is_an_error_script_not_500(
    stack: Any, http: aiohttp.ClientSession, database_url: str, tmp_path: Path
) -> None:
    settings = next(s for s in stack.services if s.name == "ipxe").settings
    pool = await create_pool(database_url, min_size=1, max_size=2)
    lonely = IpxeService(own_state(settings, tmp_path), pool)
    endpoints = await lonely.start()
    token = await internal_token(stack.settings, stack.pool)
    try:
        base = endpoints["ipxe HTTP"].rsplit("/", 1)[0]
        await pool.close()  # the renderer's database goes away
        status, body, headers = await get(http, f"{base}/ipxe", params={"mac": "52:54:00:aa:0a:01"})
        assert status == 200 and headers["X-Ferrum-Boot-Kind"] == "error" and "database error" in body
        async with grpc.aio.insecure_channel(
            endpoints["ipxe gRPC"], interceptors=internal_token_metadata(token)
        ) as channel:
            reply = await renderer_pb2_grpc.BootScriptRendererStub(channel).RenderBootScript(
                renderer_pb2.RenderBootScriptRequest(mac="52:54:00:aa:0a:01")
            )
        assert reply.kind == "error" and "database error" in reply.reason
    finally:
        await lonely.stop()


async def test_stack_api_still_finds_its_renderer_after_replicas(stack: Any) -> None:
    """Replicas above were started and stopped on their own: the stack's api still
    reaches the renderer of its process."""
    assert stack.addresses.renderer_grpc == urls(stack)[2]
