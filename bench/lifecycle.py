"""Fake-hardware lifecycle throughput through the REST API of a real stack.

Enroll (node + port), manage, provide, deploy and undeploy N nodes with C
concurrent clients against `ferrum stack` components in this process and the
embedded PostgreSQL; prints nodes/s per step and p50/p99 per request-to-stable
transition, plus the process RSS. Figures only; nothing here passes or fails.

    .venv/bin/python bench/lifecycle.py --nodes 1000 --concurrency 16
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import statistics
import tempfile
import time
from pathlib import Path

import aiohttp

from services.common.config import load_settings
from services.runtime import ALL_SERVICES_ORDER, RunningStack

V = {"X-OpenStack-Ironic-API-Version": "1.56"}


async def request(session: aiohttp.ClientSession, method: str, url: str, body: object = None) -> dict:
    while True:
        async with session.request(method, url, json=body, headers=V) as r:
            if r.status in (409, 503):
                await asyncio.sleep(0.01)
                continue
            if r.status >= 400:
                raise RuntimeError(f"{method} {url}: {r.status} {await r.text()}")
            return await r.json() if r.status in (200, 201) else {}


async def wait_stable(session: aiohttp.ClientSession, url: str, state: str) -> None:
    while True:
        node = await request(session, "GET", url)
        if node["provision_state"] == state and node["reservation"] is None:
            return
        await asyncio.sleep(0.005)


async def run_step(session, api, uuids, concurrency, step):
    latencies: list[float] = []
    queue = list(uuids)

    async def worker() -> None:
        while queue:
            uuid = queue.pop()
            started = time.perf_counter()
            await step(session, api, uuid)
            latencies.append(time.perf_counter() - started)

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return len(uuids) / (time.perf_counter() - started), latencies


def pct(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100)[q - 1] * 1000 if len(values) > 1 else values[0] * 1000


async def main(nodes: int, concurrency: int) -> None:
    with tempfile.TemporaryDirectory(prefix="ferrum-bench-") as tmp:
        Path(tmp).chmod(0o755)
        settings = load_settings({}, overrides={
            None: {"state_dir": tmp, "log_level": "WARNING"},
            "database": {"pool_max": 40, "embedded_fsync": False},
            "api": {"port": 0, "grpc_port": 0}, "conductor": {"grpc_port": 0, "metrics_port": 0, "workers": 2000},
            "ipxe": {"port": 0, "grpc_port": 0}, "objectstore": {"grpc_port": 0, "http_port": 0},
        })
        stack = RunningStack()
        await stack.start(settings, list(ALL_SERVICES_ORDER))
        api = stack.endpoints["api REST (Ironic v1)"]
        try:
            connector = aiohttp.TCPConnector(limit=concurrency * 2)
            async with aiohttp.ClientSession(connector=connector) as session:
                created: list[str] = []

                async def enroll(session, api, index):
                    node = await request(session, "POST", f"{api}/v1/nodes", {"driver": "fake-hardware"})
                    await request(session, "POST", f"{api}/v1/ports",
                                  {"node_uuid": node["uuid"], "address": f"52:54:{index >> 24 & 255:02x}:{index >> 16 & 255:02x}:{index >> 8 & 255:02x}:{index & 255:02x}"})
                    created.append(node["uuid"])

                def verb(target: str, state: str):
                    async def step(session, api, uuid):
                        url = f"{api}/v1/nodes/{uuid}"
                        await request(session, "PUT", f"{url}/states/provision", {"target": target})
                        await wait_stable(session, url, state)
                    return step

                rows = [("enroll (node+port)", *(await run_step(session, api, range(nodes), concurrency, enroll)))]
                for name, target, state in (("manage", "manage", "manageable"), ("provide", "provide", "available"),
                                            ("deploy", "active", "active"), ("undeploy", "deleted", "available")):
                    rows.append((name, *(await run_step(session, api, created, concurrency, verb(target, state)))))
                gets = []
                for uuid in created[:500]:
                    t0 = time.perf_counter()
                    await request(session, "GET", f"{api}/v1/nodes/{uuid}")
                    gets.append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                await request(session, "GET", f"{api}/v1/nodes/detail?limit=200")
                detail_ms = (time.perf_counter() - t0) * 1000
        finally:
            await stack.close()
    print(f"Ferrum lifecycle, {nodes} fake nodes, {concurrency} concurrent clients, 1 conductor (in-process stack)")
    print(f"{'step':<20} {'nodes/s':>9} {'p50 ms':>8} {'p99 ms':>8}")
    for name, rate, lat in rows:
        print(f"{name:<20} {rate:>9.1f} {pct(lat, 50):>8.1f} {pct(lat, 99):>8.1f}")
    print(f"{'GET node (serial)':<20} {'':>9} {pct(gets, 50):>8.2f} {pct(gets, 99):>8.2f}")
    print(f"list detail, 200 nodes: {detail_ms:.1f} ms")
    print(f"max RSS of this process (api+conductor+ipxe+objectstore+client): {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")
    print("Reference (Ironic 39, same machine class, from issue 3/4): create ~11/s, manage ~11-12/s, provide ~6-7/s, deploy ~6/s, undeploy ~6/s, GET p50 ~17 ms")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=16)
    options = parser.parse_args()
    asyncio.run(main(options.nodes, options.concurrency))
