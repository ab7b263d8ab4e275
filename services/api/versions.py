"""Ironic API microversion negotiation (CONTRACT.md 1.2)."""

from __future__ import annotations

import re

from services.common import errors

MIN_VERSION = (1, 1)
# The highest microversion whose features Ferrum implements; see docs/api.md
# for what each version adds and what Ferrum does with it.
MAX_VERSION = (1, 115)
HEADER = "X-OpenStack-Ironic-API-Version"
STANDARD_HEADER = "OpenStack-API-Version"
_VERSION = re.compile(r"^(\d+)\.(\d+)$")


def fmt(version: tuple[int, int]) -> str:
    return f"{version[0]}.{version[1]}"


def negotiate(legacy: str | None, standard: str | None) -> tuple[int, int]:
    """The version a request asked for; no header means the minimum, 1.1."""
    value = None
    if standard:
        parts = standard.strip().split()
        if len(parts) == 2 and parts[0].lower() == "baremetal":
            value = parts[1]
        elif len(parts) >= 1 and parts[0].lower() != "baremetal":
            value = None
    if value is None:
        value = legacy
    if value is None or not value.strip():
        return MIN_VERSION
    value = value.strip()
    if value.lower() == "latest":
        return MAX_VERSION
    match = _VERSION.match(value)
    if not match:
        raise errors.NotAcceptable(f"Invalid value for {HEADER} header: {value}")
    version = (int(match.group(1)), int(match.group(2)))
    if version[0] != 1 or not MIN_VERSION <= version <= MAX_VERSION:
        raise errors.NotAcceptable(
            f"Version {value} was requested but the minor version is not supported by this service. "
            f"The supported version range is: [{fmt(MIN_VERSION)}, {fmt(MAX_VERSION)}]."
        )
    return version


def headers(version: tuple[int, int]) -> dict[str, str]:
    return {
        "X-OpenStack-Ironic-API-Minimum-Version": fmt(MIN_VERSION),
        "X-OpenStack-Ironic-API-Maximum-Version": fmt(MAX_VERSION),
        HEADER: fmt(version),
    }
