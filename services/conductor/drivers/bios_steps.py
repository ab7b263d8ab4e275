"""The BIOS clean and service steps, as Ironic's bios interfaces declare them,
and the checks a request for them gets before it is accepted.

Both steps have priority 0 (manual cleaning and servicing only, never
automated cleaning) and run out of band (no ramdisk), as in Ironic's
``redfish`` bios. ``apply_configuration`` takes ``settings``, a list of
``{"name", "value"}``; Ferrum also declares its JSON type (array), so a
wrong type is a 400 like any step argument (step_plan.py).

When a step is requested the settings are checked against what the node's
BIOS is known to have (its cached settings, read when it was managed and
after every BIOS step): an unknown name or a read-only setting is a 400 that
lists the offered steps. Values are left to the BMC, which knows its
registry and dependencies best: one it refuses fails the step with the BMC's
message. With nothing cached yet only the shape is checked.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

SETTINGS_ARGSINFO: Mapping[str, Any] = {
    "settings": {
        "description": 'A list of BIOS settings to apply, each {"name": ..., "value": ...}',
        "required": True,
        "type": "array",
    }
}
VALUE_TYPES = (str, int, bool)
NAMES_SHOWN = 30  # a real BIOS has hundreds of settings; a message lists the first ones


def steps() -> list[dict[str, Any]]:
    """The steps of a BIOS interface that can change settings (both kinds alike)."""
    common = {"interface": "bios", "priority": 0, "abortable": False, "requires_ramdisk": False}
    return [
        {**common, "step": "apply_configuration", "argsinfo": dict(SETTINGS_ARGSINFO)},
        {**common, "step": "factory_reset", "argsinfo": None},
    ]


def shape_problems(settings: Any) -> list[str]:
    """What is wrong with the form of a ``settings`` argument."""
    if not isinstance(settings, list):
        return []  # its JSON type is step_plan's to report
    if not settings:
        return ["settings must name at least one BIOS setting"]
    problems, seen = [], set()
    for position, item in enumerate(settings, 1):
        if not isinstance(item, dict) or set(item) != {"name", "value"}:
            problems.append(f'settings item {position} must be an object with exactly "name" and "value"')
            continue
        name, value = item["name"], item["value"]
        if not isinstance(name, str) or not name.strip():
            problems.append(f"settings item {position}: name must be a non-empty string")
            continue
        if not isinstance(value, VALUE_TYPES):
            problems.append(
                f"settings item {position} ({name}): value must be a string, integer or boolean, "
                f"not {type(value).__name__}"
            )
        if name in seen:
            problems.append(f"settings item {position}: {name} is named twice")
        seen.add(name)
    return problems


def cached_problems(settings: Sequence[Mapping[str, Any]], cached: Sequence[Mapping[str, Any]]) -> list[str]:
    """Names the node's BIOS does not have, and read-only settings, per its cache."""
    if not cached:
        return []
    by_name = {row["name"]: row for row in cached}
    unknown = [s["name"] for s in settings if s["name"] not in by_name]
    problems = []
    if unknown:
        known = sorted(by_name)
        shown = ", ".join(known[:NAMES_SHOWN]) + (
            f" and {len(known) - NAMES_SHOWN} more" if len(known) > NAMES_SHOWN else ""
        )
        problems.append(f"the node's BIOS has no setting {', '.join(unknown)} (its settings: {shown})")
    read_only = [s["name"] for s in settings if by_name.get(s["name"], {}).get("read_only")]
    if read_only:
        problems.append(f"the BIOS settings {', '.join(read_only)} are read-only")
    return problems


def as_text(value: Any) -> str | None:
    """A setting's value as the cache (and Ironic's API) holds it: text."""
    return None if value is None else str(value)
