"""A node's ``properties.capabilities``: Ironic's ``key:value,key:value``
string (or, as some clients send it, a JSON object).

One parser for every reader (the renderer's boot mode, inspection rules,
the disk label default, boot from volume's ``iscsi_boot`` and friends), so
they cannot disagree about what a node declares.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

TRUE_WORDS = frozenset({"true", "yes", "1", "on", "y", "t"})


def parse(capabilities: Any) -> dict[str, str]:
    """``{"boot_mode": "uefi", ...}`` from the string or object form; junk items are skipped."""
    if isinstance(capabilities, Mapping):
        return {str(k): str(v) for k, v in capabilities.items()}
    if not capabilities:
        return {}
    pairs = {}
    for item in str(capabilities).split(","):
        key, sep, value = item.partition(":")
        if sep and key.strip():
            pairs[key.strip()] = value.strip()
    return pairs


def of_node(node: Mapping[str, Any]) -> dict[str, str]:
    return parse((node.get("properties") or {}).get("capabilities"))


def merged(capabilities: Any, found: str) -> str:
    """``key:value,...`` with the ``found`` pairs replacing those of the same key."""
    pairs = parse(capabilities)
    pairs.update(parse(found))
    return ",".join(f"{k}:{v}" for k, v in pairs.items())


def is_true(value: Any) -> bool:
    """oslo's ``bool_from_string``: true, yes, 1, on (any case); anything else is false."""
    if isinstance(value, bool):
        return value
    return str(value).strip().lower() in TRUE_WORDS


def flag(node: Mapping[str, Any], name: str) -> bool:
    """Whether the node declares capability ``name`` true (``iscsi_boot:true``)."""
    return is_true(of_node(node).get(name, ""))
