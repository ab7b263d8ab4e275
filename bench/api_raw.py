"""The raw-HTTP client mode of bench/api.py (issue 22, "Benchmark").

openstacksdk costs more client CPU per request than Ferrum costs server CPU
(bench/api.py's "replay floor" rows show it), so with the SDK the client is
the limit. Here kept-alive connections (bench/raw_http.py: the request's bytes
written by hand, the answer read by httptools' C parser; aiohttp's client
before 2026-11-28, which cost about 0.35 ms a request) send the same
workload to each server as plain JSON, build no SDK objects, and measure:

- node+port create, nodes/s;
- GET node, median and p99;
- list detail of 200 nodes (``/v1/nodes/detail?limit=200``), median and p99;
  both latencies from sending the request to the answer's last byte, as
  ``wrk`` or ``ab`` measure one (before 2026-11-28 they included the
  client's ``json.loads`` of the answer: for a list, 2.5-8.8 ms on this
  machine, more than Ferrum's own answer took; every answer is still
  parsed and checked, after its clock stops);
- manage, provide (through automated cleaning), deploy (with a Nova-style
  ``base64(gzip(ISO9660 config-2))`` config drive) and undeploy (through
  cleaning back to ``available``): nodes/s, each node timed from its request
  until a ``GET`` poll sees the target state, no target and no lock. The
  poll GETs at once, then after 1 ms, and doubles its pause up to 10 ms:
  one client waiting on one node cannot learn of a change sooner than its
  next poll, and with a fixed 10 ms pause (the sessions before 2026-11-28)
  a step the server finished 2 ms after its 202 still cost that client the
  request, a GET, 10 ms of sleep and a second GET, so the 1-worker
  throughput of any server that fast was bounded near 60 nodes/s by the
  client. A server that takes 100 ms gets one or two GETs more a step;
- at 1 worker, each of those steps' "server settled" time: the median from
  sending the request to the ``provision_updated_at`` the server wrote with
  the final state (same host, same clock): what the server itself took,
  whatever the poll;

at each worker count (default 1, 8 and 16 concurrent coroutines), each count
on its own batch of freshly created nodes. Every request carries
``X-OpenStack-Ironic-API-Version: 1.78`` so both servers render the same
fields.

The client freezes its start-up heap before it starts (``gc.freeze``): the
script imports openstacksdk for bench/api.py's other modes, and each
full collection of the client's collector then walked all of it, 35-43 ms
every ~20 lists of 200 (a list's parse makes ~30,000 objects); those pauses
were the p99 of the 1-worker list against either server.
"""

from __future__ import annotations

import asyncio
import base64
import datetime
import gc
import gzip
import itertools
import json
import random
import subprocess
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from raw_http import HttpClient  # bench/ is on sys.path: this script's own directory

VERSION = "1.78"
NOT_GOALS = ("server settled", "GETs a node", "slowest")  # figures shown beside the goals, to read them by
POLL_FIRST = 0.001  # the pause after the first GET of a settling node; it doubles each poll...
POLL = 0.01  # ...up to this
SETTLE_TIMEOUT = 300.0
STEPS = (
    ("manage", "manage", "manageable"),
    ("provide", "provide", "available"),
    ("deploy", "active", "active"),
    ("undeploy", "deleted", "available"),
)


@dataclass(frozen=True)
class Figure:
    metric: str
    workers: int
    unit: str  # "nodes/s" (higher is better) or "ms" (lower is better)
    value: float


def config_drive() -> str:
    """What Nova's ``_generate_configdrive`` sends: genisoimage, label config-2, gzip, base64."""
    with tempfile.TemporaryDirectory() as tmp:
        tree = Path(tmp) / "cd"
        for version in ("2012-08-10", "latest"):
            folder = tree / "openstack" / version
            folder.mkdir(parents=True)
            (folder / "meta_data.json").write_text(json.dumps({"uuid": "bench", "hostname": "bench"}))
        iso = Path(tmp) / "cd.iso"
        subprocess.run(
            ["genisoimage", "-o", str(iso), "-quiet", "-J", "-r", "-V", "config-2", str(tree)],
            check=True,
            capture_output=True,
        )
        return base64.b64encode(gzip.compress(iso.read_bytes())).decode()


class Client:
    """Plain JSON over kept-alive connections (bench/raw_http.py); a status outside ``expect`` raises."""

    def __init__(self, http: HttpClient) -> None:
        self.http = http
        self.headers = {"X-OpenStack-Ironic-API-Version": VERSION, "Content-Type": "application/json"}

    async def call(self, method: str, path: str, body: Any = None, expect: tuple[int, ...] = (200,)) -> Any:
        data = None if body is None else json.dumps(body).encode()
        status, raw = await self.http.request(method, path, data, self.headers)
        if status not in expect:
            raise RuntimeError(f"{method} {path}: {status} {raw[:300]!r}")
        return json.loads(raw) if raw else None

    async def timed_get(self, path: str) -> tuple[float, Any]:
        """Seconds from sending a GET to its answer's last byte, and the answer parsed.

        The latency stops at the last byte, as ``wrk`` or ``ab`` measure it: the
        client's own parse of a list of 200 (470 KB, 2.5-8.8 ms on this machine)
        is client work, which both servers' figures would otherwise share."""
        started = time.perf_counter()
        status, raw = await self.http.request("GET", path, None, self.headers)
        took = time.perf_counter() - started
        if status != 200:
            raise RuntimeError(f"GET {path}: {status} {raw[:300]!r}")
        return took, json.loads(raw)


async def run_workers(
    workers: int, items: Sequence[Any], job: Callable[[Any], Awaitable[Any]]
) -> tuple[float, list[float], list[Any]]:
    """``job`` on every item by ``workers`` coroutines: (items/s, seconds each, results)."""
    source = iter(items)
    latencies: list[float] = []
    results: list[Any] = []

    async def worker() -> None:
        for item in source:
            started = time.perf_counter()
            results.append(await job(item))
            latencies.append(time.perf_counter() - started)

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(workers)))
    return len(items) / (time.perf_counter() - started), latencies, results


def server_time(stamp: str) -> float:
    """An ISO 8601 timestamp the server wrote, as a Unix time (naive ones are UTC, as Ironic writes them)."""
    moment = datetime.datetime.fromisoformat(stamp)
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.UTC)
    return moment.timestamp()


def pct(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))] * 1000


async def settle(client: Client, node: str, state: str) -> tuple[float, int]:
    """Poll until the node is settled in ``state``; its ``provision_updated_at`` as a
    Unix time, and how many GETs that took."""
    deadline = time.monotonic() + SETTLE_TIMEOUT
    pause = POLL_FIRST
    for polls in itertools.count(1):
        got = await client.call("GET", f"/v1/nodes/{node}")
        if got["provision_state"] == state and got["target_provision_state"] is None and got["reservation"] is None:
            return server_time(got["provision_updated_at"]), polls
        if got["provision_state"].endswith("failed") or got["provision_state"] == "error":
            raise RuntimeError(f"node {node}: {got['provision_state']}: {got['last_error']}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"node {node} still {got['provision_state']} after {SETTLE_TIMEOUT} s")
        await asyncio.sleep(pause)
        pause = min(2 * pause, POLL)
    raise AssertionError("unreachable")


async def workload(
    base: str,
    *,
    nodes: int,
    serial_nodes: int,
    workers: Sequence[int],
    gets: int,
    lists: int,
    log: Callable[[str], None] = print,
) -> list[Figure]:
    """The whole raw workload against one server at ``base``."""
    gc.collect()
    gc.freeze()  # see the module docstring: the client's own collector pauses are not the server's latency
    drive = config_drive()
    macs = itertools.count(1)
    figures: list[Figure] = []
    async with HttpClient(base) as http:
        client = Client(http)

        async def create(index: int) -> str:
            node = await client.call(
                "POST", "/v1/nodes", {"driver": "fake-hardware", "name": f"raw-{index}"}, expect=(201,)
            )
            mac = "52:54:" + ":".join(f"{b:02x}" for b in next(macs).to_bytes(4, "big"))
            await client.call("POST", "/v1/ports", {"node_uuid": node["uuid"], "address": mac}, expect=(201,))
            return str(node["uuid"])

        batches: dict[int, list[str]] = {}
        counter = itertools.count()
        for w in workers:
            size = serial_nodes if w == 1 else nodes
            rate, _, made = await run_workers(w, [next(counter) for _ in range(size)], create)
            batches[w] = made
            figures.append(Figure("create node+port", w, "nodes/s", rate))
            log(f"  create, {w} workers: {rate:.1f} nodes/s")
        everyone = [n for batch in batches.values() for n in batch]
        if len(everyone) < 200:  # the list needs 200 rows
            _, _, extra = await run_workers(max(workers), [next(counter) for _ in range(200 - len(everyone))], create)
            everyone += extra

        async def get(node: str) -> float:
            took, body = await client.timed_get(f"/v1/nodes/{node}")
            assert body["uuid"] == node, body
            return took

        async def list_detail(_: int) -> float:
            took, body = await client.timed_get("/v1/nodes/detail?limit=200")
            assert len(body["nodes"]) == 200, len(body["nodes"])
            return took

        await run_workers(4, everyone[:50], get)  # warm every path once
        for w in workers:
            _, _, lat = await run_workers(w, [random.choice(everyone) for _ in range(gets)], get)
            figures += [Figure("GET node median", w, "ms", pct(lat, 50)), Figure("GET node p99", w, "ms", pct(lat, 99))]
            _, _, lat = await run_workers(w, list(range(max(lists, 2 * w))), list_detail)
            figures += [
                Figure("list detail 200 median", w, "ms", pct(lat, 50)),
                Figure("list detail 200 p99", w, "ms", pct(lat, 99)),
            ]
            log(f"  GET and list, {w} workers: done")

        for w in workers:
            for name, target, state in STEPS:
                body: dict[str, Any] = {"target": target}
                if target == "active":
                    body["configdrive"] = drive

                async def step(node: str, body: dict[str, Any] = body, state: str = state) -> tuple[float, int]:
                    sent = time.time()
                    await client.call("PUT", f"/v1/nodes/{node}/states/provision", body, expect=(202,))
                    done, polls = await settle(client, node, state)
                    return done - sent, polls

                rate, took, results = await run_workers(w, batches[w], step)
                figures.append(Figure(name, w, "nodes/s", rate))
                if w == 1:
                    figures.append(Figure(f"{name}, server settled", w, "ms", pct([r[0] for r in results], 50)))
                    figures.append(Figure(f"{name}, slowest", w, "ms", max(took) * 1000))
                    polls = sum(r[1] for r in results) / len(results)
                    figures.append(Figure(f"{name}, GETs a node", w, "GETs", polls))
                log(f"  {name}, {w} workers: {rate:.1f} nodes/s")
    return figures


def table(ironic: list[Figure] | None, ferrum: list[Figure]) -> str:
    """Side by side, with the ratio (>1: Ferrum better) and whether it reaches the issue's 10x."""
    theirs = {(f.metric, f.workers): f.value for f in ironic or []}
    lines = [f"{'metric':<26} {'workers':>7} {'unit':<8} {'Ironic 39':>10} {'Ferrum':>10} {'ratio':>8}  10x?"]
    lines.append("-" * len(lines[0]))
    for f in ferrum:
        other = theirs.get((f.metric, f.workers))
        if other is None:
            lines.append(f"{f.metric:<26} {f.workers:>7} {f.unit:<8} {'-':>10} {f.value:>10.1f}")
            continue
        if f.unit == "GETs":  # how the client saw each server, not a speed
            lines.append(f"{f.metric:<26} {f.workers:>7} {f.unit:<8} {other:>10.1f} {f.value:>10.1f}")
            continue
        ratio = f.value / other if f.unit == "nodes/s" else other / f.value
        lines.append(
            f"{f.metric:<26} {f.workers:>7} {f.unit:<8} {other:>10.1f} {f.value:>10.1f} {ratio:>7.1f}x  "
            + ("(not a goal)" if f.metric.endswith(NOT_GOALS) else "yes" if ratio >= 10 else "no")
        )
    return "\n".join(lines)
