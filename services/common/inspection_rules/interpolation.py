"""Values like ``"{inventory[cpu][count]}"`` or ``"{node.driver_info[x]}"``,
formatted with Python's ``str.format`` over ``node``, ``inventory``,
``plugin_data`` (and ``item`` inside a loop), as Ironic does. A value that
cannot be formatted stays as it was (``is-empty`` reads a missing field as
None); results are strings."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

LOG = logging.getLogger(__name__)
SENSITIVE_FIELDS = frozenset(("password", "auth_token", "bmc_password"))
MASK = "***"


class NodeView:
    """The node as rules read it: ``{node.uuid}``, ``{node.properties[cpus]}``."""

    def __init__(self, node: Mapping[str, Any]) -> None:
        self._node = node

    def __getattr__(self, name: str) -> Any:
        try:
            return self._node[name]
        except KeyError:
            raise AttributeError(name) from None


def masked(value: Any) -> Any:
    """A copy of ``value`` with Ironic's sensitive fields read as ``***``."""
    if isinstance(value, Mapping):
        return {k: (MASK if k in SENSITIVE_FIELDS else masked(v)) for k, v in value.items()}
    if isinstance(value, list):
        return [masked(v) for v in value]
    return value


def interpolate(value: Any, context: Mapping[str, Any], *, op: str = "", in_loop: bool = False) -> Any:
    """``value`` with every string formatted over ``context`` (recursively in lists and objects)."""
    if isinstance(value, str):
        return _format(value, context, op)
    if isinstance(value, Mapping):
        return {_format(k, context, op): interpolate(v, context, op=op, in_loop=in_loop) for k, v in value.items()}
    if isinstance(value, list):
        return [interpolate(v, context, op=op, in_loop=in_loop) for v in value]
    return value


def _format(text: str, context: Mapping[str, Any], op: str) -> Any:
    try:
        return text.format(**context)
    except KeyError:
        if op == "is-empty":
            return None
        LOG.warning("inspection rule value left as written value=%r reason=a missing field", text[:200])
        return text
    except (AttributeError, ValueError, IndexError, TypeError) as exc:
        LOG.warning("inspection rule value left as written value=%r reason=%s", text[:200], exc)
        return text
