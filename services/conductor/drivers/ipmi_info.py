"""The ``ipmi_*`` driver_info of a node, parsed once for every IPMI user in the conductor.

The ``ipmitool`` power and management interfaces (pyghmi) and the
``ipmitool-socat`` console (the ipmitool binary) read the same Ironic
fields, so they share this parser and cannot drift apart. What they differ
in is the cipher suites they can speak: pyghmi implements suites 3 and 17,
ipmitool's lanplus any IPMI 2.0 suite 0-17. That is the one parameter,
a :class:`CipherSuiteRule`. Pure and fast: ``validate`` calls it without
any network traffic.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from services.common import errors

DEFAULT_PORT = 623
DEFAULT_CIPHER_SUITE = 3
# Cipher suite -> (authentication, integrity, confidentiality) algorithm numbers (IPMI 2.0
# tables 13-17..13-19). These are the two pyghmi's client implements.
CIPHER_SUITES: Mapping[int, tuple[int, int, int]] = {3: (1, 1, 1), 17: (3, 4, 1)}
PRIV_LEVELS: Mapping[str, int] = {"CALLBACK": 1, "USER": 2, "OPERATOR": 3, "ADMINISTRATOR": 4}
BRIDGING = ("no", "single", "dual")
PROTOCOL_VERSIONS = ("1.5", "2.0")
MAX_USERNAME = 16  # IPMI user names are at most 16 bytes
MAX_PASSWORD = 20  # IPMI 2.0 passwords are at most 20 bytes


@dataclass(frozen=True)
class CipherSuiteRule:
    """Which ``ipmi_cipher_suite`` values a client can speak, and why (for the refusal)."""

    allowed: frozenset[int]
    why: str


PYGHMI_CIPHER_SUITES = CipherSuiteRule(
    frozenset(CIPHER_SUITES),
    "pyghmi implements cipher suites 3 and 17 (HMAC-SHA1 or HMAC-SHA256 with AES-CBC-128)",
)
IPMITOOL_CIPHER_SUITES = CipherSuiteRule(
    frozenset(range(18)), "ipmitool's lanplus interface takes the IPMI 2.0 cipher suites 0-17"
)

DRIVER_INFO_PROPERTIES = {
    "ipmi_address": "IP address or hostname of the node's BMC. Required.",
    "ipmi_port": f"UDP port of the BMC's RMCP+ service. Default {DEFAULT_PORT}.",
    "ipmi_username": "User name for the BMC; empty or absent means the anonymous (NULL) user. Optional.",
    "ipmi_password": "Password for the BMC (masked on reads, encrypted at rest). Optional.",
    "ipmi_priv_level": "Privilege level: ADMINISTRATOR (default), OPERATOR, USER or CALLBACK.",
    "ipmi_cipher_suite": f"RMCP+ cipher suite, 3 (SHA-1) or 17 (SHA-256); the BMC must offer it. "
    f"Default {DEFAULT_CIPHER_SUITE}.",
    "ipmi_bridging": "Bridging type: only 'no' (the default) is supported; 'single' and 'dual' are refused.",
    "ipmi_terminal_port": "Local TCP port of the node's serial console (console interfaces). Optional.",
    "ipmi_protocol_version": "IPMI protocol version: only '2.0' (the default; RMCP+, lanplus).",
}
# Ironic's bridging fields: refused with ``ipmi_bridging`` != no, listed so the refusal names them.
BRIDGING_FIELDS = (
    "ipmi_local_address",
    "ipmi_transit_channel",
    "ipmi_transit_address",
    "ipmi_target_channel",
    "ipmi_target_address",
)


@dataclass(frozen=True)
class IpmiInfo:
    """The validated IPMI settings of one node."""

    address: str
    port: int
    username: str
    password: str
    priv_level: str
    cipher_suite: int
    terminal_port: int | None = None

    def cache_key(self) -> tuple[Any, ...]:
        """Sessions are kept per BMC, credentials, privilege and cipher suite; the
        password is only hashed, so a changed password gets a fresh session."""
        digest = hashlib.sha256(self.password.encode()).hexdigest()
        return (self.address, self.port, self.username, digest, self.priv_level, self.cipher_suite)

    def describe(self) -> str:
        return f"{self.username + '@' if self.username else ''}{self.where()}"

    def where(self) -> str:
        host = f"[{self.address}]" if ":" in self.address else self.address
        return f"{host}:{self.port}"


def _port(value: Any, key: str, uuid: str) -> int:
    if isinstance(value, bool):
        value = None  # True is not a port
    try:
        port = int(str(value).strip()) if value is not None else 0
    except ValueError:
        port = 0
    if not 1 <= port <= 65535 or (isinstance(value, float) and not value.is_integer()):
        raise errors.InvalidParameterValue(f"Node {uuid}: {key} must be a port number 1-65535, got {value!r}")
    return port


def _choice(info: Mapping[str, Any], key: str, default: str, allowed: tuple[str, ...], uuid: str) -> str:
    value = info.get(key)
    if value is None or value == "":
        return default
    text = str(value).strip()
    match = next((a for a in allowed if a.lower() == text.lower()), None)
    if match is None:
        raise errors.InvalidParameterValue(f"Node {uuid}: {key} {value!r} is not one of {', '.join(allowed)}")
    return match


def parse_driver_info(node: Mapping[str, Any], *, cipher_suites: CipherSuiteRule = PYGHMI_CIPHER_SUITES) -> IpmiInfo:
    """Check the node's IPMI driver_info without touching the network; ``cipher_suites``
    is what the calling client can speak (pyghmi's by default)."""
    uuid = node.get("uuid", "?")
    info = node.get("driver_info") or {}
    address = info.get("ipmi_address")
    if not address or not isinstance(address, str) or not address.strip():
        raise errors.MissingParameter(f"Node {uuid} is missing driver_info: ipmi_address")
    address = address.strip()
    if address.startswith("[") and address.endswith("]"):
        address = address[1:-1]
    if any(c.isspace() or c in "/@?#" for c in address) or "://" in address:
        raise errors.InvalidParameterValue(
            f"Node {uuid}: ipmi_address {info['ipmi_address']!r} must be a bare IP address or hostname "
            "(the port goes in ipmi_port)"
        )
    if address.count(":") == 1:  # host:port (IPv6 addresses have several colons)
        raise errors.InvalidParameterValue(
            f"Node {uuid}: ipmi_address {info['ipmi_address']!r} must not carry a port; set ipmi_port"
        )
    port = DEFAULT_PORT if info.get("ipmi_port") in (None, "") else _port(info["ipmi_port"], "ipmi_port", uuid)

    username = info.get("ipmi_username")
    password = info.get("ipmi_password")
    for key, value, limit in (("ipmi_username", username, MAX_USERNAME), ("ipmi_password", password, MAX_PASSWORD)):
        if value is None:
            continue
        if not isinstance(value, str):
            raise errors.InvalidParameterValue(f"Node {uuid}: {key} must be a string")
        if len(value.encode()) > limit:
            raise errors.InvalidParameterValue(f"Node {uuid}: {key} is longer than IPMI allows ({limit} bytes)")

    priv_level = _choice(info, "ipmi_priv_level", "ADMINISTRATOR", tuple(PRIV_LEVELS), uuid)

    suite_value = info.get("ipmi_cipher_suite")
    if suite_value is None or suite_value == "":
        suite = DEFAULT_CIPHER_SUITE
    else:
        try:
            suite = int(str(suite_value).strip()) if not isinstance(suite_value, bool) else -1
        except ValueError:
            suite = -1
        if suite not in cipher_suites.allowed:
            raise errors.InvalidParameterValue(
                f"Node {uuid}: ipmi_cipher_suite {suite_value!r} is not supported; {cipher_suites.why}"
            )

    bridging = _choice(info, "ipmi_bridging", "no", BRIDGING, uuid)
    if bridging != "no":
        raise errors.InvalidParameterValue(
            f"Node {uuid}: ipmi_bridging {bridging!r} is not supported by Ferrum's IPMI interfaces "
            "(pyghmi's boot-device commands cannot be bridged, it has no dual bridging, and the console's "
            "ipmitool runs without bridging options); "
            f"set ipmi_bridging to 'no' and drop {', '.join(BRIDGING_FIELDS)}"
        )

    version = _choice(info, "ipmi_protocol_version", "2.0", PROTOCOL_VERSIONS, uuid)
    if version != "2.0":
        raise errors.InvalidParameterValue(
            f"Node {uuid}: ipmi_protocol_version {version!r} is not supported: Ferrum's IPMI interfaces "
            "speak IPMI 2.0 only (protocol version 2.0: RMCP+, with integrity and encryption, which "
            "Serial-over-LAN needs too)"
        )

    terminal = info.get("ipmi_terminal_port")
    terminal_port = None if terminal in (None, "") else _port(terminal, "ipmi_terminal_port", uuid)
    return IpmiInfo(
        address=address,
        port=port,
        username=username or "",
        password=password or "",
        priv_level=priv_level,
        cipher_suite=suite,
        terminal_port=terminal_port,
    )
