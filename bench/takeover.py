"""How fast a dead conductor is noticed and its deploys finished by the survivors.

api, two conductors, the renderer, the object store and the simulator run as
separate processes (tests/processfleet.py) on their own PostgreSQL. N
machines with a BMC power delay are deployed at once; when a third of them
are writing their image, the conductor owning the most in-flight nodes is
SIGKILLed. Printed per fleet size:

- detection: kill -> the conductor is gone from the live ring (the liveness
  lock; the heartbeat timeout, 30 s by default, is only the fallback);
- first resume: kill -> the survivor resumed (or took over) its first node;
- settled: kill -> every node that conductor owned in flight is ``active``
  and unlocked (resumed by the survivor, not failed);
- how many nodes it owned, how many the survivor resumed, and failures.

    .venv/bin/python bench/takeover.py            # 60 and 200 machines
    .venv/bin/python bench/takeover.py --machines 60
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from services.common.db.conductors import ConductorRepository
from services.common.hashring import ConductorRings
from tests.processfleet import ProcessFleet

IN_FLIGHT = ("deploying", "wait call-back")


async def run(machines: int, *, power_delay: str, image_mib: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="ferrum-takeover-") as tmp:
        fleet = ProcessFleet(
            Path(tmp), machines=machines, power_delay=power_delay, image_mib=image_mib, disk_size="256MiB"
        )
        try:
            await fleet.start()
            assert fleet.pool is not None
            pool = fleet.pool
            async with aiohttp.ClientSession() as session:
                uuids = await fleet.enroll_all(session)
                await asyncio.gather(*(fleet.deploy(session, u, f"h{i}") for i, u in enumerate(uuids)))
                while (
                    await pool.fetchval(
                        "SELECT count(*) FROM nodes WHERE driver_internal_info->>'deploy_phase' = 'write_image'"
                    )
                    < machines // 3
                ):
                    await asyncio.sleep(0.05)
                rings = ConductorRings(await ConductorRepository(pool).list_alive(30.0))
                owned: dict[str, list[str]] = {}
                for row in await pool.fetch(
                    "SELECT uuid::text, driver, conductor_group FROM nodes WHERE provision_state = ANY($1::text[])",
                    list(IN_FLIGHT),
                ):
                    owner = rings.owner(row["uuid"], row["driver"], row["conductor_group"])
                    if owner is not None:
                        owned.setdefault(owner["hostname"], []).append(row["uuid"])
                victim = max(owned, key=lambda name: len(owned[name]))
                last_event = await pool.fetchval("SELECT coalesce(max(sequence), 0) FROM node_events")
                killed = time.monotonic()
                fleet.kill(victim)
                conductors = ConductorRepository(pool)
                while victim in {c["hostname"] for c in await conductors.list_alive(30.0)}:
                    await asyncio.sleep(0.02)
                detected = time.monotonic() - killed
                while not await pool.fetchval(
                    "SELECT count(*) FROM node_events WHERE sequence > $1 AND event IN ('flow-resume', 'take-over')",
                    last_event,
                ):
                    await asyncio.sleep(0.02)
                acted = time.monotonic() - killed
                pending = set(owned[victim])
                while pending:
                    rows = await pool.fetch(
                        "SELECT uuid::text, provision_state, reservation FROM nodes WHERE uuid = ANY($1::uuid[])",
                        list(pending),
                    )
                    for row in rows:
                        done = row["provision_state"] == "active" and row["reservation"] is None
                        if done or row["provision_state"] == "deploy failed":
                            pending.discard(row["uuid"])
                    if time.monotonic() - killed > 900:
                        break
                    await asyncio.sleep(0.1)
                settled = time.monotonic() - killed
                await fleet.wait_state(session, uuids, "active", timeout=900)
                failed = await pool.fetchval(
                    "SELECT count(DISTINCT node_uuid) FROM node_events WHERE event = 'fail' "
                    "OR provision_state = 'deploy failed'"
                )
                resumed = await pool.fetchval(
                    "SELECT count(DISTINCT node_uuid) FROM node_events WHERE event = 'flow-resume'"
                )
                return {
                    "machines": machines,
                    "owned": len(owned[victim]),
                    "detected": detected,
                    "acted": acted,
                    "settled": settled,
                    "resumed": resumed,
                    "failed": failed,
                }
        finally:
            await fleet.stop()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--machines", type=int, action="append", help="fleet size (repeatable; default 60 and 200)")
    parser.add_argument("--power-delay", default="1,4", help="BMC power delay, seconds min,max (default 1,4)")
    parser.add_argument("--image-mib", type=int, default=32, help="image size in MiB (default 32)")
    args = parser.parse_args()
    print(
        f"{'machines':>8} {'owned':>6} {'detection':>10} {'first resume':>13} {'settled':>9} "
        f"{'resumed':>8} {'failed':>7}"
    )
    for machines in args.machines or [60, 200]:
        r = await run(machines, power_delay=args.power_delay, image_mib=args.image_mib)
        print(
            f"{r['machines']:>8} {r['owned']:>6} {r['detected']:>9.2f}s {r['acted']:>12.2f}s {r['settled']:>8.1f}s "
            f"{r['resumed']:>8} {r['failed']:>7}",
            flush=True,
        )


if __name__ == "__main__":
    asyncio.run(main())
