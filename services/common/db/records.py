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


# --- ports (ports.py; portgroups.py ports()) ---------------------------------


class PortRecord(TypedDict):
    """A ``ports`` row with its node's UUID."""

    id: int
    uuid: str
    node_id: int
    address: str
    name: str | None
    pxe_enabled: bool
    extra: dict[str, Any]
    internal_info: dict[str, Any]
    local_link_connection: dict[str, Any]
    physical_network: str | None
    is_smartnic: bool
    description: str | None
    created_at: datetime.datetime
    updated_at: datetime.datetime | None
    portgroup_id: int | None
    vendor: str | None
    category: str | None
    available_for_dynamic_portgroup: bool
    node_uuid: str


# --- portgroups (portgroups.py) ----------------------------------------------


class PortgroupRecord(TypedDict):
    """A ``portgroups`` row with its node's UUID."""

    id: int
    uuid: str
    node_id: int
    name: str | None
    address: str | None
    mode: str | None
    properties: dict[str, Any]
    extra: dict[str, Any]
    internal_info: dict[str, Any]
    standalone_ports_supported: bool
    created_at: datetime.datetime
    updated_at: datetime.datetime | None
    physical_network: str | None
    category: str | None
    dynamic_portgroup: bool
    node_uuid: str


# --- portgroups as the VIF code reads them (vifs.py) -------------------------


class VifPortgroupRecord(TypedDict):
    """The columns of a port group that say which VIF it carries."""

    id: int
    uuid: str
    node_id: int
    internal_info: dict[str, Any]


# --- volume_connectors, volume_targets (volumes.py) --------------------------


class VolumeConnectorRecord(TypedDict):
    """A ``volume_connectors`` row with its node's UUID."""

    id: int
    uuid: str
    node_id: int
    type: str
    connector_id: str
    extra: dict[str, Any]
    created_at: datetime.datetime
    updated_at: datetime.datetime | None
    node_uuid: str


class VolumeTargetRecord(TypedDict):
    """A ``volume_targets`` row with its node's UUID."""

    id: int
    uuid: str
    node_id: int
    volume_type: str
    boot_index: int
    volume_id: str
    properties: dict[str, Any]
    extra: dict[str, Any]
    created_at: datetime.datetime
    updated_at: datetime.datetime | None
    node_uuid: str


class NodeVolumeTarget(TypedDict):
    """A volume target as a locked task carries it (``volumes.node_volumes``)."""

    uuid: str
    volume_type: str
    boot_index: int
    volume_id: str
    properties: dict[str, Any]
    extra: dict[str, Any]


class NodeVolumeConnector(TypedDict):
    """A volume connector as a locked task carries it (``volumes.node_volumes``)."""

    uuid: str
    type: str
    connector_id: str
    extra: dict[str, Any]


# --- chassis (chassis.py) ----------------------------------------------------


class ChassisRecord(TypedDict):
    id: int
    uuid: str
    description: str | None
    extra: dict[str, Any]
    created_at: datetime.datetime
    updated_at: datetime.datetime | None


# --- allocations (allocations.py) --------------------------------------------


class AllocationRecord(TypedDict):
    """An ``allocations`` row with its node's UUID (None while it has no node)."""

    id: int
    uuid: str
    name: str | None
    node_id: int | None
    state: str
    last_error: str | None
    resource_class: str | None
    traits: list[str]
    candidate_nodes: list[str]
    extra: dict[str, Any]
    created_at: datetime.datetime
    updated_at: datetime.datetime | None
    owner: str | None
    node_uuid: str | None


# --- deploy_templates (deploy_templates.py) ----------------------------------


class DeployTemplateStep(TypedDict):
    """A deploy template's step, exactly these keys (``api/deploy_templates.validate_steps``)."""

    interface: str
    step: str
    args: dict[str, Any]  # the step's own arguments, free-form
    priority: int


class DeployTemplateRecord(TypedDict):
    id: int
    uuid: str
    name: str
    steps: list[DeployTemplateStep]
    extra: dict[str, Any]
    created_at: datetime.datetime
    updated_at: datetime.datetime | None


# --- runbooks, runbook_traits (runbooks.py) ----------------------------------


class RunbookStep(TypedDict):
    """A runbook's step as ``api/runbooks.validate_steps`` stores it (``args`` filled in)."""

    interface: str
    step: str
    args: dict[str, Any]  # the step's own arguments, free-form
    order: int | str  # an integer or a string of digits, as Ironic accepts


class RunbookRecord(TypedDict):
    """A ``runbooks`` row with its trait names, sorted."""

    id: int
    uuid: str
    name: str
    description: str | None
    steps: list[RunbookStep]
    disable_ramdisk: bool
    extra: dict[str, Any]
    public: bool
    owner: str | None
    created_at: datetime.datetime
    updated_at: datetime.datetime | None
    traits: list[str]


# --- inspection_rules (inspection_rules.py) ----------------------------------


class InspectionRuleRecord(TypedDict):
    id: int
    uuid: str
    description: str | None
    priority: int
    sensitive: bool
    phase: str
    conditions: list[dict[str, Any]]  # the user's documents: op, args, invert, loop, multiple
    actions: list[dict[str, Any]]
    created_at: datetime.datetime
    updated_at: datetime.datetime | None


# --- node_events (events.py) -------------------------------------------------


class NodeEventRecord(TypedDict):
    sequence: int
    node_uuid: str
    event: str
    provision_state: str | None
    target_provision_state: str | None
    power_state: str | None
    severity: str
    message: str
    conductor: str | None
    created_at: datetime.datetime


# --- node_history (events.py, history.py) ------------------------------------


class NodeHistoryRecord(TypedDict):
    id: int
    uuid: str
    node_id: int
    conductor: str | None
    event_type: str
    event: str
    severity: str
    user_id: str | None
    created_at: datetime.datetime
    project: str | None
    state: str | None
    target_provision_state: str | None
    duration_seconds: int | None


# --- conductors (conductors.py, conductor_list.py) ---------------------------


class ConductorRecord(TypedDict):
    id: int
    hostname: str
    grpc_address: str
    conductor_group: str
    hardware_types: list[str]
    interfaces: dict[str, dict[str, list[str]]]  # hardware type -> interface kind -> implementations
    online: bool
    heartbeat_at: datetime.datetime
    created_at: datetime.datetime
    liveness_lock: bool


class ConductorSummaryRecord(TypedDict):
    """What the REST conductors API reads, with ``alive`` computed by the query."""

    id: int
    hostname: str
    conductor_group: str
    hardware_types: list[str]
    created_at: datetime.datetime
    heartbeat_at: datetime.datetime
    alive: bool


# --- bios_settings (bios.py) -------------------------------------------------


class BiosSettingRecord(TypedDict):
    id: int
    node_id: int
    name: str
    value: str | None
    attribute_type: str | None
    allowable_values: list[str] | None
    lower_bound: int | None
    upper_bound: int | None
    min_length: int | None
    max_length: int | None
    read_only: bool | None
    reset_required: bool | None
    unique: bool | None
    created_at: datetime.datetime
    updated_at: datetime.datetime | None


# --- firmware_components (firmware.py) ---------------------------------------


class FirmwareComponentRecord(TypedDict):
    id: int
    node_id: int
    component: str
    initial_version: str
    current_version: str
    last_version_flashed: str | None
    vendor: str | None
    model: str | None
    serial_number: str | None
    created_at: datetime.datetime
    updated_at: datetime.datetime | None


# --- node_inventory (inventory.py) -------------------------------------------


class NodeInventoryRecord(TypedDict):
    """What inspection stored; both documents come from the ramdisk and plugins."""

    inventory: dict[str, Any]
    plugin_data: dict[str, Any]


# --- objects (objects.py) ----------------------------------------------------


class ObjectRecord(TypedDict):
    id: int
    container: str
    name: str
    size: int
    sha256: str
    content_type: str
    backend_key: str
    delete_at: datetime.datetime | None
    usage_count: int
    metadata: dict[str, str]
    created_at: datetime.datetime
    updated_at: datetime.datetime | None
    sealed_key_id: str | None
