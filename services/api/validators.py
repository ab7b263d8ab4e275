"""Checks of identifiers several resources accept: names, MAC addresses, traits.

A node, a port group and an allocation accept the same names, and a port, a
port group and a lookup the same MACs; one definition each keeps their
answers identical.
"""

from __future__ import annotations

import re
from typing import Any

from services.common import errors
from services.common.db.nodes import is_uuid

NAME_RE = re.compile(r"^[A-Za-z0-9\-._~]+$")
MAC_RE = re.compile(r"^([0-9a-f]{2}[:-]){5}[0-9a-f]{2}$")
MAX_NAME = 255
MAX_TRAITS = 50
TRAIT_RE = re.compile(r"^[A-Z0-9_]+$")


def is_valid_name(value: Any) -> bool:
    """RFC 3986 unreserved characters, at most 255, and not a UUID (that would shadow one)."""
    return isinstance(value, str) and bool(NAME_RE.match(value)) and not is_uuid(value) and len(value) <= MAX_NAME


def normalize_mac(value: Any) -> str:
    """The lowercase colon form of a MAC address; 400 for anything else."""
    if not isinstance(value, str) or not MAC_RE.match(value.lower()):
        raise errors.InvalidParameterValue(f"Expected a MAC address but received {value}.")
    return value.lower().replace("-", ":")


def validate_trait(value: Any) -> str:
    """Standard os-traits style names or CUSTOM_*, at most 255 characters."""
    if not isinstance(value, str) or not TRAIT_RE.match(value) or len(value) > 255:
        raise errors.InvalidParameterValue(
            f"Invalid trait {value!r}: a trait must be upper-case letters, digits and underscores "
            "(a standard trait or CUSTOM_...), at most 255 characters"
        )
    return value
