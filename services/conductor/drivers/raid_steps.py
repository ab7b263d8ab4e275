"""The RAID clean steps, as Ironic's raid interfaces declare them.

``raid.delete_configuration`` and ``raid.create_configuration`` have
priority 0 (manual cleaning only, never automated cleaning);
``create_configuration`` takes Ironic's ``create_root_volume`` and
``create_nonroot_volumes`` (booleans, default true), which leave the root
volume or the other logical disks of ``target_raid_config`` out.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

CREATE_ARGSINFO: Mapping[str, Any] = {
    "create_root_volume": {
        "description": "Setting this to false leaves out the root volume of target_raid_config. Default true.",
        "required": False,
        "type": "boolean",
    },
    "create_nonroot_volumes": {
        "description": "Setting this to false leaves out the non-root volumes of target_raid_config. Default true.",
        "required": False,
        "type": "boolean",
    },
}


def steps(*, requires_ramdisk: bool) -> list[dict[str, Any]]:
    """Both RAID clean steps, run out of band or in the ramdisk."""
    common = {"interface": "raid", "priority": 0, "abortable": False, "requires_ramdisk": requires_ramdisk}
    return [
        {**common, "step": "delete_configuration", "argsinfo": None},
        {**common, "step": "create_configuration", "argsinfo": dict(CREATE_ARGSINFO)},
    ]
