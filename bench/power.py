"""Power-state reads per second over IPMI and over Redfish (issue 23).

N simulated machines answer both IPMI (pyghmi's BMC server, one UDP port
each) and Redfish (one HTTP service per simulator process). The simulators
run as ``ferrum simulator`` processes of their own (``--simulators``,
bench/bmc_processes.py), so this process holds only the conductor's side:
its ``ipmitool`` and ``redfish`` power interfaces read every machine's
power state:

1. **first pass**: one read per machine, all at once: for IPMI this opens
   a session per BMC (the cache's ``created`` count), for Redfish it makes a
   sushy connection per BMC address (one here: the simulator's);
2. **steady state**: reads of all machines, round after round, for
   ``--seconds``; reads per second, and the latency percentiles.

Each protocol is measured on its own; the simulators' CPU is printed next
to the conductor side's. Figures only, not a test. The full power-sync
cycle (database included) is bench/power_sync.py.

    .venv/bin/python bench/power.py                  # 200 machines, 5 s each
    .venv/bin/python bench/power.py --machines 1000  # the large run
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bmc_processes import BmcProcesses  # noqa: E402 - bench/, the script's own folder
from power_sync import cpu_seconds  # noqa: E402 - bench/

from services.conductor.drivers import base  # noqa: E402
from services.conductor.drivers.ipmi import IpmiPower  # noqa: E402
from services.conductor.drivers.redfish import RedfishPower  # noqa: E402

USER, PASSWORD = "bench", "bench-password"


def task(node: dict[str, Any]) -> base.Task:
    return base.Task(node=node, ports=[], driver=None, conductor="bench")  # type: ignore[arg-type]


async def measure(name: str, power: Any, tasks: list[base.Task], seconds: float) -> dict[str, Any]:
    started = time.monotonic()
    first = await asyncio.gather(*(power.get_power_state(t) for t in tasks), return_exceptions=True)
    first_s = time.monotonic() - started
    errors = [f for f in first if isinstance(f, BaseException)]
    latencies: list[float] = []
    failures = 0
    deadline = time.monotonic() + seconds
    began = time.monotonic()

    async def one(t: base.Task) -> None:
        nonlocal failures
        t0 = time.monotonic()
        try:
            await power.get_power_state(t)
            latencies.append(time.monotonic() - t0)
        except Exception:
            failures += 1

    while time.monotonic() < deadline:
        await asyncio.gather(*(one(t) for t in tasks))
    elapsed = time.monotonic() - began
    latencies.sort()

    def pct(p: float) -> float:
        return latencies[min(len(latencies) - 1, int(p * len(latencies)))] * 1000 if latencies else float("nan")

    return {
        "name": name,
        "first_pass_s": first_s,
        "first_errors": len(errors),
        "first_error": str(errors[0])[:200] if errors else "",
        "reads": len(latencies),
        "failures": failures,
        "per_s": len(latencies) / elapsed if elapsed else 0.0,
        "p50_ms": pct(0.5),
        "p99_ms": pct(0.99),
        "mean_ms": statistics.fmean(latencies) * 1000 if latencies else float("nan"),
    }


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--machines", type=int, default=200, help="simulated machines (default 200; try 1000)")
    parser.add_argument("--seconds", type=float, default=5.0, help="steady-state time per protocol (default 5)")
    parser.add_argument("--simulators", type=int, default=1, help="simulator processes (default 1)")
    parser.add_argument("--workers", type=int, default=16, help="ipmi_workers and redfish_workers (default 16)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)

    with tempfile.TemporaryDirectory(prefix="bench-power-") as tmp:
        bmcs = BmcProcesses(
            Path(tmp), machines=args.machines, processes=args.simulators, ipmi=True, username=USER, password=PASSWORD
        )
        started = time.monotonic()
        await bmcs.start()
        print(
            f"simulators: {args.machines} machines (IPMI + Redfish) in {bmcs.processes} processes, "
            f"up in {time.monotonic() - started:.1f}s"
        )
        options = {"ipmi_workers": args.workers, "redfish_workers": args.workers, "ipmi_timeout": 10}
        ipmi, redfish = IpmiPower(options), RedfishPower(options)
        results = []
        me = [os.getpid()]
        try:
            for name, power, key in (
                ("ipmi (ipmitool)", ipmi, "ipmi_driver_info"),
                ("redfish", redfish, "driver_info"),
            ):
                tasks = [task({"uuid": m["uuid"], "driver_info": m[key]}) for m in bmcs.inventory]
                cpu0, sim0 = cpu_seconds(me), cpu_seconds(bmcs.pids())
                result = await measure(name, power, tasks, args.seconds)
                result["cpu_s"], result["sim_cpu_s"] = cpu_seconds(me) - cpu0, cpu_seconds(bmcs.pids()) - sim0
                results.append(result)
                if power is ipmi:
                    sessions = ipmi.sessions.created
                    descriptors = len(os.listdir("/proc/self/fd"))
        finally:
            await ipmi.close()
            await redfish.close()
            await bmcs.stop()

    print(f"{args.workers} worker threads per interface; steady state {args.seconds:g}s per protocol\n")
    print(
        f"{'protocol':<17}{'1st pass':>10}{'reads/s':>10}{'p50 ms':>9}{'p99 ms':>9}{'reads':>8}{'failed':>8}"
        f"{'cpu s':>8}{'BMCs cpu s':>12}"
    )
    for r in results:
        print(
            f"{r['name']:<17}{r['first_pass_s']:>9.2f}s{r['per_s']:>10.0f}{r['p50_ms']:>9.1f}{r['p99_ms']:>9.1f}"
            f"{r['reads']:>8}{r['failures'] + r['first_errors']:>8}{r['cpu_s']:>8.1f}{r['sim_cpu_s']:>12.1f}"
        )
        if r["first_error"]:
            print(f"  first error: {r['first_error']}")
    print(f"\nIPMI sessions opened: {sessions} for {args.machines} BMCs (reused for every later read)")
    print(f"descriptors open in this (the conductor's) process after the IPMI run: {descriptors}")


if __name__ == "__main__":
    asyncio.run(main())
