"""A conductor killed while it runs consoles (issue 23): the survivor starts them again.

api, two conductors, the renderer, the object store and the simulator run as
separate processes (tests/processfleet.py). Every machine's node gets the
``simulator`` console, enabled over REST; the conductor that runs the most of
them is SIGKILLed (no stop, no clean-up: its proxies vanish with it). Each
console must come back on the survivor: the api's GET names a new URL, a raw
TCP client attached there sees the machine's console when it is powered on,
and the history says which conductor started it again.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import pytest

from tests.processfleet import ProcessFleet

MACHINES = 4
pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


async def console_info(fleet: ProcessFleet, session: aiohttp.ClientSession, ident: str) -> dict[str, Any] | None:
    async with session.get(
        f"{fleet.api}/v1/nodes/{ident}/states/console", headers={"X-OpenStack-Ironic-API-Version": "1.56"}
    ) as r:
        if r.status != 200:
            return None  # 503 while the new owner starts it
        body = await r.json()
        return dict(body["console_info"]) if body["console_enabled"] and body["console_info"] else None


async def test_consoles_come_back_on_the_survivor(tmp_path: Path) -> None:
    fleet = ProcessFleet(
        tmp_path,
        machines=MACHINES,
        image_mib=8,
        env={
            "FERRUM_CONDUCTOR_ENABLED_CONSOLE_INTERFACES": "no-console,simulator",
            "FERRUM_CONDUCTOR_CONSOLE_POLL_INTERVAL": "0.2",
            "FERRUM_CONDUCTOR_CONSOLE_CHECK_INTERVAL": "1",
        },
    )
    await fleet.start()
    try:
        async with aiohttp.ClientSession() as session:
            nodes: list[str] = []
            for machine in fleet.inventory:
                node = await fleet.call(
                    session,
                    "POST",
                    "/v1/nodes",
                    {
                        "name": machine["name"],
                        "driver": "redfish",
                        "console_interface": "simulator",
                        "driver_info": machine["driver_info"],
                    },
                )
                await fleet.call(session, "PUT", f"/v1/nodes/{node['uuid']}/states/console", {"enabled": True})
                nodes.append(node["uuid"])
            assert fleet.pool is not None
            before = {ident: await console_info(fleet, session, ident) for ident in nodes}
            assert all(before.values()), before
            owners = {
                r["uuid"]: r["conductor"]
                for r in await fleet.pool.fetch(
                    "SELECT DISTINCT ON (n.uuid) n.uuid::text AS uuid, h.conductor FROM node_history h "
                    "JOIN nodes n ON n.id = h.node_id WHERE h.event_type = 'console' ORDER BY n.uuid, h.id DESC"
                )
            }
            victim = max(fleet.conductor_names, key=lambda c: sum(1 for o in owners.values() if o == c))
            survivor = next(c for c in fleet.conductor_names if c != victim)
            moved = [ident for ident, owner in owners.items() if owner == victim]
            assert moved
            fleet.kill(victim)
            killed = time.monotonic()

            restored: dict[str, dict[str, Any]] = {}
            deadline = killed + 90
            while len(restored) < len(moved):
                for ident in moved:
                    info = await console_info(fleet, session, ident)
                    if info and info["url"] != before[ident]["url"]:  # type: ignore[index]
                        restored[ident] = info
                assert time.monotonic() < deadline, (
                    f"consoles not back on {survivor}: {sorted(set(moved) - set(restored))}"
                )
                await asyncio.sleep(0.2)
            took = time.monotonic() - killed
            print(f"\n{len(moved)} consoles back on {survivor} {took:.1f} s after {victim} was killed")

            ident = moved[0]
            url = urlsplit(restored[ident]["url"])
            reader, writer = await asyncio.open_connection(url.hostname, url.port)
            try:
                await fleet.call(session, "PUT", f"/v1/nodes/{ident}/states/power", {"target": "power on"})
                seen = b""
                while b"firmware_start" not in seen:
                    chunk = await asyncio.wait_for(reader.read(4096), 30)
                    assert chunk, seen
                    seen += chunk
            finally:
                writer.close()
            rows = await fleet.pool.fetch(
                "SELECT h.event FROM node_history h JOIN nodes n ON n.id = h.node_id "
                "WHERE n.uuid = ANY($1::uuid[]) AND h.event_type = 'console'",
                moved,
            )
            started_again = [r["event"] for r in rows if r["event"] == f"console started again on conductor {survivor}"]
            assert len(started_again) == len(moved)
    finally:
        await fleet.stop()
