"""TLS as ``ferrum stack --tls`` sets it up (issue 16): a local CA in the
state directory, REST and every internal gRPC service serving TLS with it,
internal calls verifying against it, and a simulated machine deploying
against the https api with the CA its kernel command line names. Real TLS
servers on 127.0.0.1; clients without the CA are refused."""

from __future__ import annotations

import asyncio
import datetime
import json
import os
import signal
import ssl
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import pytest
import requests
from cryptography import x509
from grpc_health.v1 import health_pb2, health_pb2_grpc

from services.common.config import ConfigError, load_settings
from services.common.local_ca import RENEW_BEFORE, SERVER_LIFETIME, ensure_local_tls, with_local_tls
from services.demo_image import build_demo_image, payload_digest
from services.ipxe.render import api_url_for
from services.runtime import ALL_SERVICES_ORDER, RunningStack
from services.simulator.options import SimulatorOptions
from services.simulator.service import Simulator
from tests.conftest import test_settings
from tests.integration.test_stack_process import FERRUM, ROOT, clean_env, wait_for
from tests.restclient import call, wait_state

BAREMETAL = str(Path(sys.executable).with_name("baremetal"))
USER, PASSWORD = "admin", "tls-secret"
INTERNAL_GRPC = ("conductor gRPC", "ipxe gRPC", "objectstore gRPC")


@pytest.fixture(scope="module")
async def tls_stack(database_url: str, tmp_path_factory: pytest.TempPathFactory) -> Any:
    tmp = tmp_path_factory.mktemp("tls")
    local = ensure_local_tls(tmp / "state")
    settings = with_local_tls(
        test_settings(
            database_url,
            tmp / "state",
            conductor={"hostname": "tls-conductor", "deploy_callback_timeout": 30.0, "timeout_check_interval": 1.0},
        ),
        local,
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
        ).validate()
    )
    await simulator.start()
    trusting = ssl.create_default_context(cafile=str(local.ca_file))
    session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=trusting))
    try:
        yield {
            "stack": stack,
            "sim": simulator,
            "api": stack.endpoints["api REST (Ironic v1)"],
            "tls": local,
            "tmp": tmp,
            "session": session,
        }
    finally:
        await session.close()
        await stack.close()
        await simulator.stop()


# ---- the local CA ---------------------------------------------------------------------------


def test_local_ca_files_are_private_reused_and_renewed(tmp_path: Path) -> None:
    first = ensure_local_tls(tmp_path)
    assert stat.S_IMODE(os.stat(first.directory).st_mode) == 0o700
    for key in (first.key_file, first.directory / "ca.key"):
        assert stat.S_IMODE(os.stat(key).st_mode) == 0o600
    ca, cert = first.ca_file.read_bytes(), first.cert_file.read_bytes()
    context = ssl.create_default_context(cafile=str(first.ca_file))
    context.load_cert_chain(first.cert_file, first.key_file)  # the key matches the certificate

    again = ensure_local_tls(tmp_path)  # the next start: same CA, same certificate
    assert (again.ca_file.read_bytes(), again.cert_file.read_bytes()) == (ca, cert)

    soon = datetime.datetime.now(datetime.UTC) + SERVER_LIFETIME - RENEW_BEFORE + datetime.timedelta(days=1)
    renewed = ensure_local_tls(tmp_path, now=soon)  # near the server certificate's expiry: re-issued, CA kept
    assert renewed.ca_file.read_bytes() == ca and renewed.cert_file.read_bytes() != cert

    ensure_local_tls(tmp_path, names=("localhost", "127.0.0.1", "::1", "ferrum.example"))  # a new name: re-issued
    san = x509.load_pem_x509_certificate(first.cert_file.read_bytes()).extensions.get_extension_for_class(
        x509.SubjectAlternativeName
    )
    assert "ferrum.example" in san.value.get_values_for_type(x509.DNSName)

    first.key_file.write_text("garbage")  # an unusable key: a new pair, never a start failure
    fresh = ensure_local_tls(tmp_path)
    ssl.create_default_context().load_cert_chain(fresh.cert_file, fresh.key_file)


def test_renderer_names_the_https_api_and_the_ramdisk_ca(tmp_path: Path) -> None:
    """With a fixed api port (no api in the process to ask), the agent's api URL is https under TLS."""
    base = load_settings({}, overrides={None: {"state_dir": str(tmp_path)}})
    assert api_url_for(base) == "http://127.0.0.1:6385"
    settings = with_local_tls(base, ensure_local_tls(tmp_path))
    assert api_url_for(settings) == "https://127.0.0.1:6385"
    assert settings.ipxe.agent_ca_file == str(tmp_path.resolve() / "tls" / "ca.pem")
    assert settings.ipxe.kernel_append_params.endswith(" ipa-enable-auto-tls=1")


def test_tls_options_are_checked() -> None:
    with pytest.raises(ConfigError, match="TLS_KEY_FILE"):
        load_settings({"FERRUM_SECURITY_TLS_CERT_FILE": "/etc/ferrum/server.pem"})
    with pytest.raises(ConfigError, match="TLS_CA_FILE"):
        load_settings({"FERRUM_SECURITY_TLS_CA_FILE": "/etc/ferrum/ca.pem"})
    with pytest.raises(ConfigError, match="AGENT_CA_FILE"):
        load_settings({"FERRUM_IPXE_AGENT_CA_FILE": "relative/ca.pem"})


# ---- REST and gRPC over TLS --------------------------------------------------------------------


async def test_rest_is_https_and_needs_the_ca(tls_stack: dict[str, Any]) -> None:
    api = tls_stack["api"]
    assert api.startswith("https://127.0.0.1:")
    _, root = await call(tls_stack, "GET", "/", expect=200)
    assert root["default_version"]["version"]
    async with aiohttp.ClientSession() as plain:  # the system trust store does not know the local CA
        with pytest.raises(aiohttp.ClientConnectorCertificateError):
            await plain.get(api + "/")
        with pytest.raises(aiohttp.ClientError):  # plain HTTP to the TLS port gets no HTTP answer
            await plain.get(api.replace("https://", "http://") + "/")


async def health(channel: grpc.aio.Channel, timeout: float) -> Any:
    """grpc_health ships no stubs for the aio Check call, hence the ignore."""
    stub = health_pb2_grpc.HealthStub(channel)
    return await stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=timeout)  # type: ignore[attr-defined]


async def test_internal_grpc_is_tls_only(tls_stack: dict[str, Any]) -> None:
    endpoints = tls_stack["stack"].endpoints
    roots = tls_stack["tls"].ca_file.read_bytes()
    for label in (*INTERNAL_GRPC, "api gRPC"):
        address = endpoints[label]
        async with grpc.aio.secure_channel(address, grpc.ssl_channel_credentials(roots)) as channel:
            reply = await health(channel, 10)
            assert reply.status == health_pb2.HealthCheckResponse.SERVING, label
        async with grpc.aio.insecure_channel(address) as channel:  # a plaintext client is refused
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await health(channel, 5)
            assert refused.value.code() == grpc.StatusCode.UNAVAILABLE, label
        async with grpc.aio.secure_channel(address, grpc.ssl_channel_credentials()) as channel:  # no CA: refused
            with pytest.raises(grpc.aio.AioRpcError) as untrusted:
                await health(channel, 5)
            assert untrusted.value.code() == grpc.StatusCode.UNAVAILABLE, label


async def test_api_reaches_conductor_and_renderer_over_tls(tls_stack: dict[str, Any]) -> None:
    _, node = await call(tls_stack, "POST", "/v1/nodes", {"driver": "fake-hardware", "name": "tls-fake"}, expect=201)
    await call(tls_stack, "PUT", f"/v1/nodes/{node['uuid']}/states/provision", {"target": "manage"}, expect=202)
    assert (await wait_state(tls_stack, node["uuid"], "manageable"))["last_error"] is None  # via the conductor
    path = "/v1/drivers/fake-hardware/vendor_passthru/ipxe_config?port_address=52:54:00:00:00:99"
    async with tls_stack["session"].get(tls_stack["api"] + path) as reply:  # via the renderer's gRPC
        assert reply.status == 200 and reply.headers["X-Ferrum-Boot-Kind"] == "error"
        assert "no node has a port" in await reply.text()
    await call(tls_stack, "DELETE", f"/v1/nodes/{node['uuid']}", expect=204)


async def baremetal(api: str, *args: str, cacert: str | None) -> tuple[int, str, str]:
    env = {**os.environ, "OS_AUTH_TYPE": "none", "OS_ENDPOINT": api}
    env.pop("OS_CACERT", None)
    extra = ("--os-cacert", cacert) if cacert else ()
    proc = await asyncio.create_subprocess_exec(
        BAREMETAL, *extra, *args, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    return proc.returncode or 0, out.decode(), err.decode()


async def test_baremetal_cli_with_the_ca(tls_stack: dict[str, Any]) -> None:
    await call(tls_stack, "POST", "/v1/nodes", {"driver": "fake-hardware", "name": "tls-cli"}, expect=201)
    rc, out, err = await baremetal(tls_stack["api"], "node", "list", "-f", "json", cacert=str(tls_stack["tls"].ca_file))
    assert rc == 0, err
    assert "tls-cli" in [n.get("Name", n.get("name")) for n in json.loads(out)], out
    rc, out, err = await baremetal(tls_stack["api"], "node", "list", "-f", "json", cacert=None)
    assert rc != 0 and "certificate" in (err + out).lower()
    await call(tls_stack, "DELETE", "/v1/nodes/tls-cli", expect=204)


# ---- a whole deploy against the TLS api -----------------------------------------------------------


async def test_simulated_machine_deploys_against_the_tls_api(tls_stack: dict[str, Any]) -> None:
    conductor = next(s for s in tls_stack["stack"].services if s.name == "conductor")
    store = conductor.objectstore  # conductor -> object store over TLS
    image = build_demo_image(tls_stack["tmp"] / "images", size_mib=8, marker="tls")
    await store.put_file("tls", "disk.raw", image.path)
    await store.put_bytes("tls", "kernel", b"k")
    url = await store.temp_url("tls", "disk.raw", lifetime=600)
    kernel = await store.temp_url("tls", "kernel", lifetime=600)
    machine = tls_stack["sim"].machines[0]
    _, node = await call(
        tls_stack,
        "POST",
        "/v1/nodes",
        {
            "name": machine.name,
            "driver": "redfish",
            "boot_interface": "ipxe",
            "deploy_interface": "direct",
            "driver_info": {
                "redfish_address": tls_stack["sim"].redfish_url,
                "redfish_system_id": machine.system_path,
                "redfish_username": USER,
                "redfish_password": PASSWORD,
                "deploy_kernel": kernel,
                "deploy_ramdisk": kernel,
            },
            "instance_info": {
                "image_source": url,
                "image_os_hash_algo": "sha256",
                "image_os_hash_value": image.sha256,
            },
        },
        expect=201,
    )
    await call(tls_stack, "POST", "/v1/ports", {"node_uuid": node["uuid"], "address": machine.macs[0]}, expect=201)
    for verb, state in (("manage", "manageable"), ("provide", "available")):
        await call(tls_stack, "PUT", f"/v1/nodes/{node['uuid']}/states/provision", {"target": verb}, expect=202)
        await wait_state(tls_stack, node["uuid"], state)
    await call(
        tls_stack,
        "PUT",
        f"/v1/nodes/{node['uuid']}/states/provision",
        {"target": "active", "configdrive": {"meta_data": {"hostname": "tls.example"}}},
        expect=202,
    )
    active = await wait_state(tls_stack, node["uuid"], "active", timeout=120)
    assert active["last_error"] is None
    # The ramdisk was told the https api and the CA to verify it with, and called back over TLS.
    kernel_lines = [e for e in machine.boot_log if "cmdline" in json.dumps(e)]
    cmdline = json.dumps(kernel_lines)
    assert f"ipa-api-url={tls_stack['api']}" in cmdline
    assert f"ipa-cafile={tls_stack['tls'].ca_file}" in cmdline
    # ... and served its command API with auto TLS: the conductor called an https agent, trusting the
    # certificate announced in the heartbeat.
    assert "ipa-enable-auto-tls=1" in cmdline
    started = [e for e in machine.boot_log if e["event"] == "agent_started"]
    assert started and started[-1]["callback_url"].startswith("https://127.0.0.1:")
    deadline = time.monotonic() + 60
    while machine.os_report is None:
        assert time.monotonic() < deadline, "the machine did not boot its disk"
        await asyncio.sleep(0.2)
    assert payload_digest(Path(machine.disk_path), image) == payload_digest(image.path, image)
    assert (machine.os_report.get("config_drive") or {}).get("meta_data", {}).get("hostname") == "tls.example"


# ---- ferrum stack --tls as a process ---------------------------------------------------------------


def test_ferrum_stack_tls_process(tmp_path: Path) -> None:
    os.chmod(tmp_path, 0o755)
    ports = tmp_path / "ports.json"
    state = tmp_path / "state"
    command = [*FERRUM, "stack", "--tls", "--ephemeral", "--state-dir", str(state), "--ports-file", str(ports)]
    process = subprocess.Popen(
        command, cwd=ROOT, env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        endpoints = wait_for(ports, process, timeout=90)
        ca = endpoints["TLS CA (OS_CACERT)"]
        assert ca == str((state / "tls" / "ca.pem").resolve())
        api = endpoints["api REST (Ironic v1)"]
        assert api.startswith("https://") and endpoints["ipxe HTTP"].startswith("http://")
        assert requests.get(f"{api}/v1/", verify=ca, timeout=10).status_code == 200
        with pytest.raises(requests.exceptions.SSLError):
            requests.get(f"{api}/v1/", timeout=10)
        process.send_signal(signal.SIGTERM)
        out, _ = process.communicate(timeout=60)
        assert process.returncode == 0
        assert "TLS CA (OS_CACERT)" in out and ca in out  # printed for the operator
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(10)
