"""A conductor killed while it writes images over iSCSI (issue 18, the
take-over rules of issue 14).

api, two conductors, the renderer, the object store and the simulator run as
separate processes. Machines deploy with the ``iscsi`` deploy interface; while
the conductor writes several of them (``deploy_phase`` ``iscsi_write``), the
one that owns the most is SIGKILLed (its qemu-img children die with it). The
surviving conductor takes the nodes over, logs in to the targets the agents
still serve, writes again from the start, and every machine reaches
``active`` with its disk equal to the image and nothing failed on the way.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import aiohttp
import pytest

from services.common.db.conductors import ConductorRepository
from services.common.hashring import ConductorRings
from tests.processfleet import ProcessFleet

MACHINES = 6
pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]


async def writers(fleet: ProcessFleet) -> dict[str, list[str]]:
    """Nodes the conductors are writing over iSCSI now, per owning conductor."""
    assert fleet.pool is not None
    rings = ConductorRings(await ConductorRepository(fleet.pool).list_alive(30.0))
    found: dict[str, list[str]] = {}
    for row in await fleet.pool.fetch(
        "SELECT uuid::text, driver, conductor_group FROM nodes WHERE provision_state = 'wait call-back' "
        "AND driver_internal_info->>'deploy_phase' = 'iscsi_write'"
    ):
        owner = rings.owner(row["uuid"], row["driver"], row["conductor_group"])
        if owner is not None:
            found.setdefault(owner["hostname"], []).append(row["uuid"])
    return found


async def test_conductor_killed_mid_iscsi_write(tmp_path: Path) -> None:
    fleet = ProcessFleet(
        tmp_path / "fleet", machines=MACHINES, image_mib=256, disk_size="512MiB", deploy_interface="iscsi"
    )
    try:
        await fleet.start()
        async with aiohttp.ClientSession() as session:
            uuids = await fleet.enroll_all(session)
            await asyncio.gather(*(fleet.deploy(session, u, f"host-{i}") for i, u in enumerate(uuids)))

            deadline = time.monotonic() + 180
            while True:
                busy = await writers(fleet)
                if busy:
                    break
                assert time.monotonic() < deadline, "no conductor ever wrote over iSCSI"
                await asyncio.sleep(0.02)
            victim = max(busy, key=lambda name: len(busy[name]))
            interrupted = busy[victim]
            fleet.kill(victim)

            await fleet.wait_state(session, uuids, "active", timeout=300)
            assert fleet.pool is not None
            failures = await fleet.pool.fetch(
                "SELECT n.name, e.message FROM node_events e JOIN nodes n ON n.uuid = e.node_uuid "
                "WHERE e.event = 'fail' OR e.provision_state = 'deploy failed'"
            )
            assert not failures, failures
            resumed = await fleet.pool.fetchval(
                "SELECT count(*) FROM node_events WHERE event IN ('flow-resume', 'take-over') "
                "AND node_uuid = ANY($1::uuid[])",
                interrupted,
            )
            assert resumed > 0, "the interrupted writes were not taken over"
            names = {m["name"]: m for m in fleet.inventory}
            for row in await fleet.pool.fetch("SELECT name, driver_internal_info FROM nodes"):
                assert fleet.disk_matches_image(names[row["name"]]), f"{row['name']}: disk differs from the image"
    finally:
        await fleet.stop()
