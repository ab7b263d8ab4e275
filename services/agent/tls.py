"""TLS for the agent's command API, the way IPA does it (API 1.68).

Either the ramdisk is given a certificate and key (``ipa-cert-file`` /
``ipa-key-file``, ``ferrum agent --cert-file/--key-file``), or it makes a
self-signed one at start for the address it advertises (``ipa-enable-auto-tls``,
``--auto-tls``). Either way the agent announces that certificate in every
heartbeat as ``agent_verify_ca``; the conductor keeps the first one it sees,
refuses a different one later, and calls the agent's https callback URL
trusting exactly that certificate (services/conductor/drivers/agent_client.py).
So no CA has to reach the ramdisk for the conductor to authenticate it.
"""

from __future__ import annotations

import dataclasses
import datetime
import ipaddress
import os
import ssl
import tempfile

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from services.common import errors

AUTO_TLS_LIFETIME = datetime.timedelta(days=30)  # a ramdisk lives minutes to hours


@dataclasses.dataclass(frozen=True)
class ServingTls:
    """What the command API serves with and what the heartbeat announces."""

    context: ssl.SSLContext
    certificate_pem: str  # agent_verify_ca


def configured_tls(cert_file: str, key_file: str) -> ServingTls:
    """TLS from the given PEM files; announces the (first) certificate of the file."""
    try:
        with open(cert_file, "rb") as handle:
            chain = handle.read()
        leaf = x509.load_pem_x509_certificate(chain)
    except (OSError, ValueError) as exc:
        raise errors.InvalidParameterValue(f"agent TLS certificate {cert_file!r} is not usable: {exc}") from None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(cert_file, key_file)
    except (OSError, ssl.SSLError) as exc:
        raise errors.InvalidParameterValue(f"agent TLS key {key_file!r} does not fit {cert_file!r}: {exc}") from None
    return ServingTls(context, leaf.public_bytes(serialization.Encoding.PEM).decode())


def auto_tls(host: str) -> ServingTls:
    """A fresh self-signed certificate for ``host`` (the advertised address).
    The key exists only in memory and, for the instant it takes to load it,
    in a 0600 temporary file (ssl can load keys from files only)."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host[:64] or "ferrum-agent")])
    try:
        alternative: x509.GeneralName = x509.IPAddress(ipaddress.ip_address(host.strip("[]")))
    except ValueError:
        alternative = x509.DNSName(host)
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + AUTO_TLS_LIFETIME)
        .add_extension(x509.SubjectAlternativeName([alternative]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .sign(key, hashes.SHA256())
    )
    pem = cert.public_bytes(serialization.Encoding.PEM)
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    fd, path = tempfile.mkstemp(prefix="ferrum-agent-", suffix=".pem")  # mkstemp: 0600
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(key_pem + pem)
        context.load_cert_chain(path)
    finally:
        os.unlink(path)
    return ServingTls(context, pem.decode())
