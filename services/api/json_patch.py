"""RFC 6902 JSON patches with Ironic's rules (which paths may change, at
which microversion), shared by every resource with a PATCH and by gRPC."""

from __future__ import annotations

from typing import Any

import jsonpatch

from services.common import errors


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
        root = op["path"].split("/")[1]
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
