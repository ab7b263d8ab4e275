"""The issue-3 api workload, driven by openstacksdk as the Ironic figures were.

Starts `ferrum stack --ephemeral` (embedded PostgreSQL, fake hardware) as a
subprocess, then with W openstacksdk worker threads (each its own
`openstack.connection.Connection(auth_type="none", baremetal_endpoint_override=...)`):

- create node + port, nodes/s
- GET node, median and p99 (with 1 worker and with W workers)
- list detail of 200 nodes, median and p99
- manage, provide, deploy, undeploy, power off, power on: nodes/s with the
  median and p99 of each node's request-to-settled time
- the client floor: GET node and list detail again, against bench/replay.py,
  which answers from memory with the bytes Ferrum sent; openstacksdk's own
  cost on this machine, under any server's figure
- list detail of a large fleet (default 10,000 rows, inserted straight into
  PostgreSQL so the run stays short) page by page through `next`: the first,
  median and last page, and the stack's RSS before and after, which shows the
  api reads one page at a time (keyset pagination) rather than every row.

A state change is requested with `wait=False` and then polled with
`get_node` every 10 ms, because openstacksdk's own `wait=True` sleeps 2 s
between polls and would measure its sleep, not the service.

Prints a table with the Ironic 39 reference figures from issue 3 beside
Ferrum's and the ratio (>1 means Ferrum is better). Figures only; nothing
here passes or fails.

    .venv/bin/python bench/api.py                                  # ~1-3 minutes
    .venv/bin/python bench/api.py --nodes 1000 --workers 16 --gets 5000 --big-list 10000

`--raw` runs bench/api_raw.py's workload instead (keep-alive raw HTTP, no SDK
objects) at 1, 8 and 16 workers; with `--ironic` it runs it first against
Ironic 39 (bench/ironic_peer.py) and then against Ferrum, one server at a time,
and prints the ratios:

    .venv/bin/python bench/api.py --raw --ironic                  # ~10 minutes
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import logging
import multiprocessing
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import asyncpg
import openstack

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from services.common.db.credentials import url_with_password  # noqa: E402

POLL = 0.01  # seconds between get_node polls while a node settles
SETTLE_TIMEOUT = 120.0
# Ironic 39 all-in-one, fake hardware, PostgreSQL, openstacksdk, 8-16 workers, this
# 2-core machine class (issue 3 "Performance").
IRONIC = {
    "create node+port": ("nodes/s", 11.0),
    "GET node median": ("ms", 17.0),
    "GET node p99": ("ms", 31.0),
    "list detail 200 median": ("ms", 600.0),
    "manage": ("nodes/s", 11.0),
    "provide": ("nodes/s", 6.0),
    "deploy": ("nodes/s", 6.0),
    "undeploy": ("nodes/s", 6.0),
    "power off": ("nodes/s", 12.0),
    "power on": ("nodes/s", 12.0),
    # The same references beside the client floor: the best ratio any server could show here.
    "GET node median, replay floor": ("ms", 17.0),
    "list detail 200, replay floor": ("ms", 600.0),
}
PROVISION_STEPS = (
    ("manage", "manage", "manageable"),
    ("provide", "provide", "available"),
    ("deploy", "active", "active"),
    ("undeploy", "deleted", "available"),
)


# -- the stack ------------------------------------------------------------------------------


class Stack:
    """`ferrum stack --ephemeral` in its own state dir; stopped by PID."""

    def __init__(
        self, workdir: Path, profile: Path | None = None, launch: Sequence[str] = ("-m", "services.cli")
    ) -> None:
        self.workdir = workdir
        self.profile = profile  # cProfile output of the stack process, written when it stops
        self.launch = tuple(launch)  # what runs `services.cli`: a script may wrap it (bench/api_get_tail.py)
        self.ports_file = workdir / "ports.json"
        self.log = workdir / "stack.log"
        self.process: subprocess.Popen | None = None
        self.endpoints: dict[str, str] = {}

    def start(self) -> None:
        env = {**os.environ, "FERRUM_LOG_LEVEL": os.environ.get("FERRUM_LOG_LEVEL", "WARNING")}
        with self.log.open("w") as out:
            self.process = subprocess.Popen(
                [
                    sys.executable,
                    *(("-m", "cProfile", "-o", str(self.profile)) if self.profile else ()),
                    *self.launch,
                    "stack",
                    "--ephemeral",
                    "--state-dir",
                    str(self.workdir / "state"),
                    "--ports-file",
                    str(self.ports_file),
                ],
                cwd=ROOT,
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=out,
            )
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if self.ports_file.exists() and self.ports_file.read_text():
                self.endpoints = json.loads(self.ports_file.read_text())
                return
            if self.process.poll() is not None:
                raise RuntimeError(f"ferrum stack exited: {self.log.read_text()[-3000:]}")
            time.sleep(0.1)
        raise RuntimeError("ferrum stack did not start within 120 s")

    def rss_mib(self) -> float:
        assert self.process is not None
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return float("nan")

    def cpu_seconds(self) -> float:
        assert self.process is not None
        fields = Path(f"/proc/{self.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)


# -- the client -----------------------------------------------------------------------------


class Clients:
    """One openstacksdk Connection per worker thread."""

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint
        self._local = threading.local()

    def get(self) -> Any:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._local.conn = openstack.connection.Connection(
                auth_type="none", baremetal_endpoint_override=self.endpoint
            )
        return conn.baremetal


def _threads(workers: int, items: Sequence[Any], job: Callable[[Any], Any]) -> tuple[list[float], list[Any]]:
    latencies: list[float] = []
    results: list[Any] = []
    lock = threading.Lock()

    def timed(item: Any) -> None:
        started = time.perf_counter()
        result = job(item)
        elapsed = time.perf_counter() - started
        with lock:
            latencies.append(elapsed)
            results.append(result)

    with ThreadPoolExecutor(max_workers=workers) as pool:
        for future in [pool.submit(timed, item) for item in items]:
            future.result()
    return latencies, results


class ClientPool:
    """Client processes forked before this process touches openstacksdk (forking
    after would copy its locks mid-use), each running jobs with its own threads.
    Several processes keep openstacksdk's own CPU cost (it is pure Python) from
    serialising every worker on one GIL."""

    def __init__(self, endpoint: str, procs: int) -> None:
        ctx = multiprocessing.get_context("fork")
        self.pipes: list[Any] = []
        self.children: list[Any] = []
        for _ in range(procs):
            mine, theirs = ctx.Pipe()
            child = ctx.Process(target=_serve, args=(theirs, endpoint), daemon=True)
            child.start()
            self.pipes.append(mine)
            self.children.append(child)

    def run(
        self, name: str, workers: int, items: Sequence[Any], endpoint: str | None = None
    ) -> tuple[float, list[float], list[Any]]:
        """``JOBS[name]`` on every item with ``workers`` threads in all: (items/s, seconds each, results).
        ``endpoint`` points the clients elsewhere (the replay floor) for this run."""
        items = list(items)
        share = max(1, workers // len(self.pipes))
        started = time.perf_counter()
        for index, pipe in enumerate(self.pipes):
            pipe.send((name, share, items[index :: len(self.pipes)], endpoint))
        latencies: list[float] = []
        results: list[Any] = []
        for pipe in self.pipes:
            if not pipe.poll(900):
                raise RuntimeError(f"client process did not finish {name} within 900 s")
            status, first, second = pipe.recv()
            if status != "ok":
                raise RuntimeError(f"client process failed in {name}: {first}")
            latencies += first
            results += second
        return len(items) / (time.perf_counter() - started), latencies, results

    def close(self) -> None:
        for pipe in self.pipes:
            pipe.send(None)
        for child in self.children:
            child.join(10)
            if child.is_alive():
                child.kill()
                child.join()


def _serve(pipe: Any, endpoint: str) -> None:
    by_endpoint = {endpoint: Clients(endpoint)}
    while (message := pipe.recv()) is not None:
        name, workers, items, other = message
        clients = by_endpoint.setdefault(other or endpoint, Clients(other or endpoint))
        try:
            pipe.send(("ok", *_threads(workers, items, functools.partial(JOBS[name], clients))))
        except BaseException as exc:  # reported to the parent, which raises
            pipe.send(("error", f"{type(exc).__name__}: {exc}", []))


def run_local(clients: Clients, name: str, workers: int, items: Sequence[Any]) -> tuple[float, list[float], list[Any]]:
    items = list(items)
    started = time.perf_counter()
    latencies, results = _threads(workers, items, lambda item: JOBS[name](clients, item))
    return len(items) / (time.perf_counter() - started), latencies, results


def settle(bm: Any, node_id: str, check: Callable[[Any], bool]) -> None:
    deadline = time.monotonic() + SETTLE_TIMEOUT
    while True:
        node = bm.get_node(node_id)
        if check(node) and node.reservation is None:
            return
        if node.provision_state and node.provision_state.endswith("failed"):
            raise RuntimeError(f"node {node_id} failed: {node.provision_state} {node.last_error}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"node {node_id} did not settle: {node.provision_state}/{node.power_state}")
        time.sleep(POLL)


def pct(values: Sequence[float], q: float) -> float:
    """The q-th percentile of seconds, in ms."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))] * 1000


# -- the workload ---------------------------------------------------------------------------


JOBS: dict[str, Callable[[Clients, Any], Any]] = {}


def job(fn: Callable[[Clients, Any], Any]) -> Callable[[Clients, Any], Any]:
    JOBS[fn.__name__] = fn
    return fn


@job
def create(clients: Clients, index: int) -> str:
    bm = clients.get()
    node = bm.create_node(driver="fake-hardware", name=f"bench-{index}")
    bm.create_port(node_id=node.id, address="52:54:" + ":".join(f"{b:02x}" for b in index.to_bytes(4, "big")))
    return node.id


@job
def get_node(clients: Clients, node_id: str) -> None:
    clients.get().get_node(node_id)


@job
def list_detail(clients: Clients, count: int) -> int:
    got = 0
    for _node in clients.get().nodes(details=True, limit=count):
        got += 1
        if got == count:
            break
    assert got == count, got
    return got


@job
def list_detail_raw(clients: Clients, count: int) -> int:
    """The same request through the sdk's session, without building Node objects."""
    return len(clients.get().get(f"/nodes/detail?limit={count}", microversion="1.56").json()["nodes"])


@job
def provision(clients: Clients, item: tuple[str, str, str]) -> None:
    node_id, target, state = item
    bm = clients.get()
    bm.set_node_provision_state(node_id, target, wait=False)
    settle(bm, node_id, lambda n: n.provision_state == state)


@job
def power(clients: Clients, item: tuple[str, str]) -> None:
    node_id, state = item
    bm = clients.get()
    bm.set_node_power_state(node_id, state, wait=False)
    settle(bm, node_id, lambda n: n.power_state == state)


def workload(stack: Stack, args: argparse.Namespace) -> tuple[list[tuple[str, str, float, str]], list[str]]:
    api = stack.endpoints["api REST (Ironic v1)"]
    pool = ClientPool(api, args.client_procs) if args.client_procs > 1 else None
    clients = Clients(api)
    try:
        return _workload(stack, args, clients, pool)
    finally:
        if pool is not None:
            pool.close()


def _workload(
    stack: Stack, args: argparse.Namespace, clients: Clients, pool: ClientPool | None
) -> tuple[list[tuple[str, str, float, str]], list[str]]:
    rows: list[tuple[str, str, float, str]] = []  # (metric, unit, value, note)
    notes: list[str] = []
    W = args.workers

    def many(name: str, items: Sequence[Any]) -> tuple[float, list[float], list[Any]]:
        return pool.run(name, W, items) if pool else run_local(clients, name, W, items)

    rate, lat, nodes = many("create", range(args.nodes))
    rows.append(("create node+port", "nodes/s", rate, f"p50 {pct(lat, 50):.1f} ms, p99 {pct(lat, 99):.1f} ms per node"))

    picks = [random.choice(nodes) for _ in range(args.gets)]
    rate, lat, _ = many("get_node", picks)
    rows.append(("GET node median", "ms", pct(lat, 50), f"{W} workers, {rate:.0f} req/s"))
    rows.append(("GET node p99", "ms", pct(lat, 99), f"{W} workers"))
    _, lat, _ = run_local(clients, "get_node", 1, picks[: max(1, args.gets // 4)])
    rows.append(("GET node median, 1 worker", "ms", pct(lat, 50), f"p99 {pct(lat, 99):.1f} ms"))

    listed = min(200, len(nodes))
    _, lat, _ = many("list_detail", [listed] * (args.lists * 2))
    rows.append((f"list detail {listed} median", "ms", pct(lat, 50), f"{W} workers; p99 {pct(lat, 99):.0f} ms"))
    _, lat, _ = run_local(clients, "list_detail", 1, [listed] * args.lists)
    rows.append((f"list detail {listed}, 1 worker", "ms", pct(lat, 50), f"p99 {pct(lat, 99):.0f} ms"))
    _, lat, _ = run_local(clients, "list_detail_raw", 1, [listed] * args.lists)
    rows.append(
        (
            f"list detail {listed}, raw JSON",
            "ms",
            pct(lat, 50),
            f"1 worker; p99 {pct(lat, 99):.0f} ms; the rest is the sdk building objects",
        )
    )

    for name, target, state in PROVISION_STEPS:
        rate, lat, _ = many("provision", [(n, target, state) for n in nodes])
        rows.append((name, "nodes/s", rate, f"p50 {pct(lat, 50):.0f} ms, p99 {pct(lat, 99):.0f} ms per node"))
    for state in ("power off", "power on"):
        rate, lat, _ = many("power", [(n, state) for n in nodes])
        rows.append((state, "nodes/s", rate, f"p50 {pct(lat, 50):.0f} ms, p99 {pct(lat, 99):.0f} ms per node"))

    if args.floor:
        rows.extend(client_floor(stack, args, nodes, picks, pool, notes))
    if args.big_list:
        rows.extend(big_list(stack, clients, args, notes))
    return rows, notes


def client_floor(
    stack: Stack,
    args: argparse.Namespace,
    nodes: list[str],
    picks: list[str],
    pool: ClientPool | None,
    notes: list[str],
) -> list[tuple[str, str, float, str]]:
    """The same GET and list workloads against bench/replay.py, which answers
    from memory with the bytes Ferrum sent: the latency openstacksdk itself
    costs on this machine, the floor under any server's figure."""
    ports = stack.workdir / "replay.json"
    log = (stack.workdir / "replay.log").open("w")
    replay = subprocess.Popen(
        [
            sys.executable,
            str(ROOT / "bench" / "replay.py"),
            "--upstream",
            stack.endpoints["api REST (Ironic v1)"],
            "--ports-file",
            str(ports),
        ],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=log,
    )
    try:
        deadline = time.monotonic() + 30
        while not (ports.exists() and ports.read_text()):
            if replay.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"bench/replay.py did not start: {(stack.workdir / 'replay.log').read_text()}")
            time.sleep(0.05)
        url = json.loads(ports.read_text())["url"]
        clients = Clients(url)
        W = args.workers
        listed = min(200, len(nodes))

        def many(name: str, items: Sequence[Any]) -> tuple[float, list[float], list[Any]]:
            return pool.run(name, W, items, url) if pool else run_local(clients, name, W, items)

        run_local(clients, "get_node", 4, nodes)  # warm: every node's reply recorded once
        run_local(clients, "list_detail", 1, [listed])
        many("get_node", nodes[: W * 4])  # and every client process's version discovery
        rate, lat, _ = many("get_node", picks)
        rows = [
            (
                "GET node median, replay floor",
                "ms",
                pct(lat, 50),
                f"{W} workers, {rate:.0f} req/s; p99 {pct(lat, 99):.1f} ms",
            )
        ]
        _, lat, _ = run_local(clients, "get_node", 1, picks[: max(1, args.gets // 4)])
        rows.append(("GET node, 1 worker, replay floor", "ms", pct(lat, 50), f"p99 {pct(lat, 99):.1f} ms"))
        _, lat, _ = many("list_detail", [listed] * (args.lists * 2))
        rows.append(
            (f"list detail {listed}, replay floor", "ms", pct(lat, 50), f"{W} workers; p99 {pct(lat, 99):.0f} ms")
        )
        _, lat, _ = run_local(clients, "list_detail", 1, [listed] * args.lists)
        rows.append((f"list detail {listed}, 1 worker, replay", "ms", pct(lat, 50), f"p99 {pct(lat, 99):.0f} ms"))
        notes.append(
            "replay floor: the same openstacksdk calls answered from memory by bench/replay.py with "
            "Ferrum's own bytes (no database, no routing, no encoding); what remains is the client's cost "
            "on these 2 cores, so no server can show a lower figure with this client here."
        )
        return rows
    finally:
        replay.send_signal(signal.SIGTERM)
        try:
            replay.wait(10)
        except subprocess.TimeoutExpired:
            replay.kill()
            replay.wait()
        log.close()


def big_list(
    stack: Stack, clients: Clients, args: argparse.Namespace, notes: list[str]
) -> list[tuple[str, str, float, str]]:
    """Page through a large fleet following `next`; under keyset pagination
    the last page costs what the first does and the api's memory stays flat."""
    total = args.big_list
    # The stack prints the URL without its password; the password is in the state directory.
    password = (stack.workdir / "state" / "postgres" / "ferrum.password").read_text().strip()
    database = url_with_password(stack.endpoints["PostgreSQL (embedded)"], password)

    async def fill() -> int:
        conn = await asyncpg.connect(database)
        try:
            missing = max(0, total - await conn.fetchval("SELECT count(*) FROM nodes"))
            await conn.executemany(
                "INSERT INTO nodes (uuid, name, driver, provision_state, power_state, properties, extra) "
                "VALUES ($1, $2, 'fake-hardware', 'enroll', 'power off', $3::jsonb, $4::jsonb)",
                [
                    (
                        uuid.uuid4(),
                        f"fleet-{i}",
                        json.dumps({"cpus": 8, "memory_mb": 16384, "local_gb": 100}),
                        json.dumps({"rack": f"r{i % 40}", "slot": i}),
                    )
                    for i in range(missing)
                ],
            )
            return int(await conn.fetchval("SELECT count(*) FROM nodes"))
        finally:
            await conn.close()

    count = asyncio.run(fill())
    bm = clients.get()
    rss_before = stack.rss_mib()
    pages: list[float] = []  # seconds per non-empty page
    seen = 0
    url: str | None = f"/nodes/detail?limit={args.page_size}"
    started = time.perf_counter()
    while url:
        page_started = time.perf_counter()
        body = bm.get(url, microversion="1.56").json()
        if body["nodes"]:  # a full last page still carries `next`, to an empty page
            pages.append(time.perf_counter() - page_started)
        seen += len(body["nodes"])
        url = body.get("next")
        if url:
            url = url.split("/v1", 1)[1]
    raw_elapsed = time.perf_counter() - started
    rss_after = stack.rss_mib()
    assert seen == count, (seen, count)
    started = time.perf_counter()
    sdk_seen = sum(1 for _ in bm.nodes(details=True, limit=args.page_size))
    sdk_elapsed = time.perf_counter() - started
    assert sdk_seen == count, (sdk_seen, count)
    notes.append(
        f"list detail of {count} nodes in {len(pages)} pages of {args.page_size} through `next`: "
        f"stack RSS {rss_before:.0f} MiB before, {rss_after:.0f} MiB after the raw pass"
    )
    return [
        (f"list detail {count}, raw pages", "s", raw_elapsed, f"{count / raw_elapsed:.0f} nodes/s"),
        ("  first page", "ms", pages[0] * 1000, f"{args.page_size} nodes"),
        ("  median page", "ms", statistics.median(pages) * 1000, ""),
        ("  last page", "ms", pages[-1] * 1000, "same as the first: keyset pagination"),
        (f"list detail {count}, sdk nodes()", "s", sdk_elapsed, f"{count / sdk_elapsed:.0f} nodes/s incl. sdk objects"),
    ]


# -- output ---------------------------------------------------------------------------------


def report(rows: list[tuple[str, str, float, str]], notes: list[str], args: argparse.Namespace, cpu: float) -> None:
    print()
    print(
        f"Ferrum api benchmark: openstacksdk, {args.workers} workers in {args.client_procs} client processes, "
        f"{args.nodes} fake nodes, "
        f"one `ferrum stack --ephemeral` process (its Python process used {cpu:.0f} s of CPU; PostgreSQL not counted)"
    )
    header = f"{'metric':<34} {'unit':<8} {'Ironic 39':>10} {'Ferrum':>10} {'ratio':>8}  notes"
    print(header)
    print("-" * len(header))
    for metric, unit, value, note in rows:
        ref = IRONIC.get(metric)
        ironic = f"{ref[1]:.0f}" if ref else "-"
        if ref:
            ratio = value / ref[1] if unit == "nodes/s" else ref[1] / value
            ratio_text = f"{ratio:.1f}x"
        else:
            ratio_text = ""
        print(f"{metric:<34} {unit:<8} {ironic:>10} {value:>10.1f} {ratio_text:>8}  {note}")
    for note in notes:
        print(note)
    print("ratio: Ferrum rate / Ironic rate, or Ironic time / Ferrum time (>1: Ferrum is better).")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=200, help="nodes to create and cycle (default 200)")
    parser.add_argument("--workers", type=int, default=16, help="openstacksdk workers in all (8-16 in the issue)")
    parser.add_argument(
        "--client-procs",
        type=int,
        default=4,
        help="client processes the workers are spread over (1 = threads of this process only)",
    )
    parser.add_argument("--gets", type=int, default=1000, help="GET node requests (default 1000)")
    parser.add_argument("--lists", type=int, default=20, help="list-detail requests per worker setting")
    parser.add_argument("--big-list", type=int, default=10000, help="fleet size to page through (0 = skip)")
    parser.add_argument("--page-size", type=int, default=1000, help="limit per page for the big list")
    parser.add_argument(
        "--no-floor",
        dest="floor",
        action="store_false",
        help="skip the client floor (openstacksdk against bench/replay.py)",
    )
    parser.add_argument("--raw", action="store_true", help="the raw-HTTP client mode (bench/api_raw.py)")
    parser.add_argument("--ironic", action="store_true", help="with --raw: run Ironic 39 first, print ratios")
    parser.add_argument("--raw-workers", default="1,8,16", help="with --raw: worker counts (default 1,8,16)")
    parser.add_argument(
        "--serial-nodes",
        type=int,
        default=100,
        help="with --raw: nodes cycled by 1 worker (default 100: 30 took Ferrum 0.13-0.2 s, too short a sample)",
    )
    parser.add_argument("--profile", type=Path, help="write a cProfile of the Ferrum stack process here")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so the stack is stopped on the way out
    if args.raw:
        return raw_main(args)
    with tempfile.TemporaryDirectory(prefix="ferrum-bench-api-") as tmp:
        os.chmod(tmp, 0o755)  # the embedded PostgreSQL runs as its own user when we are root
        stack = Stack(Path(tmp))
        try:
            stack.start()
            cpu0 = stack.cpu_seconds()
            rows, notes = workload(stack, args)
            report(rows, notes, args, stack.cpu_seconds() - cpu0)
        finally:
            stack.stop()
    return 0


def raw_main(args: argparse.Namespace) -> int:
    """Ironic 39 (with --ironic), then Ferrum, never both at once: the raw workload and the ratios."""
    import api_raw  # bench/ is on sys.path: this script's own directory
    from ironic_peer import ironic_peer

    workers = [int(w) for w in args.raw_workers.split(",")]
    options = {"nodes": args.nodes, "serial_nodes": args.serial_nodes, "workers": workers}
    options |= {"gets": args.gets, "lists": args.lists}
    ironic_figures = None
    with tempfile.TemporaryDirectory(prefix="ferrum-bench-raw-") as tmp:
        os.chmod(tmp, 0o755)  # the embedded PostgreSQL runs as its own user when we are root
        if args.ironic:
            _quiet_disk()
            (Path(tmp) / "ironic").mkdir()
            with ironic_peer(Path(tmp) / "ironic") as (url, pid):
                print(f"Ironic 39 at {url} (pid {pid})", flush=True)
                ironic_figures = asyncio.run(api_raw.workload(url, **options))
                print(f"Ironic RSS {_rss_mib(pid):.0f} MiB", flush=True)
            _quiet_disk()
        (Path(tmp) / "ferrum").mkdir()
        stack = Stack(Path(tmp) / "ferrum", profile=args.profile)
        try:
            stack.start()
            print(f"Ferrum at {stack.endpoints['api REST (Ironic v1)']}", flush=True)
            cpu0 = stack.cpu_seconds()
            figures = asyncio.run(api_raw.workload(stack.endpoints["api REST (Ironic v1)"], **options))
            print(f"Ferrum RSS {stack.rss_mib():.0f} MiB, {stack.cpu_seconds() - cpu0:.0f} s CPU", flush=True)
        finally:
            stack.stop()
    print()
    print(
        f"raw HTTP (bench/raw_http.py, keep-alive), {args.nodes} nodes per batch ({args.serial_nodes} at 1 worker), "
        f"{args.gets} GETs and {args.lists} lists per worker count, API {api_raw.VERSION}"
    )
    print(api_raw.table(ironic_figures, figures))
    return 0


def _quiet_disk(limit_kib: int = 4096, timeout: float = 30.0) -> None:
    """Write back what the previous server (or set-up) left dirty before the next
    server is measured: otherwise the kernel flushes it during the next run,
    whose commits (each an fsync) queue behind that writeback. Waits (at most
    ``timeout``) until the page cache's dirty and in-flight pages are under
    ``limit_kib``; a previous server's processes may still be writing as they exit."""
    deadline = time.monotonic() + timeout
    while True:
        os.sync()
        pending = _dirty_kib()
        if pending < limit_kib or time.monotonic() > deadline:
            return
        time.sleep(0.2)


def _dirty_kib() -> int:
    """Dirty plus Writeback from /proc/meminfo, in KiB."""
    sizes = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines() if ":" in line)
    return sum(int(sizes.get(key, "0 kB").split()[0]) for key in ("Dirty", "Writeback"))


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


if __name__ == "__main__":
    sys.exit(main())
