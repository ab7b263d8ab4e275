"""Turning asyncpg records into plain dicts that the rest of Ferrum passes around."""

from __future__ import annotations

import datetime
import uuid
from typing import Any

import asyncpg


def row_to_dict(record: asyncpg.Record | None) -> dict[str, Any] | None:
    """A plain dict with UUIDs as strings; timestamps stay datetimes."""
    if record is None:
        return None
    out: dict[str, Any] = {}
    for key, value in record.items():
        out[key] = str(value) if isinstance(value, uuid.UUID) else value
    return out


def iso(value: datetime.datetime | None) -> str | None:
    """Ironic's timestamp rendering (ISO 8601 with offset)."""
    return value.isoformat() if value is not None else None
