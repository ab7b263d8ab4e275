"""JSON encoding that understands the values our rows carry (datetimes, UUIDs)."""

from __future__ import annotations

import datetime
import json
import uuid
from typing import Any


def _default(value: Any) -> Any:
    if isinstance(value, datetime.datetime):
        return value.isoformat()
    if isinstance(value, uuid.UUID):
        return str(value)
    raise TypeError(f"not JSON serializable: {type(value).__name__}")


def dumps(value: Any) -> str:
    return json.dumps(value, default=_default, separators=(",", ":"))


def parse_datetimes(row: dict[str, Any], fields: tuple[str, ...]) -> dict[str, Any]:
    """Undo dumps() for timestamp fields of a row that crossed a gRPC boundary."""
    for name in fields:
        if isinstance(row.get(name), str):
            row[name] = datetime.datetime.fromisoformat(row[name])
    return row
