"""The conductor side of servicing (issue 21 item 4; the REST verb at API
1.87 is issue 22's): service steps on an ``active`` node, checked against
what the interfaces offer, run in order, recorded, and refused clearly.

The steps come from the shipped ``fake`` bios interface (Ironic's: the
node's cached BIOS settings stand for the machine's BIOS), so this module
needs no BMC. The real ``redfish`` bios steps, and a step that fails and is
aborted, are tests/integration/test_bios_settings.py, on the simulator."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from typing import Any

import pytest

from services.common import errors, states
from services.common.config import ConductorConfig
from services.common.db.bios import BiosRepository
from services.common.db.node_secrets import NodeSecrets
from services.common.db.pool import create_pool
from services.common.db.records import NodeRecord
from services.common.keyring import Keyring
from services.conductor.drivers.registry import DriverRegistry
from services.conductor.manager import ConductorManager


@pytest.fixture(scope="module")
async def manager(database_url: str) -> Any:
    pool = await create_pool(database_url, max_size=10)
    cfg = dataclasses.replace(
        ConductorConfig(),
        hostname="service-conductor",
        enabled_hardware_types=("fake-hardware", "redfish"),
        enabled_bios_interfaces=("no-bios", "fake", "redfish"),
    )
    registry = DriverRegistry(cfg)
    yield ConductorManager(pool, registry, cfg, hostname="service-conductor", secrets=NodeSecrets(Keyring()))
    await pool.close()


async def active_node(m: ConductorManager) -> NodeRecord:
    return await m.create_node({"driver": "fake-hardware", "bios_interface": "fake", "provision_state": states.ACTIVE})


async def settled(m: ConductorManager, uuid: str, state: str) -> NodeRecord:
    deadline = time.monotonic() + 20
    while True:
        node = await m.nodes.get(uuid)
        if node["provision_state"] == state and node["reservation"] is None:
            return node
        assert time.monotonic() < deadline, (node["provision_state"], node["last_error"])
        await asyncio.sleep(0.05)


async def history(m: ConductorManager, uuid: str) -> list[str]:
    rows = await m.pool.fetch(
        "SELECT h.event FROM node_history h JOIN nodes n ON n.id = h.node_id WHERE n.uuid = $1::uuid ORDER BY h.id",
        uuid,
    )
    return [r["event"] for r in rows]


STEP = {"interface": "bios", "step": "apply_configuration"}
OFFERED = "offer these service steps: bios.apply_configuration (priority 0), bios.factory_reset (priority 0)"


async def bios(m: ConductorManager, node: NodeRecord) -> dict[str, str | None]:
    return {row["name"]: row["value"] for row in await BiosRepository(m.pool).list(node["id"])}


async def test_service_runs_the_requested_steps_in_order_and_returns_to_active(manager: ConductorManager) -> None:
    node = await active_node(manager)
    first = [{"name": "ProcTurboMode", "value": "Disabled"}, {"name": "BootMode", "value": "Bios"}]
    second = [{"name": "BootMode", "value": "Uefi"}]
    await manager.do_provision_action(
        node["uuid"],
        "service",
        service_steps=[{**STEP, "args": {"settings": first}}, {**STEP, "args": {"settings": second}}],
    )
    done = await settled(manager, node["uuid"], states.ACTIVE)
    assert await bios(manager, node) == {"ProcTurboMode": "Disabled", "BootMode": "Uefi"}  # the second came last
    assert done["service_step"] == {} and done["last_error"] is None
    assert "service_steps" not in done["driver_internal_info"]
    events = await history(manager, node["uuid"])
    assert [e for e in events if e.startswith("service step")] == [
        "service step bios.apply_configuration started",
        "service step bios.apply_configuration finished",
    ] * 2
    assert any("servicing finished" in e for e in events)
    await manager.do_provision_action(
        node["uuid"], "service", service_steps=[{"interface": "bios", "step": "factory_reset"}]
    )
    await settled(manager, node["uuid"], states.ACTIVE)
    assert await bios(manager, node) == {}


@pytest.mark.parametrize(
    ("steps", "words"),
    [
        ([{"interface": "bios", "step": "flash_everything"}], "no interface of the node offers"),
        ([{**STEP, "args": {"settings": "ProcTurbo=Disabled"}}], "argument settings must be of type array"),
        ([{**STEP, "args": {"settings": [{"name": "ProcTurbo", "val": 1}]}}], 'exactly "name" and "value"'),
        ([{**STEP, "args": {"settings": []}}], "settings must name at least one BIOS setting"),
        ([STEP], "missing required arguments settings"),
        ([{"interface": "deploy", "step": "erase_devices_metadata"}], "this is a clean step, not a service step"),
    ],
)
async def test_bad_service_steps_are_refused_listing_the_offered_ones(
    manager: ConductorManager, steps: list[dict[str, Any]], words: str
) -> None:
    node = await active_node(manager)
    with pytest.raises(errors.InvalidParameterValue) as refused:
        await manager.do_provision_action(node["uuid"], "service", service_steps=steps)
    assert words in refused.value.message
    assert OFFERED in refused.value.message
    after = await manager.nodes.get(node["uuid"])
    assert after["provision_state"] == states.ACTIVE and after["reservation"] is None
    assert after["driver_internal_info"] == node["driver_internal_info"]


async def test_service_with_disable_ramdisk_refuses_ramdisk_steps_and_notes_it(manager: ConductorManager) -> None:
    """REST 1.108: ``disable_ramdisk`` with ``service``. Steps that run in the ramdisk are
    refused before anything changes; the others run, and the history says so."""
    node = await active_node(manager)
    settings = [{"name": "ProcTurbo", "value": "Enabled"}]
    await manager.do_provision_action(
        node["uuid"], "service", service_steps=[{**STEP, "args": {"settings": settings}}], disable_ramdisk=True
    )
    done = await settled(manager, node["uuid"], states.ACTIVE)
    assert await bios(manager, node) == {"ProcTurbo": "Enabled"}
    assert "service_disable_ramdisk" not in done["driver_internal_info"]
    assert any("servicing finished" in e and "(ramdisk disabled)" in e for e in await history(manager, node["uuid"]))
    with pytest.raises(errors.InvalidParameterValue, match="disable_ramdisk is supported only with"):
        await manager.do_provision_action(node["uuid"], "delete", disable_ramdisk=True)
