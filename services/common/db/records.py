"""The typed shape of every row a repository returns.

Repositories hand these out instead of ``dict[str, Any]`` so that mypy checks
every key a caller reads. They are ``TypedDict``s, not dataclasses, on
purpose: a record is still the plain dict that views render, callers copy
and JSON encodes, so typing them changed no behaviour.

Each record lists exactly the columns its repository's SELECT returns (joined
columns such as a port's ``node_uuid`` included); ``tests/integration/
test_db_records.py`` reads one real row of each from PostgreSQL and fails when
a column is added or dropped without its record following. Free-form JSON
columns (``extra``, ``driver_info``, ``properties`` ...) stay
``dict[str, Any]``: their shape belongs to the user or the driver.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from typing import Any, TypedDict, cast

# -- nodes ---------------------------------------------------------------------------------------


class NodeRecord(TypedDict):
    """A whole row of ``nodes`` (``SELECT *``), its secrets opened by ``NodeSecrets``
    (``AllocationRepository.candidates`` hands out whole rows with them still sealed:
    its caller reads only uuid, driver and conductor_group).

    The JSON columns stay ``dict[str, Any]``: driver_info, properties,
    instance_info and extra belong to the user and the driver;
    driver_internal_info is a bag of per-driver bookkeeping keys; the
    ``*_step`` columns hold a step and its free-form arguments (``{}`` when none).
    """

    id: int
    uuid: str
    name: str | None
    driver: str
    boot_interface: str | None
    deploy_interface: str | None
    power_interface: str | None
    management_interface: str | None
    storage_interface: str | None
    network_interface: str | None
    vendor_interface: str | None
    inspect_interface: str | None
    console_interface: str | None
    raid_interface: str | None
    rescue_interface: str | None
    bios_interface: str | None
    firmware_interface: str | None
    driver_info: dict[str, Any]
    driver_internal_info: dict[str, Any]
    instance_info: dict[str, Any]
    properties: dict[str, Any]
    extra: dict[str, Any]
    network_data: dict[str, Any]
    raid_config: dict[str, Any]
    target_raid_config: dict[str, Any]
    clean_step: dict[str, Any]
    deploy_step: dict[str, Any]
    service_step: dict[str, Any]
    traits: list[str]
    provision_state: str
    target_provision_state: str | None
    provision_updated_at: datetime.datetime | None
    power_state: str | None
    target_power_state: str | None
    boot_mode: str | None
    secure_boot: bool | None
    maintenance: bool
    maintenance_reason: str | None
    fault: str | None
    last_error: str | None
    reservation: str | None
    reservation_expires_at: datetime.datetime | None
    conductor_group: str
    resource_class: str | None
    instance_uuid: str | None
    owner: str | None
    lessee: str | None
    automated_clean: bool | None
    protected: bool
    protected_reason: str | None
    retired: bool
    retired_reason: str | None
    description: str | None
    inspection_started_at: datetime.datetime | None
    inspection_finished_at: datetime.datetime | None
    created_at: datetime.datetime
    updated_at: datetime.datetime | None
    chassis_uuid: str | None
    console_enabled: bool
    shard: str | None
    parent_node: str | None
    disable_power_off: bool
    instance_name: str | None
    health: str | None


class ConsoleNodeRecord(TypedDict):
    """What ``NodeRepository.list_console_enabled`` reads of a node whose console is wanted."""

    id: int
    uuid: str
    driver: str
    conductor_group: str


class BootNodeRecord(TypedDict):
    """The node columns the iPXE renderer reads (``BootDataRepository``, ``bootdata._COLUMNS``).

    Secrets stay sealed here: nothing the renderer reads is a secret."""

    uuid: str
    name: str | None
    driver: str
    boot_interface: str | None
    deploy_interface: str | None
    storage_interface: str | None
    driver_info: dict[str, Any]
    driver_internal_info: dict[str, Any]
    instance_info: dict[str, Any]
    properties: dict[str, Any]
    provision_state: str
    target_provision_state: str | None
    boot_mode: str | None


def node_with(node: NodeRecord, changes: Mapping[str, Any]) -> NodeRecord:
    """A copy of ``node`` with ``changes`` (node columns, as ``NodeRepository.update``
    takes them) applied, for code that changes a node without writing it (a task
    outside a conductor)."""
    return cast(NodeRecord, {**node, **changes})
