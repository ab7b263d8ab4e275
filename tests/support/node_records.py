"""Whole node records for tests that build a ``Task`` or call a driver without a database.

A driver reads a ``NodeRecord``, every column present; a test names the few
it cares about and :func:`node_record` fills the rest as a freshly enrolled
node has them (NULL columns ``None``, JSON columns ``{}``), so what the code
under test reads is what PostgreSQL would hand it.
"""

from __future__ import annotations

import datetime
from typing import Any, cast

from services.common import states
from services.common.db.records import NodeRecord

_CREATED = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)


def node_record(**values: Any) -> NodeRecord:
    """A node with ``values`` and every other column at its enrolled default."""
    unknown = set(values) - set(NodeRecord.__annotations__)
    if unknown:
        raise TypeError(f"not node columns: {sorted(unknown)}")
    defaults: dict[str, Any] = dict.fromkeys(NodeRecord.__annotations__)
    defaults.update(
        id=1,
        uuid="00000000-0000-4000-8000-000000000001",
        driver="fake-hardware",
        traits=[],
        provision_state=states.ENROLL,
        maintenance=False,
        conductor_group="",
        protected=False,
        retired=False,
        created_at=_CREATED,
        console_enabled=False,
        disable_power_off=False,
    )
    for column in (
        "driver_info",
        "driver_internal_info",
        "instance_info",
        "properties",
        "extra",
        "network_data",
        "raid_config",
        "target_raid_config",
        "clean_step",
        "deploy_step",
        "service_step",
    ):
        defaults[column] = {}
    return cast(NodeRecord, {**defaults, **values})
