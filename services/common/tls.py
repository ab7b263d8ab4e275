"""TLS from configured certificate files, for Ferrum's REST and gRPC listeners
and for the clients that call them (docs/security.md, "TLS").

One switch for a whole deployment: when ``FERRUM_SECURITY_TLS_CERT_FILE`` and
``_KEY_FILE`` are set, every REST and internal gRPC listener of the process
serves TLS with that certificate, and every internal client (api -> conductor
and renderer, conductor -> object store) calls over TLS, verifying the peer
against ``_CA_FILE`` (empty: the system trust store). Ferrum's processes share
one configuration, like the internal token, so server and client sides agree.
The files are read when a service starts: replacing them takes a restart.
"""

from __future__ import annotations

import dataclasses
import ssl
from pathlib import Path

import grpc

from services.common.config import ConfigError, SecurityConfig


@dataclasses.dataclass(frozen=True)
class TlsFiles:
    """Where the PEM files are; ``ca_file`` empty means the system trust store."""

    cert_file: str
    key_file: str
    ca_file: str = ""

    @classmethod
    def trusting(cls, ca_file: str) -> TlsFiles:
        """What a client outside Ferrum's processes (a benchmark, a script) needs
        to call Ferrum over TLS: only the CA it verifies servers with."""
        return cls(cert_file="", key_file="", ca_file=ca_file)


def tls_files(security: SecurityConfig) -> TlsFiles | None:
    """The configured TLS files, or None when this deployment runs plain TCP."""
    if not security.tls_cert_file:
        return None
    return TlsFiles(security.tls_cert_file, security.tls_key_file, security.tls_ca_file)


def _read(path: str, what: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read the TLS {what} {path!r}: {exc.strerror or exc}") from None


def server_ssl_context(files: TlsFiles) -> ssl.SSLContext:
    """An HTTPS listener's context: TLS 1.2 or newer, this certificate and key."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(files.cert_file, files.key_file)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(
            f"cannot load the TLS certificate {files.cert_file!r} with key {files.key_file!r}: {exc}"
        ) from None
    return context


def client_ssl_context(files: TlsFiles | None) -> ssl.SSLContext:
    """A client's context verifying servers against the configured CA (else the system's)."""
    if files is None or not files.ca_file:
        return ssl.create_default_context()
    try:
        return ssl.create_default_context(cafile=files.ca_file)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"cannot load the TLS CA file {files.ca_file!r}: {exc}") from None


def grpc_server_credentials(files: TlsFiles) -> grpc.ServerCredentials:
    """A gRPC listener's credentials (server authentication only: callers prove
    who they are with the internal token or basic credentials, grpc_auth.py)."""
    chain = _read(files.cert_file, "certificate")
    key = _read(files.key_file, "key")
    return grpc.ssl_server_credentials([(key, chain)])


def grpc_channel_credentials(files: TlsFiles) -> grpc.ChannelCredentials:
    """What an internal gRPC client verifies servers against."""
    roots = _read(files.ca_file, "CA file") if files.ca_file else None
    return grpc.ssl_channel_credentials(root_certificates=roots)
