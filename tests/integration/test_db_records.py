"""Each typed record lists exactly the columns its repository returns.

One real row of each, read from PostgreSQL through its repository: a column
added by a migration (or dropped) without its record in
``services/common/db/records.py`` following fails here. One test per record.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Mapping
from typing import Any, cast

import asyncpg
import pytest

from services.common.db import records
from services.common.db.allocations import AllocationRepository
from services.common.db.bios import BiosRepository
from services.common.db.chassis import ChassisRepository
from services.common.db.conductor_list import ConductorListRepository
from services.common.db.conductors import ConductorRepository
from services.common.db.deploy_templates import DeployTemplateRepository
from services.common.db.events import EventRepository
from services.common.db.firmware import FirmwareRepository
from services.common.db.history import HistoryRepository
from services.common.db.inspection_rules import InspectionRuleRepository
from services.common.db.inventory import InventoryRepository
from services.common.db.objects import ObjectRepository
from services.common.db.pool import create_pool
from services.common.db.portgroups import PortgroupRepository
from services.common.db.ports import PortRepository
from services.common.db.rows import row_to_dict
from services.common.db.runbooks import RunbookRepository
from services.common.db.vifs import VifRepository
from services.common.db.volumes import VolumeRepository, node_volumes


def keys(record: Any) -> set[str]:
    """Every key a TypedDict declares, required or not."""
    return set(record.__required_keys__ | record.__optional_keys__)


@pytest.fixture(scope="module")
async def pool(database_url: str) -> AsyncIterator[asyncpg.Pool]:
    pool = await create_pool(database_url, max_size=4)
    yield pool
    await pool.close()


async def test_node_record_matches_columns(pool: asyncpg.Pool) -> None:
    from services.common.db.bootdata import BootDataRepository
    from services.common.db.node_secrets import NodeSecrets
    from services.common.db.nodes import NodePage, NodeRepository
    from services.common.keyring import Keyring

    nodes = NodeRepository(pool, secrets=NodeSecrets(Keyring()))
    created = await nodes.create(
        {"uuid": str(uuid.uuid4()), "driver": "fake-hardware", "provision_state": "enroll", "console_enabled": True}
    )
    assert set(created) == keys(records.NodeRecord)
    assert set(await nodes.get(created["uuid"])) == keys(records.NodeRecord)
    (listed,) = await nodes.list(NodePage(filters={"driver": "fake-hardware"}))
    assert set(listed) == keys(records.NodeRecord)
    (console,) = await nodes.list_console_enabled()
    assert set(console) == keys(records.ConsoleNodeRecord)
    boot = await BootDataRepository(pool).read(uuid=created["uuid"])
    assert boot is not None and set(boot.node) == keys(records.BootNodeRecord)


async def new_node(pool: asyncpg.Pool) -> tuple[int, str]:
    """A bare node row (id, uuid) for the records that belong to a node (driver
    ``redfish``: test_node_record_matches_columns counts the fake-hardware ones)."""
    row = await pool.fetchrow(
        "INSERT INTO nodes (uuid, driver, provision_state) VALUES ($1::uuid, 'redfish', 'enroll') RETURNING id, uuid",
        str(uuid.uuid4()),
    )
    assert row is not None
    return int(row["id"]), str(row["uuid"])


async def node_row(pool: asyncpg.Pool, node_id: int) -> records.NodeRecord:
    """The node's whole row, as the event log is handed it."""
    return cast(records.NodeRecord, row_to_dict(await pool.fetchrow("SELECT * FROM nodes WHERE id = $1", node_id)))


def assert_keys(row: Mapping[str, Any], record: Any) -> None:
    assert set(row) == set(record.__required_keys__) | set(record.__optional_keys__)


def mac(n: int) -> str:
    return f"52:54:00:12:34:{n:02x}"


async def test_port_record(pool: asyncpg.Pool) -> None:
    node_id, node_uuid = await new_node(pool)
    row = await PortRepository(pool).create({"uuid": str(uuid.uuid4()), "node_id": node_id, "address": mac(1)})
    assert_keys(row, records.PortRecord)
    assert row["node_uuid"] == node_uuid
    assert_keys(await PortRepository(pool).get(row["uuid"]), records.PortRecord)


async def test_portgroup_record(pool: asyncpg.Pool) -> None:
    node_id, _ = await new_node(pool)
    repo = PortgroupRepository(pool)
    row = await repo.create({"uuid": str(uuid.uuid4()), "node_id": node_id, "address": mac(2)})
    assert_keys(row, records.PortgroupRecord)
    port = await PortRepository(pool).create({"uuid": str(uuid.uuid4()), "node_id": node_id, "address": mac(3)})
    await repo.set_port_group(port["uuid"], row["id"])
    (member,) = await repo.ports(row["id"], limit=10)
    assert_keys(member, records.PortRecord)


async def test_vif_portgroup_record(pool: asyncpg.Pool) -> None:
    node_id, _ = await new_node(pool)
    group = await PortgroupRepository(pool).create({"uuid": str(uuid.uuid4()), "node_id": node_id})
    row = await VifRepository(pool).portgroup(group["uuid"])
    assert row is not None
    assert_keys(row, records.VifPortgroupRecord)


async def test_volume_connector_record(pool: asyncpg.Pool) -> None:
    node_id, _ = await new_node(pool)
    repo = VolumeRepository[records.VolumeConnectorRecord](pool, "connector")
    row = await repo.create(
        {"uuid": str(uuid.uuid4()), "node_id": node_id, "type": "iqn", "connector_id": "iqn.2024-01.org.example:n"}
    )
    assert_keys(row, records.VolumeConnectorRecord)
    (_, (carried,)) = await node_volumes(pool, node_id)
    assert_keys(carried, records.NodeVolumeConnector)


async def test_volume_target_record(pool: asyncpg.Pool) -> None:
    node_id, _ = await new_node(pool)
    repo = VolumeRepository[records.VolumeTargetRecord](pool, "target")
    row = await repo.create(
        {"uuid": str(uuid.uuid4()), "node_id": node_id, "volume_type": "iscsi", "boot_index": 0, "volume_id": "v1"}
    )
    assert_keys(row, records.VolumeTargetRecord)
    ((carried,), _) = await node_volumes(pool, node_id)
    assert_keys(carried, records.NodeVolumeTarget)


async def test_chassis_record(pool: asyncpg.Pool) -> None:
    row = await ChassisRepository(pool).create({"uuid": str(uuid.uuid4()), "description": "rack 1"})
    assert_keys(row, records.ChassisRecord)


async def test_allocation_record(pool: asyncpg.Pool) -> None:
    row = await AllocationRepository(pool).create(
        {"uuid": str(uuid.uuid4()), "state": "allocating", "resource_class": "baremetal"}
    )
    assert_keys(row, records.AllocationRecord)
    assert row["node_uuid"] is None


async def test_deploy_template_record(pool: asyncpg.Pool) -> None:
    row = await DeployTemplateRepository(pool).create({"uuid": str(uuid.uuid4()), "name": "CUSTOM_RECORDS"})
    assert_keys(row, records.DeployTemplateRecord)


async def test_runbook_record(pool: asyncpg.Pool) -> None:
    repo = RunbookRepository(pool)
    step = {"interface": "bios", "step": "apply_configuration", "args": {}, "order": 1}
    row = await repo.create({"uuid": str(uuid.uuid4()), "name": "CUSTOM_RECORDS", "steps": [step]})
    assert_keys(row, records.RunbookRecord)
    await repo.add_trait(row["id"], "CUSTOM_A")
    again = await repo.get(row["uuid"])
    assert_keys(again, records.RunbookRecord)
    assert again["traits"] == ["CUSTOM_A"]


async def test_inspection_rule_record(pool: asyncpg.Pool) -> None:
    row = await InspectionRuleRepository(pool).create(
        {"uuid": str(uuid.uuid4()), "actions": [{"op": "log", "args": {"msg": "hi"}}]}
    )
    assert_keys(row, records.InspectionRuleRecord)


async def test_node_event_record(pool: asyncpg.Pool) -> None:
    node_id, node_uuid = await new_node(pool)
    repo = EventRepository(pool)
    sequence = await repo.record(await node_row(pool, node_id), event="records", history=False)
    (row,) = await repo.events_after(sequence - 1, node_uuid=node_uuid)
    assert_keys(row, records.NodeEventRecord)


async def test_node_history_record(pool: asyncpg.Pool) -> None:
    node_id, _ = await new_node(pool)
    await EventRepository(pool).record(await node_row(pool, node_id), event="records")
    (row,) = await HistoryRepository(pool).list(node_id, limit=10)
    assert_keys(row, records.NodeHistoryRecord)
    (again,) = await EventRepository(pool).history(node_id)
    assert_keys(again, records.NodeHistoryRecord)


async def test_conductor_record(pool: asyncpg.Pool) -> None:
    row = await ConductorRepository(pool).register(
        hostname="records-1",
        grpc_address="127.0.0.1:1",
        conductor_group="",
        hardware_types=["fake-hardware"],
        interfaces={"fake-hardware": {"power": ["fake"]}},
    )
    assert_keys(row, records.ConductorRecord)


async def test_conductor_summary_record(pool: asyncpg.Pool) -> None:
    await ConductorRepository(pool).register(
        hostname="records-2", grpc_address="127.0.0.1:2", conductor_group="", hardware_types=[], interfaces={}
    )
    row = await ConductorListRepository(pool).get("records-2", heartbeat_timeout=60)
    assert_keys(row, records.ConductorSummaryRecord)
    assert row["alive"] is True


async def test_bios_setting_record(pool: asyncpg.Pool) -> None:
    node_id, _ = await new_node(pool)
    repo = BiosRepository(pool)
    await repo.replace(node_id, {"BootMode": "Uefi"}, {"BootMode": {"allowable_values": ["Bios", "Uefi"]}})
    (row,) = await repo.list(node_id)
    assert_keys(row, records.BiosSettingRecord)
    assert row["allowable_values"] == ["Bios", "Uefi"]


async def test_firmware_component_record(pool: asyncpg.Pool) -> None:
    node_id, _ = await new_node(pool)
    repo = FirmwareRepository(pool)
    await repo.sync(node_id, [{"component": "bios", "current_version": "1.0"}])
    (row,) = await repo.list(node_id)
    assert_keys(row, records.FirmwareComponentRecord)


async def test_node_inventory_record(pool: asyncpg.Pool) -> None:
    node_id, node_uuid = await new_node(pool)
    repo = InventoryRepository(pool)
    await repo.save(node_id, {"cpu": {"count": 2}}, {})
    assert_keys(await repo.get(node_id, node_uuid), records.NodeInventoryRecord)


async def test_object_record(pool: asyncpg.Pool) -> None:
    row, replaced = await ObjectRepository(pool).upsert(
        {
            "container": "records",
            "name": "one",
            "size": 3,
            "sha256": "0" * 64,
            "content_type": "application/octet-stream",
            "backend_key": "records/one",
            "usage_count": 0,
            "metadata": {"k": "v"},
        },
        delete_after=0,
        max_container_size=1024,
    )
    assert replaced is None
    assert_keys(row, records.ObjectRecord)
