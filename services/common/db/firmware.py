"""Cached firmware components per node (migration 0017, REST 1.86): the
conductor stores what a firmware interface read with
:meth:`FirmwareRepository.sync`; the api lists them."""

from __future__ import annotations

import builtins
from collections.abc import Mapping, Sequence
from typing import Any, cast

from services.common.db.records import FirmwareComponentRecord
from services.common.db.rows import row_to_dict

IDENTITY = ("vendor", "model", "serial_number")


class FirmwareRepository:
    def __init__(self, db: Any) -> None:
        self._db = db  # a pool or a connection

    async def list(self, node_id: int) -> builtins.list[FirmwareComponentRecord]:
        """A node's components by name (a machine has a handful)."""
        rows = await self._db.fetch("SELECT * FROM firmware_components WHERE node_id = $1 ORDER BY component", node_id)
        return [cast(FirmwareComponentRecord, row_to_dict(r)) for r in rows]

    async def sync(self, node_id: int, components: Sequence[Mapping[str, Any]]) -> None:
        """Make the cache what the BMC reports, as Ironic's sync: a new
        component is created with its version as initial and current; a known
        one gets the new current version (and identity) and ``updated_at`` only
        when something changed; components the BMC no longer reports stay
        (their history is what last_version_flashed and initial_version keep)."""
        for c in components:
            await self._db.execute(
                "INSERT INTO firmware_components "
                "(node_id, component, initial_version, current_version, vendor, model, serial_number) "
                "VALUES ($1, $2, $3, $3, $4, $5, $6) "
                "ON CONFLICT (node_id, component) DO UPDATE SET current_version = EXCLUDED.current_version, "
                "vendor = EXCLUDED.vendor, model = EXCLUDED.model, serial_number = EXCLUDED.serial_number, "
                "updated_at = now() "
                "WHERE (firmware_components.current_version, firmware_components.vendor, "
                "firmware_components.model, firmware_components.serial_number) IS DISTINCT FROM "
                "(EXCLUDED.current_version, EXCLUDED.vendor, EXCLUDED.model, EXCLUDED.serial_number)",
                node_id,
                str(c["component"]),
                str(c["current_version"]),
                *(None if c.get(k) is None else str(c[k]) for k in IDENTITY),
            )
