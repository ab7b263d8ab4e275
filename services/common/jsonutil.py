"""JSON encoding that understands the values our rows carry (datetimes, UUIDs)."""

from __future__ import annotations

import datetime
import json
import uuid
from typing import Any

import orjson


def _default(value: Any) -> Any:
    if isinstance(value, datetime.datetime):
        return value.isoformat()
    if isinstance(value, uuid.UUID):
        return str(value)
    raise TypeError(f"not JSON serializable: {type(value).__name__}")


_ORJSON_OPTIONS = orjson.OPT_NON_STR_KEYS | orjson.OPT_PASSTHROUGH_DATETIME


def dumps(value: Any) -> str:
    """Compact JSON. orjson writes it about 9x faster than the standard library (a list
    of 200 node documents: 0.42 against 3.85 ms, issue 22); what orjson refuses (an
    integer beyond 64 bits, which step arguments may carry) goes to the standard
    library. Both write datetimes through ``_default``, so the output is the same but
    for non-ASCII text, which orjson writes as UTF-8 rather than as escapes."""
    try:
        return orjson.dumps(value, default=_default, option=_ORJSON_OPTIONS).decode()
    except TypeError:  # orjson.JSONEncodeError is a TypeError
        return json.dumps(value, default=_default, separators=(",", ":"))


def parse_datetimes(row: dict[str, Any], fields: tuple[str, ...]) -> dict[str, Any]:
    """Undo dumps() for timestamp fields of a row that crossed a gRPC boundary."""
    for name in fields:
        if isinstance(row.get(name), str):
            row[name] = datetime.datetime.fromisoformat(row[name])
    return row
