"""API 1.68: an agent announces the certificate of its TLS command API in its
heartbeat; the conductor keeps it, refuses a different one, and verifies the
agent's https endpoint against it (a real TLS server on 127.0.0.1)."""

from __future__ import annotations

import datetime
import ipaddress
import ssl
from pathlib import Path

import pytest
from aiohttp import web
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from services.common import errors
from services.conductor.drivers.agent_client import AgentClient


def self_signed(tmp: Path) -> tuple[str, Path, Path]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "ferrum-agent")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=1))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
        .sign(key, hashes.SHA256())
    )
    pem = cert.public_bytes(serialization.Encoding.PEM).decode()
    (tmp / "cert.pem").write_text(pem)
    (tmp / "key.pem").write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return pem, tmp / "cert.pem", tmp / "key.pem"


@pytest.fixture
async def tls_agent(tmp_path: Path):
    pem, cert, key = self_signed(tmp_path)

    async def status(request: web.Request) -> web.Response:
        if request.query.get("agent_token") != "t" * 43:
            return web.json_response({"faultstring": "Token invalid."}, status=401)
        return web.json_response({"commands": [{"id": "1", "command_status": "SUCCEEDED"}]})

    app = web.Application()
    app.router.add_get("/v1/commands/", status)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=context)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"https://127.0.0.1:{port}", pem
    finally:
        await runner.cleanup()


async def test_agent_https_is_verified_against_its_announced_certificate(tls_agent, tmp_path: Path) -> None:
    url, pem = tls_agent
    commands = await AgentClient(url, "t" * 43, verify_ca=pem, attempts=1).commands()
    assert commands[0]["command_status"] == "SUCCEEDED"
    with pytest.raises(errors.AgentError):  # the system trust store does not know this certificate
        await AgentClient(url, "t" * 43, attempts=1).commands()
    (tmp_path / "other").mkdir()
    other, _, _ = self_signed(tmp_path / "other")
    with pytest.raises(errors.AgentError):  # nor does another agent's certificate
        await AgentClient(url, "t" * 43, verify_ca=other, attempts=1).commands()


@pytest.mark.parametrize("kind", ["configured", "auto"])
async def test_agent_serves_tls_and_announces_its_certificate(kind: str, tmp_path: Path) -> None:
    """The real agent's command API over TLS: from given files (ipa-cert-file/ipa-key-file, here
    issued by the local CA of ``ferrum stack --tls``) or self-signed at start (ipa-enable-auto-tls).
    The conductor's client trusts exactly the announced certificate; without it, it refuses."""
    from services.agent.agent import Agent, Disk, options_from_kernel_cmdline
    from services.common.local_ca import ensure_local_tls

    disk = tmp_path / "disk"
    disk.write_bytes(b"\0" * 4096)
    if kind == "configured":
        local = ensure_local_tls(tmp_path / "state")
        extra = f"ipa-cert-file={local.cert_file} ipa-key-file={local.key_file}"
    else:
        extra = "ipa-enable-auto-tls=1"
    options = options_from_kernel_cmdline(
        f"ipa-api-url=http://127.0.0.1:9 BOOTIF=52:54:00:00:aa:01 ipa-agent-token={'t' * 43} {extra}",
        disks=(Disk(path=str(disk)),),
        listen_host="127.0.0.1",
        listen_port=0,
        lookup_interval=30.0,
    )
    agent = Agent(options)
    await agent.start()
    try:
        assert agent.callback_url.startswith("https://127.0.0.1:")
        announced = agent.heartbeat_body()["agent_verify_ca"]
        assert announced.startswith("-----BEGIN CERTIFICATE-----")
        reply = await AgentClient(agent.callback_url, "t" * 43, verify_ca=announced, attempts=1).commands()
        assert reply == []
        with pytest.raises(errors.AgentError):  # not trusted without the announced certificate
            await AgentClient(agent.callback_url, "t" * 43, attempts=1).commands()
    finally:
        await agent.stop()


def test_agent_tls_needs_both_files(tmp_path: Path) -> None:
    from services.agent.agent import Agent, AgentOptions, Disk

    _, cert, _ = self_signed(tmp_path)
    options = AgentOptions(
        api_url="http://127.0.0.1:9", macs=("52:54:00:00:aa:02",), disks=(Disk(path="x"),), tls_cert_file=str(cert)
    )
    with pytest.raises(errors.InvalidParameterValue, match="certificate and a key"):
        Agent(options)
