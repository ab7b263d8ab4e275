"""A local certificate authority for trying TLS out: ``ferrum stack --tls``.

Writes into ``<state_dir>/tls/``: ``ca.pem`` (what clients trust: ``OS_CACERT``,
``FERRUM_SECURITY_TLS_CA_FILE``, the ramdisk's ``ipa-cafile``), ``ca.key``,
and a server certificate ``server.pem`` / ``server.key`` for 127.0.0.1, ::1,
localhost and this host's name, signed by that CA. Keys are 0600 in a 0700
directory. The files are reused on the next start, so clients keep trusting
the same CA; the server certificate is re-issued when it nears expiry or no
longer names this host, and the CA itself when it nears expiry (then clients
must fetch the new ``ca.pem``). Not for production: there, configure
certificates from your own CA (docs/security.md).
"""

from __future__ import annotations

import dataclasses
import datetime
import ipaddress
import os
import socket
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from services.common.config import Settings, validate

CA_LIFETIME = datetime.timedelta(days=3650)
SERVER_LIFETIME = datetime.timedelta(days=365)
# Re-issue once less than this is left, so a stack restarted now and then never serves an expired certificate.
RENEW_BEFORE = datetime.timedelta(days=30)


@dataclasses.dataclass(frozen=True)
class LocalTls:
    """The files of the local CA and of the server certificate it signed."""

    directory: Path
    ca_file: Path
    cert_file: Path
    key_file: Path


def server_names() -> tuple[str, ...]:
    """The names the server certificate covers: loopback and this host."""
    names = ["localhost", "127.0.0.1", "::1"]
    hostname = socket.gethostname()
    if hostname and hostname not in names:
        names.append(hostname)
    return tuple(names)


def ensure_local_tls(
    state_dir: str | Path, *, names: tuple[str, ...] | None = None, now: datetime.datetime | None = None
) -> LocalTls:
    """The local CA and server certificate under ``<state_dir>/tls``, made or
    re-issued only when missing, unreadable, expiring or not naming ``names``."""
    directory = Path(state_dir).resolve() / "tls"
    directory.mkdir(parents=True, exist_ok=True)
    directory.chmod(0o700)
    now = now or datetime.datetime.now(datetime.UTC)
    names = names or server_names()
    tls = LocalTls(directory, directory / "ca.pem", directory / "server.pem", directory / "server.key")
    ca_key_path = directory / "ca.key"
    ca = _load(tls.ca_file, ca_key_path)
    if ca is None or ca[0].not_valid_after_utc - now < RENEW_BEFORE:
        ca = _issue_ca(now)
        _write(ca_key_path, _key_pem(ca[1]), private=True)
        _write(tls.ca_file, ca[0].public_bytes(serialization.Encoding.PEM), private=False)
        tls.cert_file.unlink(missing_ok=True)  # signed by the old CA
    server = _load(tls.cert_file, tls.key_file)
    if server is None or not _fits(server[0], ca[0], names, now):
        cert, key = _issue_server(ca[0], ca[1], names, now)
        _write(tls.key_file, _key_pem(key), private=True)
        _write(tls.cert_file, cert.public_bytes(serialization.Encoding.PEM), private=False)
    return tls


def _load(cert_path: Path, key_path: Path) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey] | None:
    """A certificate and its key, or None when either is missing or unusable (then it is re-made)."""
    try:
        cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
        key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
    except (OSError, ValueError):
        return None
    if not isinstance(key, ec.EllipticCurvePrivateKey) or key.public_key() != cert.public_key():
        return None
    return cert, key


def _fits(cert: x509.Certificate, ca: x509.Certificate, names: tuple[str, ...], now: datetime.datetime) -> bool:
    if cert.issuer != ca.subject or cert.not_valid_after_utc - now < RENEW_BEFORE:
        return False
    try:
        cert.verify_directly_issued_by(ca)
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except (ValueError, TypeError, InvalidSignature, x509.ExtensionNotFound):
        return False
    present = {str(v) for v in san.get_values_for_type(x509.IPAddress)} | set(san.get_values_for_type(x509.DNSName))
    return set(names) <= present


def _issue_ca(now: datetime.datetime) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"Ferrum local CA ({socket.gethostname()})")])
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + CA_LIFETIME)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return cert, key


def _issue_server(
    ca: x509.Certificate, ca_key: ec.EllipticCurvePrivateKey, names: tuple[str, ...], now: datetime.datetime
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = ec.generate_private_key(ec.SECP256R1())
    alternatives: list[x509.GeneralName] = []
    for name in names:
        try:
            alternatives.append(x509.IPAddress(ipaddress.ip_address(name)))
        except ValueError:
            alternatives.append(x509.DNSName(name))
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0])]))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(min(now + SERVER_LIFETIME, ca.not_valid_after_utc))
        .add_extension(x509.SubjectAlternativeName(alternatives), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    return cert, key


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _write(path: Path, data: bytes, *, private: bool) -> None:
    """Write atomically; a key is 0600 from its first byte, never readable by others."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600 if private else 0o644)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)
    os.replace(tmp, path)


def with_local_tls(settings: Settings, tls: LocalTls) -> Settings:
    """``settings`` with TLS on from the local CA's files: REST and internal
    gRPC serve ``server.pem``, internal clients trust ``ca.pem``, and deploy
    ramdisks are told to trust it too (``ipa-cafile``; the path is this host's,
    right for in-process simulated machines; a real ramdisk needs the file at
    that path, docs/security.md) and to serve their command API with auto TLS
    (``ipa-enable-auto-tls=1`` in the default kernel parameters)."""
    security = dataclasses.replace(
        settings.security,
        tls_cert_file=str(tls.cert_file),
        tls_key_file=str(tls.key_file),
        tls_ca_file=str(tls.ca_file),
    )
    ipxe = settings.ipxe
    if not ipxe.agent_ca_file:
        ipxe = dataclasses.replace(ipxe, agent_ca_file=str(tls.ca_file))
    if "ipa-enable-auto-tls" not in ipxe.kernel_append_params:
        ipxe = dataclasses.replace(
            ipxe, kernel_append_params=f"{ipxe.kernel_append_params} ipa-enable-auto-tls=1".strip()
        )
    return validate(dataclasses.replace(settings, security=security, ipxe=ipxe))
