"""Reading a request's JSON body within the configured size and nesting
limits, so an oversized or deeply nested body is a 413/400 before it is
parsed into memory or walked recursively."""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from services.common import errors


def json_depth(value: Any, limit: int) -> None:
    """Reject nesting deeper than ``limit`` without recursing unboundedly."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > limit:
            raise errors.Invalid(f"JSON body is nested deeper than the maximum depth of {limit}")
        if isinstance(item, str) and "\x00" in item:
            raise errors.Invalid("NUL characters are not allowed in JSON strings")
        if isinstance(item, dict):
            for key in item:
                if "\x00" in key:
                    raise errors.Invalid("NUL characters are not allowed in JSON keys")
            stack.extend((v, depth + 1) for v in item.values())
        elif isinstance(item, list):
            stack.extend((v, depth + 1) for v in item)


async def read_json(request: web.Request, *, limit: int, depth: int) -> Any:
    """The request body as JSON, within the size and nesting limits."""
    if request.content_length is not None and request.content_length > limit:
        raise errors.PayloadTooLarge(f"Request body is larger than the limit of {limit} bytes")
    body = await request.content.read(limit + 1)
    if len(body) > limit:
        raise errors.PayloadTooLarge(f"Request body is larger than the limit of {limit} bytes")
    if not body:
        raise errors.Invalid("The request body is empty; a JSON document is required")
    try:
        value = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise errors.Invalid(f"The request body is not valid JSON: {exc}") from None
    json_depth(value, depth)
    return value
