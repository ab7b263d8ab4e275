"""Nothing fails because a conductor died (issue 14).

api, two conductors, the renderer, the object store and the simulator run as
separate processes on their own PostgreSQL. 12 machines with a BMC power
delay are deployed at once with a config drive. While about a third of them
are writing their image, the conductor that owns the most in-flight nodes is
SIGKILLed, and PostgreSQL is restarted shortly after. Every machine must
reach ``active`` with its disk equal to the image, no node may have failed on
the way, the kill must be seen within 5 s, and the power state the database
holds must match the BMC.
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

MACHINES = 12
IN_FLIGHT = ("deploying", "wait call-back")

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


async def owner_counts(fleet: ProcessFleet) -> dict[str, int]:
    """In-flight nodes per owning conductor on the live ring."""
    assert fleet.pool is not None
    rings = ConductorRings(await ConductorRepository(fleet.pool).list_alive(30.0))
    counts: dict[str, int] = {}
    for row in await fleet.pool.fetch(
        "SELECT uuid::text, driver, conductor_group FROM nodes WHERE provision_state = ANY($1::text[])",
        list(IN_FLIGHT),
    ):
        owner = rings.owner(row["uuid"], row["driver"], row["conductor_group"])
        if owner is not None:
            counts[owner["hostname"]] = counts.get(owner["hostname"], 0) + 1
    return counts


async def writing(fleet: ProcessFleet) -> int:
    assert fleet.pool is not None
    return int(
        await fleet.pool.fetchval(
            "SELECT count(*) FROM nodes WHERE provision_state = 'wait call-back' "
            "AND driver_internal_info->>'deploy_phase' = 'write_image'"
        )
    )


async def test_conductor_killed_mid_deploy_then_database_restart(tmp_path: Path) -> None:
    fleet = ProcessFleet(tmp_path / "fleet", machines=MACHINES, power_delay="1,4", image_mib=64)
    try:
        await fleet.start()
        async with aiohttp.ClientSession() as session:
            uuids = await fleet.enroll_all(session)
            names = {m["name"]: m for m in fleet.inventory}
            await asyncio.gather(*(fleet.deploy(session, u, f"host-{i}") for i, u in enumerate(uuids)))

            # Kill the busiest conductor while about a third of the machines write their image.
            deadline = time.monotonic() + 180
            while await writing(fleet) < MACHINES // 3:
                assert time.monotonic() < deadline, "the machines never started writing"
                await asyncio.sleep(0.05)
            counts = await owner_counts(fleet)
            victim = max(counts, key=lambda name: counts[name])
            assert counts[victim] > 0
            fleet.kill(victim)
            killed_at = time.monotonic()

            assert fleet.pool is not None
            conductors = ConductorRepository(fleet.pool)
            while victim in {c["hostname"] for c in await conductors.list_alive(30.0)}:
                await asyncio.sleep(0.05)
            detected = time.monotonic() - killed_at
            assert detected < 5.0, f"the dead conductor was seen after {detected:.1f} s"

            await asyncio.sleep(max(0.0, 3.0 - detected))
            await fleet.restart_database()
            await fleet.pool.expire_connections()

            await fleet.wait_state(session, uuids, "active", timeout=420)

            failures = await fleet.pool.fetch(
                "SELECT n.name, e.message FROM node_events e JOIN nodes n ON n.uuid = e.node_uuid "
                "WHERE e.event = 'fail' OR e.provision_state = 'deploy failed'"
            )
            assert not failures, failures  # nothing failed because a conductor died
            resumed = await fleet.pool.fetchval(
                "SELECT count(*) FROM node_events WHERE event IN ('flow-resume', 'take-over')"
            )
            assert resumed > 0, "the killed conductor held no in-flight node: the test proved nothing"

            for node in await fleet.pool.fetch("SELECT name, power_state FROM nodes"):
                machine = names[node["name"]]
                assert fleet.disk_matches_image(machine), f"{node['name']}: disk differs from the image"
                async with session.get(
                    machine["driver_info"]["redfish_address"] + machine["driver_info"]["redfish_system_id"]
                ) as r:
                    bmc = (await r.json())["PowerState"]
                assert node["power_state"] == f"power {bmc.lower()}", (node["name"], node["power_state"], bmc)
    finally:
        await fleet.stop()
