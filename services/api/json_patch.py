r"""RFC 6902 JSON patches with Ironic's rules (which paths may change, at
which microversion), shared by every resource with a PATCH and by gRPC.

From 1.98 a path may name keys that contain ``~`` or ``/``, written with
RFC 6901's escapes ``~0`` and ``~1`` (``/extra/a~1b`` is the key ``a/b``);
a ``~`` followed by anything else is a 400. Below 1.98 a ``~`` in a path is
a 400, as Ironic's patch schema (``^(/[\w-]+)+$``) refuses it there."""

from __future__ import annotations

import re
from typing import Any

import jsonpatch

from services.common import errors

ESCAPES_SINCE = (1, 98)
_BAD_ESCAPE = re.compile(r"~(?![01])")


def decode_pointer_token(token: str) -> str:
    """One RFC 6901 reference token unescaped: ``~1`` is ``/`` and ``~0`` is ``~``, in that order."""
    return token.replace("~1", "/").replace("~0", "~")


def check_path_escapes(path: str, version: tuple[int, int]) -> None:
    """The ``~`` rules of 1.98 (see the module docstring)."""
    if "~" not in path:
        return
    if version < ESCAPES_SINCE:
        raise errors.PatchError(
            f"Invalid patch path {path!r}: keys with '~' or '/' (the ~0 and ~1 escapes) need API version 1.98"
        )
    if _BAD_ESCAPE.search(path):
        raise errors.PatchError(f"Invalid patch path {path!r}: '~' must be followed by 0 or 1 (RFC 6901)")


def apply_patch(
    current: dict[str, Any], patch: Any, readonly: set[str], known: dict[str, tuple[int, int]], version: tuple[int, int]
) -> dict[str, Any]:
    """Apply an RFC 6902 patch with Ironic's rules; returns the changed top-level fields."""
    if not isinstance(patch, list) or not patch:
        raise errors.PatchError("The patch must be a non-empty JSON list")
    for op in patch:
        if (
            not isinstance(op, dict)
            or op.get("op") not in ("add", "replace", "remove")
            or not isinstance(op.get("path"), str)
        ):
            raise errors.PatchError(f"Invalid patch operation {op!r}: op must be add, replace or remove with a path")
        if not op["path"].startswith("/") or op["path"] == "/":
            raise errors.PatchError(f"Invalid patch path {op['path']!r}")
        if op["op"] != "remove" and "value" not in op:
            raise errors.PatchError(f"'add' and 'replace' operations need a value: {op['path']}")
        check_path_escapes(op["path"], version)
        root = decode_pointer_token(op["path"].split("/")[1])
        if root in readonly:
            raise errors.PatchError(f"'{op['path']}' is an internal attribute and can not be updated")
        if root not in known:
            raise errors.PatchError(f"Adding a new attribute ({op['path']}) to the root of the resource is not allowed")
        if known[root] > version:
            raise errors.NotAcceptable(f"Field {root} is not supported at this API version")
    try:
        patched = jsonpatch.apply_patch(current, patch)
    except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException) as exc:
        raise errors.PatchError(f"Couldn't apply patch {patch!r}. Reason: {exc}") from None
    changes = {}
    for key in set(current) | set(patched):
        if current.get(key) != patched.get(key):
            changes[key] = patched.get(key)
    return changes
