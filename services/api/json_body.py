"""Reading untrusted JSON (REST bodies, the gRPC API's JSON strings and
Structs) within the configured size and nesting limits.

The nesting limit is checked twice. First on the raw text, before it is
parsed: ``json.loads`` recurses once per ``[`` or ``{``, so a body of 100,000
``[`` raised ``RecursionError`` inside the parser (a 500 on REST, UNKNOWN on
gRPC) before any check on the parsed value could run. The scan ignores brackets
inside strings and costs no more than parsing (:func:`check_raw_depth`).
Then on the parsed value,
where it also refuses NUL characters (PostgreSQL text cannot hold them) and
NaN or Infinity (not JSON, and PostgreSQL's jsonb refuses them).
"""

from __future__ import annotations

import itertools
import json
import math
import operator
import re
from typing import Any

from aiohttp import web

from services.common import errors

# A whole JSON string, escapes included: removed before brackets are counted.
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')
_NOT_BRACKETS = bytes(range(256)).translate(None, b"[]{}")
# An opening bracket counts 2 and a closing one 0, so that the running sum
# minus the number of brackets seen is the depth: every step stays in C.
_WEIGHTS = bytes.maketrans(b"[{]}", b"\x02\x02\x00\x00")


def _too_deep(limit: int) -> errors.Invalid:
    return errors.Invalid(f"JSON body is nested deeper than the maximum depth of {limit}")


def check_raw_depth(raw: bytes | str, limit: int) -> None:
    """Refuse text whose brackets nest deeper than ``limit``, without parsing it.

    Text with at most ``limit`` brackets in all (most bodies, and a config
    drive's base64) is not scanned at all. Otherwise strings are cut out and
    the deepest point of what is left is found with C-level steps only
    (measured: 0.15 s for a 1.4 MB body of 240,000 brackets, where
    ``json.loads`` takes 0.3 s; 28 ms for 100,000 ``[``)."""
    data = raw.encode("utf-8", "surrogatepass") if isinstance(raw, str) else raw
    if data.count(b"[") + data.count(b"{") <= limit:
        return
    brackets = _STRING.sub(b"", data).translate(None, _NOT_BRACKETS).translate(_WEIGHTS)
    deepest = max(map(operator.sub, itertools.accumulate(brackets), itertools.count(1)), default=0)
    if deepest > limit:
        raise _too_deep(limit)


def json_depth(value: Any, limit: int) -> None:
    """Reject nesting deeper than ``limit``, NUL characters and non-finite
    numbers in a parsed value, without recursing unboundedly."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > limit:
            raise _too_deep(limit)
        if isinstance(item, str) and "\x00" in item:
            raise errors.Invalid("NUL characters are not allowed in JSON strings")
        if isinstance(item, float) and not math.isfinite(item):
            raise errors.Invalid("NaN and Infinity are not valid JSON numbers")
        if isinstance(item, dict):
            for key in item:
                if "\x00" in key:
                    raise errors.Invalid("NUL characters are not allowed in JSON keys")
            stack.extend((v, depth + 1) for v in item.values())
        elif isinstance(item, list):
            stack.extend((v, depth + 1) for v in item)


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a valid JSON number")


def loads_limited(raw: bytes | str, *, depth: int, what: str = "The request body") -> Any:
    """Parse untrusted JSON text within the nesting limit; 400 for anything else."""
    check_raw_depth(raw, depth)
    try:
        value = json.loads(raw, parse_constant=_refuse_constant)
    except (ValueError, UnicodeDecodeError) as exc:
        raise errors.Invalid(f"{what} is not valid JSON: {exc}") from None
    except RecursionError:  # not reachable after the scan; never a 500 if it were
        raise _too_deep(depth) from None
    json_depth(value, depth)
    return value


async def read_json(request: web.Request, *, limit: int, depth: int) -> Any:
    """The request body as JSON, within the size and nesting limits."""
    if request.content_length is not None and request.content_length > limit:
        raise errors.PayloadTooLarge(f"Request body is larger than the limit of {limit} bytes")
    body = await request.content.read(limit + 1)
    if len(body) > limit:
        raise errors.PayloadTooLarge(f"Request body is larger than the limit of {limit} bytes")
    if not body:
        raise errors.Invalid("The request body is empty; a JSON document is required")
    return loads_limited(body, depth=depth)
