"""Refreshing a node's cached firmware components (API 1.86), as Ironic's
``node_cache_firmware_components``: when a node is verified (``manage``) and
when cleaning starts, the firmware interface reads the components and the
database keeps them for ``GET /v1/nodes/{id}/firmware``.

Best effort: a firmware interface that cannot read (``no-firmware``) is
skipped, and a BMC that fails to answer is logged and recorded in the history
but never fails the verification or the cleaning it is part of.
"""

from __future__ import annotations

import logging
from typing import Any

from services.common import errors
from services.common.db.firmware import FirmwareRepository
from services.common.db.outage import is_unavailable
from services.conductor.drivers.base import Task

LOG = logging.getLogger(__name__)


async def refresh(db: Any, task: Task) -> str:
    """Read and store the node's components; returns a note for the history
    ("" when the interface does not read components)."""
    firmware = task.driver.firmware
    try:
        await firmware.validate(task)
        components = await firmware.read_components(task)
    except errors.UnsupportedDriverExtension:
        return ""
    except Exception as exc:
        if is_unavailable(exc):
            raise
        LOG.warning("caching firmware components failed node_uuid=%s reason=%s", task.node["uuid"], exc)
        return f"reading the firmware components failed: {exc}"
    await FirmwareRepository(db).sync(task.node["id"], components)
    return f"firmware components cached: {', '.join(c['component'] for c in components) or 'none'}"
