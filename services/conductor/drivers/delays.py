"""Configurable sleeps for fake interfaces, so they can stand in for slow BMCs."""

from __future__ import annotations

import asyncio
import random

from services.common import errors


def parse_delay(spec: str) -> tuple[float, float]:
    """``"N"`` or ``"min,max"`` seconds, as Ironic's [fake]*_delay options."""
    parts = [p.strip() for p in str(spec).split(",") if p.strip()]
    try:
        values = [float(p) for p in parts] or [0.0]
    except ValueError:
        raise errors.InvalidParameterValue(f"invalid fake delay {spec!r}: expected N or min,max") from None
    if len(values) == 1:
        return values[0], values[0]
    if len(values) != 2 or values[0] > values[1] or values[0] < 0:
        raise errors.InvalidParameterValue(f"invalid fake delay {spec!r}: expected N or min,max")
    return values[0], values[1]


async def sleep_for(spec: str) -> None:
    """Sleep a fixed time, or a triangular random time with its mode at min."""
    low, high = parse_delay(spec)
    if high <= 0:
        return
    await asyncio.sleep(low if low == high else random.triangular(low, high, low))
