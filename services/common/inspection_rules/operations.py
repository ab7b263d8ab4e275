"""The operators of conditions and the actions of inspection rules, by name.

Each has required and optional arguments (Ironic derives them from the
plugin's ``__call__`` signature) and the arguments that are interpolated
before it runs (its ``FORMATTED_ARGS``; inside a loop every argument is).
``args`` may be an object or, deprecated in Ironic, a list matched to the
required then the optional arguments in order.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from services.common import errors


@dataclass(frozen=True)
class Signature:
    required: tuple[str, ...]
    optional: tuple[str, ...] = ()
    formatted: tuple[str, ...] = ()
    needs_plugin_data: bool = False


_COMPARE = Signature(("values",), ("force_strings",), ("values",))
CONDITIONS: Mapping[str, Signature] = {
    "eq": _COMPARE,
    "lt": _COMPARE,
    "gt": _COMPARE,
    "is-empty": Signature(("value",), (), ("value",)),
    "in-net": Signature(("address", "subnet"), (), ("address", "subnet")),
    "matches": Signature(("value", "regex"), (), ("value",)),
    "contains": Signature(("value", "regex"), (), ("value",)),
    "one-of": Signature(("value",), ("values",), ("value",)),
    "is-none": Signature(("value",), (), ("value",)),
    "is-true": Signature(("value",), (), ("value",)),
    "is-false": Signature(("value",), (), ("value",)),
}
ACTIONS: Mapping[str, Signature] = {
    "fail": Signature(("msg",)),
    "log": Signature(("msg",), ("level",), ("msg",)),
    "set-attribute": Signature(("path", "value"), (), ("value",)),
    "extend-attribute": Signature(("path", "value"), ("unique",), ("value",)),
    "del-attribute": Signature(("path",)),
    "set-capability": Signature(("name", "value"), (), ("value",)),
    "unset-capability": Signature(("name",)),
    "add-trait": Signature(("name",)),
    "remove-trait": Signature(("name",)),
    "set-plugin-data": Signature(("path", "value"), (), ("value",), needs_plugin_data=True),
    "extend-plugin-data": Signature(("path", "value"), ("unique",), ("value",), needs_plugin_data=True),
    "unset-plugin-data": Signature(("path",), (), (), needs_plugin_data=True),
    "set-port-attribute": Signature(("port_id", "path", "value"), (), ("value",)),
    "extend-port-attribute": Signature(("port_id", "path", "value"), ("unique",), ("value",)),
    "del-port-attribute": Signature(("port_id", "path")),
    "api-call": Signature(("url",), ("headers", "proxies", "timeout", "retries", "backoff_factor"), ("url",)),
}


def parse_operator(op: Any) -> tuple[str, bool]:
    """``"!eq"`` -> ("eq", True); more than one ``!`` is an error (Ironic's rule)."""
    if not isinstance(op, str):
        raise errors.InvalidParameterValue(f"an operation's 'op' must be a string, not {op!r}")
    text = op.strip()
    if text.count("!") > 1:
        raise errors.InvalidParameterValue(
            "Multiple exclamation marks are not allowed. To apply the invert of an operation, simply add an "
            "exclamation mark (with an optional space) before the operator, e.g. eq - !eq."
        )
    return text.lstrip("!").strip(), text.startswith("!")


def named_args(signature: Signature, args: Any) -> dict[str, Any]:
    """``args`` as a dict of names; a list is matched to the arguments in order."""
    if isinstance(args, Mapping):
        return dict(args)
    if isinstance(args, list):
        if len(args) < len(signature.required):
            missing = ", ".join(signature.required[len(args) :])
            raise errors.InvalidParameterValue(f"Not enough arguments provided. Missing: {missing}")
        names = (*signature.required, *signature.optional)
        if len(args) > len(names):
            raise errors.InvalidParameterValue(f"too many arguments: it takes {', '.join(names)}")
        return dict(zip(names, args, strict=False))
    raise errors.InvalidParameterValue("args must be either a list or dictionary")


def check_args(signature: Signature, args: Any) -> None:
    """Missing required and unexpected arguments, as Ironic's ``validate``."""
    given = named_args(signature, args)
    missing = [a for a in signature.required if a not in given]
    unexpected = sorted(set(given) - set(signature.required) - set(signature.optional))
    problems = []
    if missing:
        problems.append(f"missing required argument(s): {', '.join(missing)}")
    if unexpected:
        problems.append(f"unexpected argument(s): {', '.join(unexpected)}")
    if problems:
        raise errors.InvalidParameterValue("; ".join(problems))


def split_path(path: Any) -> list[str]:
    """``/a/b/c`` or ``a.b.c`` -> [a, b, c] (Ironic's normalize_path)."""
    if not isinstance(path, str) or not path.strip("/."):
        raise errors.InvalidParameterValue(f"path {path!r} must name an attribute (/a/b or a.b)")
    return path.strip("/").split("/") if "/" in path else path.split(".")
