"""One conductor's full power-state sync cycle over N nodes (issue 23; N = 10,000 by default).

The simulated BMCs run in processes of their own (bench/bmc_processes.py);
this process is one conductor on an embedded PostgreSQL, owning every node.
Nodes are created through the conductor's node repository (sealed
passwords, as the API stores them), then ``PeriodicWork.sync_power_states``
(what the periodic job runs every ``power_sync_interval``) is timed:

- cycle 1 is cold: new BMC connections or IPMI sessions, and every node's
  power state is recorded for the first time (a write and a history event
  per node);
- the later cycles are the steady state: nothing changed, nothing written.

Printed per cycle: seconds, nodes/s, and whether it fits Ironic's default
60 s sync interval; also this process's CPU seconds (the conductor's) and
the simulators'. Figures only, not a test.

    .venv/bin/python bench/power_sync.py                          # 10,000 Redfish nodes
    .venv/bin/python bench/power_sync.py --protocol ipmi --nodes 10000
    .venv/bin/python bench/power_sync.py --nodes 2000 --workers 16 --cycles 2
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import cProfile
import logging
import os
import pstats
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bmc_processes import BmcProcesses  # bench/, the script's own folder
from thread_sampler import ThreadSampler

from services.common.config import load_settings
from services.common.db import migrate
from services.common.db.embedded import EmbeddedPostgres
from services.conductor.drivers import ipmi as ipmi_driver
from services.conductor.periodic import PeriodicWork
from services.runtime import RunningStack

USER, PASSWORD = "bench", "bench-password"
SYNC_INTERVAL = 60.0  # Ironic's default sync_power_state_interval
CREATE_CONCURRENCY = 32


class FailureTally(logging.Handler):
    """Counts the reasons of failed power reads (the conductor logs each at WARNING), with the
    node-specific parts (addresses, ports, UUIDs) taken out, so a run says why reads failed."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.reasons: collections.Counter[str] = collections.Counter()

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if "power sync failed" not in message:
            return
        reason = message.split("reason=", 1)[-1]
        self.reasons[re.sub(r"[0-9a-f]{8}-[0-9a-f-]{27}|\d+(\.\d+)*", "N", reason)[:160]] += 1


def main_thread_cpu() -> float:
    """CPU seconds of this process's main thread (the event loop), not its worker threads."""
    for thread in psutil.Process().threads():
        if thread.id == os.getpid():
            return float(thread.user_time + thread.system_time)
    return 0.0


def ipmi_counters() -> tuple[int, int]:
    """(sessions opened, keep-alives answered) by this conductor's ipmitool session cache."""
    caches = [cache for cache, _ in ipmi_driver._SHARED.values()]
    return sum(c.created for c in caches), sum(c.keepalives for c in caches)


def cpu_seconds(pids: list[int]) -> float:
    total = 0.0
    for pid in pids:
        try:
            times = psutil.Process(pid).cpu_times()
            total += times.user + times.system
        except psutil.NoSuchProcess:
            pass
    return total


async def create_nodes(manager: Any, inventory: list[dict[str, Any]], protocol: str) -> None:
    gate = asyncio.Semaphore(CREATE_CONCURRENCY)

    async def one(machine: dict[str, Any]) -> None:
        if protocol == "ipmi":
            values = {"driver": "ipmi", "driver_info": machine["ipmi_driver_info"]}
        else:
            values = {"driver": "redfish", "driver_info": machine["driver_info"]}
        async with gate:
            await manager.nodes.create(
                {"uuid": machine["uuid"], "name": machine["name"], "provision_state": "manageable", **values}
            )

    await asyncio.gather(*(one(m) for m in inventory))


async def run(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="bench-power-sync-") as tmp:
        work = Path(tmp)
        os.chmod(work, 0o755)
        bmcs = BmcProcesses(
            work,
            machines=args.nodes,
            processes=args.simulators,
            ipmi=args.protocol == "ipmi",
            username=USER,
            password=PASSWORD,
        )
        pg = EmbeddedPostgres(work / "pg", fsync=False)
        stack = RunningStack()
        try:
            started = time.monotonic()
            await bmcs.start()
            print(f"{args.nodes} simulated BMCs ({args.protocol}) in {bmcs.processes} processes, up in "
                  f"{time.monotonic() - started:.1f}s")  # fmt: skip
            await asyncio.to_thread(pg.start)
            await asyncio.to_thread(pg.ensure_database, "ferrum")
            url = pg.database_url("ferrum")
            await migrate.upgrade(url)
            conductor_options: dict[str, Any] = {
                "hostname": "bench-conductor",
                "grpc_port": 0,
                "metrics_port": 0,
                "power_sync_interval": 86400.0,  # only the bench's calls sync
                "power_sync_workers": args.workers,
            }
            conductor_options.update(args.option)
            settings = load_settings(
                {},
                overrides={
                    None: {"state_dir": str(work / "state")},
                    "database": {"url": url, **({"pool_max": args.pool_max} if args.pool_max else {})},
                    "conductor": conductor_options,
                },
            )
            await stack.start(settings, ["conductor"])
            conductor: Any = next(s for s in stack.services if s.name == "conductor")
            manager = conductor.manager
            started = time.monotonic()
            await create_nodes(manager, bmcs.inventory, args.protocol)
            print(f"{args.nodes} nodes created in {time.monotonic() - started:.1f}s")
            c = settings.conductor
            print(
                f"conductor: power_sync_workers={c.power_sync_workers} redfish_workers={c.redfish_workers} "
                f"ipmi_workers={c.ipmi_workers} ipmi_max_sessions={c.ipmi_max_sessions} "
                f"database pool_max={settings.database.pool_max}"
            )
            periodic = PeriodicWork(manager, registration={})
            tally = FailureTally()
            logging.getLogger("services.conductor.periodic").addHandler(tally)
            me = [os.getpid()]
            cores = os.cpu_count() or 1
            print(f"\n{'cycle':<7}{'seconds':>9}{'nodes/s':>9}{'changed':>9}{'conductor cpu s':>17}"
                  f"{'loop cpu s':>11}{'BMCs cpu s':>12}{'sessions':>10}{'keep-alives':>13}{'load':>7}"
                  f"  within {SYNC_INTERVAL:g}s?")  # fmt: skip
            for cycle in range(1, args.cycles + 1):
                if cycle > 1 and args.pause:
                    await asyncio.sleep(args.pause)  # sessions sit idle, as between real sync intervals
                cpu0, sim0, loop0 = cpu_seconds(me), cpu_seconds(bmcs.pids()), main_thread_cpu()
                opened0, kept0 = ipmi_counters()
                last = cycle == args.cycles
                profile = cProfile.Profile() if args.profile and last else None
                sampler = ThreadSampler() if args.sample and last else None
                t0 = time.monotonic()
                if profile is not None:
                    profile.enable()
                if sampler is not None:
                    sampler.start()
                changed = await periodic.sync_power_states()
                if profile is not None:
                    profile.disable()
                if sampler is not None:
                    sampler.stop()
                elapsed = time.monotonic() - t0
                cpu1, sim1, loop1 = cpu_seconds(me), cpu_seconds(bmcs.pids()), main_thread_cpu()
                opened1, kept1 = ipmi_counters()
                print(
                    f"{cycle:<7}{elapsed:>9.1f}{args.nodes / elapsed:>9.0f}{changed:>9}{cpu1 - cpu0:>17.1f}{loop1 - loop0:>11.1f}"
                    f"{sim1 - sim0:>12.1f}{opened1 - opened0:>10}{kept1 - kept0:>13}{os.getloadavg()[0]:>7.1f}"
                    f"  {'yes' if elapsed <= SYNC_INTERVAL else 'NO'}"
                )
                # The honest split: CPU seconds per node on each side, and the shortest cycle this
                # machine's cores allow when the conductor and the simulated BMCs share them.
                print(
                    f"{'':<7}per node: conductor {1000 * (cpu1 - cpu0) / args.nodes:.2f} ms CPU, simulated BMCs "
                    f"{1000 * (sim1 - sim0) / args.nodes:.2f} ms CPU; both together need >= "
                    f"{(cpu1 - cpu0 + sim1 - sim0) / cores:.1f}s on {cores} cores, the conductor alone "
                    f"{(cpu1 - cpu0) / cores:.1f}s"
                )
            if profile is not None:
                pstats.Stats(profile).sort_stats("tottime").print_stats(args.profile)
            if sampler is not None:
                print(sampler.report(args.sample))
            failures = sum(1 for n in periodic._power_sync_failures.values() if n)
            print(f"\nnodes whose last read failed: {failures}")
            for reason, count in tally.reasons.most_common(8):
                print(f"  {count:6d}  {reason}")
            for log in sorted(work.glob("sim*.log")):  # what the simulated BMCs complained about
                lines = [line for line in log.read_text(errors="replace").splitlines() if line.strip()]
                print(f"{log.name}: {len(lines)} log lines" + "".join(f"\n  {line[:200]}" for line in lines[-8:]))
        finally:
            await stack.close()
            await bmcs.stop()
            await asyncio.to_thread(pg.stop)


def option(text: str) -> tuple[str, Any]:
    name, _, value = text.partition("=")
    try:
        return name, int(value)
    except ValueError:
        return name, float(value)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=10_000, help="nodes and simulated BMCs (default 10000)")
    parser.add_argument("--protocol", choices=("redfish", "ipmi"), default="redfish")
    parser.add_argument(
        "--pause", type=float, default=0.0, help="seconds idle between cycles (default 0; the sync interval is 60)"
    )
    parser.add_argument("--simulators", type=int, default=2, help="simulator processes (default 2)")
    parser.add_argument("--workers", type=int, default=64, help="power_sync_workers (default 64, the config's)")
    parser.add_argument("--cycles", type=int, default=3, help="sync cycles to time (default 3)")
    parser.add_argument(
        "--profile", type=int, default=0, help="print the event loop's N busiest functions in the last cycle"
    )
    parser.add_argument(
        "--sample", type=int, default=0, help="print the N commonest frames of all threads (sampled) in the last cycle"
    )
    parser.add_argument("--pool-max", type=int, default=0, help="database pool_max (default: the config's)")
    parser.add_argument(
        "--option", type=option, action="append", default=[], help="another [conductor] option, NAME=NUMBER"
    )
    args = parser.parse_args()
    args.option = dict(args.option)
    logging.basicConfig(level=logging.ERROR)
    logging.getLogger("services.conductor.periodic").setLevel(logging.WARNING)
    logging.getLogger("services.conductor.periodic").propagate = False
    asyncio.run(run(args))


if __name__ == "__main__":
    main()
