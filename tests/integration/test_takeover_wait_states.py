"""A conductor killed while its nodes inspect, clean or rescue: inspection,
cleaning and rescue finish on the survivor (issue 21, "take-over tests for the
new wait states").

api, two conductors, the renderer, the object store and the simulator run as
separate processes (tests/processfleet.py). For each flow in turn, every
machine starts it at once; as soon as the conductor that owns the most
in-flight nodes (booting the ramdisk, or waiting for it) holds at least one,
it is SIGKILLed. Every node must reach the flow's end state with no failure,
and only the survivor may have written to the dead conductor's nodes since
the kill (a locked node is resumed; a waiting one is finished when its
ramdisk's call-back reaches the new owner through the api's ring). The killed
conductor is started again before the next flow.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from services.common.db.conductors import ConductorRepository
from services.common.hashring import ConductorRings
from tests.processfleet import FAILED_STATES, ProcessFleet

MACHINES = 8
RESCUE_PASSWORD = "take-over-rescue"

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


async def waiting_by_owner(fleet: ProcessFleet, states: tuple[str, ...]) -> dict[str, list[str]]:
    """Nodes in ``states`` per owning conductor on the live ring."""
    assert fleet.pool is not None
    rings = ConductorRings(await ConductorRepository(fleet.pool).list_alive(30.0))
    owned: dict[str, list[str]] = {}
    for row in await fleet.pool.fetch(
        "SELECT uuid::text, driver, conductor_group FROM nodes WHERE provision_state = ANY($1::text[])", list(states)
    ):
        owner = rings.owner(row["uuid"], row["driver"], row["conductor_group"])
        if owner is not None:
            owned.setdefault(owner["hostname"], []).append(row["uuid"])
    return owned


async def kill_while_waiting(fleet: ProcessFleet, in_flight: tuple[str, ...]) -> tuple[str, list[str], Any]:
    """SIGKILL the conductor owning most nodes ``in_flight``, once it owns one: its name,
    those nodes, and the database's clock at the kill."""
    assert fleet.pool is not None
    deadline = time.monotonic() + 120
    while True:
        owned = await waiting_by_owner(fleet, in_flight)
        if owned:
            victim = max(owned, key=lambda name: len(owned[name]))
            killed_at = await fleet.pool.fetchval("SELECT now()")
            fleet.kill(victim)
            return victim, owned[victim], killed_at
        states = {
            r["provision_state"]: r["n"]
            for r in await fleet.pool.fetch("SELECT provision_state, count(*) AS n FROM nodes GROUP BY 1")
        }
        failed = await fleet.pool.fetch(
            "SELECT name, provision_state, last_error FROM nodes WHERE provision_state = ANY($1::text[])",
            list(FAILED_STATES),
        )
        assert not failed, [dict(r) for r in failed]
        assert time.monotonic() < deadline, f"no node reached {in_flight}: {states}"
        await asyncio.sleep(0.05)


async def finished_by(fleet: ProcessFleet, uuids: list[str], since: Any) -> set[str]:
    """The conductors that recorded events on ``uuids`` after ``since``."""
    assert fleet.pool is not None
    rows = await fleet.pool.fetch(
        "SELECT DISTINCT conductor FROM node_events WHERE node_uuid = ANY($1::uuid[]) AND created_at > $2",
        uuids,
        since,
    )
    return {r["conductor"] for r in rows if r["conductor"]}


async def enroll(fleet: ProcessFleet, session: aiohttp.ClientSession) -> list[str]:
    """Every machine enrolled with agent inspection and rescue, manageable."""
    assert fleet.image is not None
    image_url, kernel, ramdisk = await fleet.publish_image()

    async def one(machine: dict[str, Any]) -> str:
        node = await fleet.call(
            session,
            "POST",
            "/v1/nodes",
            {
                "name": machine["name"],
                "driver": "redfish",
                "boot_interface": "ipxe",
                "deploy_interface": "direct",
                "inspect_interface": "agent",
                "rescue_interface": "agent",
                "driver_info": {
                    **machine["driver_info"],
                    "deploy_kernel": kernel,
                    "deploy_ramdisk": ramdisk,
                    "rescue_kernel": kernel,
                    "rescue_ramdisk": ramdisk,
                },
                "properties": {"root_device": {"serial": machine["disk_serial"]}},
                "instance_info": {
                    "image_source": image_url,
                    "image_os_hash_algo": "sha256",
                    "image_os_hash_value": fleet.image.sha256,  # type: ignore[union-attr]
                },
            },
        )
        await fleet.call(session, "POST", "/v1/ports", {"node_uuid": node["uuid"], "address": machine["macs"][0]})
        await fleet.call(session, "PUT", f"/v1/nodes/{node['uuid']}/states/provision", {"target": "manage"})
        return str(node["uuid"])

    uuids = list(await asyncio.gather(*(one(m) for m in fleet.inventory)))
    await fleet.wait_state(session, uuids, "manageable", timeout=120)
    return uuids


async def each(fleet: ProcessFleet, session: aiohttp.ClientSession, uuids: list[str], body: dict[str, Any]) -> None:
    await asyncio.gather(*(fleet.call(session, "PUT", f"/v1/nodes/{uuid}/states/provision", body) for uuid in uuids))


async def test_inspection_cleaning_and_rescue_survive_a_killed_conductor(tmp_path: Path) -> None:
    fleet = ProcessFleet(tmp_path / "fleet", machines=MACHINES, power_delay="1,3", image_mib=16)
    try:
        await fleet.start()
        async with aiohttp.ClientSession() as session:
            uuids = await enroll(fleet, session)
            flows: list[tuple[dict[str, Any], tuple[str, ...], str]] = [
                ({"target": "inspect"}, ("inspecting", "inspect wait"), "manageable"),
                ({"target": "provide"}, ("cleaning", "clean wait"), "available"),
                ({"target": "active"}, (), "active"),  # no kill: rescue needs a deployed node
                ({"target": "rescue", "rescue_password": RESCUE_PASSWORD}, ("rescuing", "rescue wait"), "rescue"),
            ]
            for body, in_flight, end_state in flows:
                await each(fleet, session, uuids, body)
                if not in_flight:
                    await fleet.wait_state(session, uuids, end_state, timeout=240)
                    continue
                victim, stranded, killed_at = await kill_while_waiting(fleet, in_flight)
                await fleet.wait_state(session, uuids, end_state, timeout=240)
                # The nodes the dead conductor left waiting were finished by the survivor: the
                # ramdisk's call-back reached it through the api's ring, and it alone wrote since.
                survivors = set(fleet.conductor_names) - {victim}
                writers = await finished_by(fleet, stranded, killed_at)
                assert writers and writers <= survivors, (victim, in_flight, writers)
                await fleet.start_conductor(victim)
            for uuid in uuids:
                node = await fleet.call(session, "GET", f"/v1/nodes/{uuid}")
                assert node["last_error"] is None, (node["name"], node["last_error"])
                assert node["properties"].get("cpus"), node["properties"]  # inspected
            assert fleet.pool is not None
            failures = await fleet.pool.fetchval("SELECT count(*) FROM node_events WHERE event = 'fail'")
            assert failures == 0
    finally:
        await fleet.stop()
