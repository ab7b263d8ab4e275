"""Fake-hardware lifecycle throughput through the REST API, as operators run it.

Enroll (node + port), manage, provide, deploy and undeploy N fake nodes with
C concurrent aiohttp clients. The api is one `ferrum api` process and each
conductor is its own `ferrum conductor` process (1 or 2 of them), all on one
embedded PostgreSQL that this script starts, so each conductor's memory can be
read on its own from /proc. Prints nodes/s per step and p50/p99 per
request-to-stable transition, GET node and list-detail latency, and the
conductors' RSS growth per 1,000 nodes, beside the Ironic figures from issues
3 and 4 and the ratio. Figures only; nothing here passes or fails.

    .venv/bin/python bench/lifecycle.py                      # 1,000 nodes, 1 then 2 conductors
    .venv/bin/python bench/lifecycle.py --nodes 10000 --conductors 1

The client is aiohttp, not openstacksdk (which the issues' Ironic figures used),
so the client's own cost is lower than in the Ironic runs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from services.common.db import migrate  # noqa: E402
from services.common.db.embedded import EmbeddedPostgres  # noqa: E402

V = {"X-OpenStack-Ironic-API-Version": "1.56"}
RETRY_FOR = 120.0  # seconds a request may keep getting 409/503, or a node may take to settle
# Ironic 39 all-in-one, fake hardware, PostgreSQL, openstacksdk with 8-16 workers, same
# 2-core machine class (issue 3 "Performance"; issue 4 gives manage ~12/s, provide ~7/s).
IRONIC_RATE = {"enroll (node+port)": 11.0, "manage": 12.0, "provide": 7.0, "deploy": 6.0, "undeploy": 6.0}
IRONIC_GET_MS = (17.0, 31.0)
IRONIC_DETAIL_200_MS = 600.0
STEPS = (
    ("manage", "manage", "manageable"),
    ("provide", "provide", "available"),
    ("deploy", "active", "active"),
    ("undeploy", "deleted", "available"),
)


@dataclass
class Run:
    """The figures of one run (N nodes, C conductors)."""

    nodes: int
    conductors: int
    rows: list[tuple[str, float, list[float]]] = field(default_factory=list)
    gets: list[float] = field(default_factory=list)
    details: list[float] = field(default_factory=list)
    rss: dict[str, dict[str, float]] = field(default_factory=dict)  # conductor -> {idle, enrolled, end, hwm}
    owned: dict[str, int] = field(default_factory=dict)  # conductor -> nodes it deployed
    api_rss: float = 0.0
    seconds: float = 0.0


# -- processes -------------------------------------------------------------------


def status_mib(pid: int, key: str) -> float:
    """A /proc/PID/status memory figure (VmRSS, VmHWM) in MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"{key} missing for pid {pid}")


def start(args: list[str], ports: Path, log: Path, env: dict[str, str]) -> subprocess.Popen:
    """One ferrum service as its own process; its log goes to a file (a pipe could fill up)."""
    with log.open("w") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "services.cli", *args, "--ports-file", str(ports)],
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=out,
        )


async def ports_of(path: Path, process: subprocess.Popen, log: Path) -> dict[str, str]:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if path.exists() and path.read_text():
            return json.loads(path.read_text())
        if process.poll() is not None:
            raise RuntimeError(f"{process.args!r} exited: {log.read_text()[-2000:]}")
        await asyncio.sleep(0.05)
    raise RuntimeError(f"{path.name}: service did not start within 60 s")


def stop_all(processes: Iterable[subprocess.Popen]) -> None:
    """SIGTERM each process we started (by PID), then SIGKILL what is left."""
    processes = list(processes)
    for p in processes:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in processes:
        try:
            p.wait(20)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(10)


# -- REST client ----------------------------------------------------------------


async def request(session: aiohttp.ClientSession, method: str, url: str, body: object = None) -> dict:
    """One call, retried on 409 (locked) and 503 (no free worker) as openstacksdk does."""
    deadline = time.monotonic() + RETRY_FOR
    while True:
        async with session.request(method, url, json=body, headers=V) as r:
            if r.status in (409, 503) and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
                continue
            if r.status >= 400:
                raise RuntimeError(f"{method} {url}: {r.status} {await r.text()}")
            return await r.json() if r.status in (200, 201) else {}


async def wait_stable(session: aiohttp.ClientSession, url: str, state: str) -> None:
    deadline = time.monotonic() + RETRY_FOR
    while True:
        node = await request(session, "GET", url)
        if node["provision_state"] == state and node["reservation"] is None:
            return
        if time.monotonic() > deadline or node["provision_state"].endswith("failed"):
            raise RuntimeError(f"{url} is {node['provision_state']} ({node['last_error']}), wanted {state}")
        await asyncio.sleep(0.005)


Step = Callable[[aiohttp.ClientSession, str, Any], Awaitable[None]]


async def run_step(
    session: aiohttp.ClientSession, api: str, items: Iterable[Any], concurrency: int, step: Step
) -> tuple[float, list[float]]:
    """Run ``step`` for every item with ``concurrency`` workers: (items/s, latencies in s)."""
    latencies: list[float] = []
    queue = list(items)
    total = len(queue)

    async def worker() -> None:
        while queue:
            item = queue.pop()
            started = time.perf_counter()
            await step(session, api, item)
            latencies.append(time.perf_counter() - started)

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return total / (time.perf_counter() - started), latencies


def verb(target: str, state: str) -> Step:
    async def step(session: aiohttp.ClientSession, api: str, uuid: str) -> None:
        url = f"{api}/v1/nodes/{uuid}"
        await request(session, "PUT", f"{url}/states/provision", {"target": target})
        await wait_stable(session, url, state)

    return step


async def enroll(session: aiohttp.ClientSession, api: str, index: int) -> str:
    node = await request(session, "POST", f"{api}/v1/nodes", {"driver": "fake-hardware"})
    mac = ":".join(f"{index >> s & 255:02x}" for s in (24, 16, 8, 0))
    await request(session, "POST", f"{api}/v1/ports", {"node_uuid": node["uuid"], "address": f"52:54:{mac}"})
    return node["uuid"]


async def delete(session: aiohttp.ClientSession, api: str, uuid: str) -> None:
    await request(session, "DELETE", f"{api}/v1/nodes/{uuid}")


async def lifecycle(
    session: aiohttp.ClientSession,
    api: str,
    indexes: range,
    concurrency: int,
    rows: list[tuple[str, float, list[float]]],
    after_enroll: Callable[[], None],
) -> list[str]:
    """Enroll one node (+ port) per index, then every step of STEPS; figures go to ``rows``."""
    created: list[str] = []

    async def enroll_one(session: aiohttp.ClientSession, api: str, index: int) -> None:
        created.append(await enroll(session, api, index))

    rows.append(("enroll (node+port)", *(await run_step(session, api, indexes, concurrency, enroll_one))))
    after_enroll()
    for name, target, state in STEPS:
        rows.append((name, *(await run_step(session, api, created, concurrency, verb(target, state)))))
    return created


def pct(values: list[float], q: int) -> float:
    """The q-th percentile in milliseconds."""
    if len(values) < 2:
        return values[0] * 1000 if values else float("nan")
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1] * 1000


# -- one run ----------------------------------------------------------------------


async def run_once(pg: EmbeddedPostgres, tmp: Path, nodes: int, conductors: int, concurrency: int, warmup: int) -> Run:
    """Fresh database, C conductor processes and one api process; the whole lifecycle."""
    run = Run(nodes, conductors)
    database = f"bench_{conductors}c_{nodes}"
    pg.drop_database(database)
    pg.create_database(database)
    url = pg.database_url(database)
    await migrate.upgrade(url)
    workdir = tmp / database
    workdir.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("FERRUM_")}
    env.update(
        FERRUM_DATABASE_URL=url,
        FERRUM_DATABASE_POOL_MAX="20",
        FERRUM_STATE_DIR=str(workdir),
        FERRUM_LOG_LEVEL="WARNING",
        FERRUM_CONDUCTOR_WORKERS="2000",
        FERRUM_CONDUCTOR_HEARTBEAT_INTERVAL="1",
        FERRUM_API_RING_REFRESH_INTERVAL="0.5",
    )
    processes: dict[str, subprocess.Popen] = {}
    pool = await asyncpg.create_pool(url, min_size=1, max_size=2)
    try:
        for i in range(1, conductors + 1):
            name = f"bench-c{i}"
            processes[name] = start(
                ["conductor", "--hostname", name, "--grpc-port", "0", "--metrics-port", "0"],
                workdir / f"{name}.json",
                workdir / f"{name}.log",
                env,
            )
        processes["api"] = start(
            ["api", "--port", "0", "--grpc-port", "0"], workdir / "api.json", workdir / "api.log", env
        )
        for name, p in processes.items():
            endpoints = await ports_of(workdir / f"{name}.json", p, workdir / f"{name}.log")
            if name == "api":
                api = endpoints["api REST (Ironic v1)"]
        deadline = time.monotonic() + 30
        while await pool.fetchval("SELECT count(*) FROM conductors WHERE online") < conductors:
            if time.monotonic() > deadline:
                raise RuntimeError("conductors did not register")
            await asyncio.sleep(0.1)
        await asyncio.sleep(1.5)  # the api's ring sees every conductor; start-up garbage settles
        mine = {n: p for n, p in processes.items() if n != "api"}
        for name, p in mine.items():
            run.rss[name] = {"idle": status_mib(p.pid, "VmRSS")}

        connector = aiohttp.TCPConnector(limit=concurrency * 2)
        async with aiohttp.ClientSession(connector=connector) as session:

            def after_enroll() -> None:
                for name, p in mine.items():
                    run.rss[name].setdefault("enrolled", status_mib(p.pid, "VmRSS"))

            if warmup:  # every code path once, then forget those nodes: the "warm" baseline
                warm = await lifecycle(session, api, range(nodes, nodes + warmup), concurrency, [], lambda: None)
                await run_step(session, api, warm, concurrency, delete)
                for name, p in mine.items():
                    run.rss[name]["warm"] = status_mib(p.pid, "VmRSS")
            began = time.perf_counter()
            created = await lifecycle(session, api, range(nodes), concurrency, run.rows, after_enroll)
            run.seconds = time.perf_counter() - began
            for uuid in created[:500]:
                t0 = time.perf_counter()
                await request(session, "GET", f"{api}/v1/nodes/{uuid}")
                run.gets.append(time.perf_counter() - t0)
            for _ in range(20):
                t0 = time.perf_counter()
                page = await request(session, "GET", f"{api}/v1/nodes/detail?limit=200")
                run.details.append(time.perf_counter() - t0)
            if len(page["nodes"]) != min(200, nodes):
                raise RuntimeError(f"list detail returned {len(page['nodes'])} nodes")
        for name, p in mine.items():
            run.rss[name].update(end=status_mib(p.pid, "VmRSS"), hwm=status_mib(p.pid, "VmHWM"))
        run.api_rss = status_mib(processes["api"].pid, "VmRSS")
        run.owned = {
            r["conductor"]: r["count"]
            for r in await pool.fetch(
                "SELECT conductor, count(DISTINCT node_uuid) AS count FROM node_events WHERE event = 'deploy' "
                "AND node_uuid IN (SELECT uuid FROM nodes) GROUP BY 1"
            )
        }
    finally:
        await pool.close()
        stop_all(processes.values())
        pg.drop_database(database)
    return run


# -- report -----------------------------------------------------------------------


def report(run: Run, concurrency: int) -> None:
    print(
        f"\n== {run.nodes} fake nodes, {run.conductors} conductor process(es) + 1 api process, "
        f"{concurrency} concurrent aiohttp clients (not openstacksdk) =="
    )
    print(f"{'step':<20} {'nodes/s':>9} {'p50 ms':>8} {'p99 ms':>8} {'Ironic/s':>9} {'x Ironic':>9}")
    for name, rate, lat in run.rows:
        ironic = IRONIC_RATE[name]
        print(f"{name:<20} {rate:>9.1f} {pct(lat, 50):>8.1f} {pct(lat, 99):>8.1f} {ironic:>9.0f} {rate / ironic:>9.1f}")
    g50, g99 = pct(run.gets, 50), pct(run.gets, 99)
    print(
        f"GET node (serial, {len(run.gets)}): p50 {g50:.2f} ms, p99 {g99:.2f} ms "
        f"(Ironic p50 {IRONIC_GET_MS[0]:.0f} / p99 {IRONIC_GET_MS[1]:.0f} ms: x{IRONIC_GET_MS[0] / g50:.1f} at p50)"
    )
    d50 = pct(run.details, 50)
    print(
        f"list detail of 200 nodes (x{len(run.details)}): p50 {d50:.1f} ms, p99 {pct(run.details, 99):.1f} ms "
        f"(Ironic ~{IRONIC_DETAIL_200_MS:.0f} ms: x{IRONIC_DETAIL_200_MS / d50:.1f})"
    )
    print(f"whole lifecycle: {run.seconds:.1f} s")
    for name, rss in run.rss.items():
        owned = run.owned.get(name, 0)
        per_k = {
            base: (rss["end"] - rss[base]) / owned * 1000 if owned and base in rss else float("nan")
            for base in ("idle", "warm")
        }
        warm = f", warm {rss['warm']:.1f}" if "warm" in rss else ""
        print(
            f"{name} RSS MiB: idle {rss['idle']:.1f}{warm}, after enroll {rss['enrolled']:.1f}, "
            f"end {rss['end']:.1f} (peak {rss['hwm']:.1f}); {owned} nodes owned -> "
            f"{per_k['idle']:.2f} MiB per 1,000 nodes over idle, {per_k['warm']:.2f} over warm"
        )
    growth = sum(r["end"] - r["idle"] for r in run.rss.values())
    print(
        f"all conductors: +{growth:.1f} MiB over idle = {growth / run.nodes * 1000:.2f} MiB per 1,000 nodes; "
        f"api process RSS {run.api_rss:.1f} MiB"
    )


async def main(nodes: int, conductor_counts: list[int], concurrency: int, warmup: int) -> None:
    load = os.getloadavg()
    print(
        f"Ferrum lifecycle bench: {nodes} nodes, conductors {conductor_counts}, {os.cpu_count()} CPUs, "
        f"load average {load[0]:.1f} at start"
    )
    print(
        "Ironic reference (issues 3/4: Ironic 39, same machine class, openstacksdk client): "
        + ", ".join(f"{k} ~{v:.0f}/s" for k, v in IRONIC_RATE.items())
        + f", GET p50 ~{IRONIC_GET_MS[0]:.0f} ms, detail 200 ~{IRONIC_DETAIL_200_MS:.0f} ms; goal >= 10x"
    )
    with tempfile.TemporaryDirectory(prefix="ferrum-bench-") as name:
        tmp = Path(name)
        tmp.chmod(0o755)
        pg = EmbeddedPostgres(tmp / "pg", fsync=False)
        pg.start()
        try:
            for count in conductor_counts:
                report(await run_once(pg, tmp, nodes, count, concurrency, warmup), concurrency)
        finally:
            pg.stop()
    print(
        f"\nload average {os.getloadavg()[0]:.1f} at the end (the machine may be shared: figures are under that load)"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--nodes", type=int, default=1000, help="fake nodes per run (default 1000; the issue also wants 10000)"
    )
    parser.add_argument(
        "--conductors",
        choices=("1", "2", "both"),
        default="both",
        help="conductor processes per run (default both: a run with 1, then one with 2)",
    )
    parser.add_argument("--concurrency", type=int, default=16, help="concurrent REST clients (default 16)")
    parser.add_argument(
        "--warmup",
        type=int,
        default=50,
        help="nodes taken through the lifecycle and deleted before the measured run, for the "
        "'warm' RSS baseline (default 50; 0: none)",
    )
    options = parser.parse_args()
    if options.nodes < 1 or options.concurrency < 1 or options.warmup < 0:
        parser.error("--nodes and --concurrency must be positive, --warmup not negative")
    counts = [1, 2] if options.conductors == "both" else [int(options.conductors)]
    asyncio.run(main(options.nodes, counts, options.concurrency, options.warmup))
