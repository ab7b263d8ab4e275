"""`ferrum demo`: drive a fleet of fake-hardware nodes through the Ironic REST
API of a freshly started stack, the way an operator's client would."""

from __future__ import annotations

import asyncio
import secrets
import time
from typing import Any

import aiohttp

HEADERS = {"X-OpenStack-Ironic-API-Version": "latest", "Content-Type": "application/json"}


async def _call(session: aiohttp.ClientSession, method: str, url: str, body: Any = None) -> Any:
    async with session.request(method, url, json=body, headers=HEADERS) as response:
        if response.status >= 400:
            raise RuntimeError(f"{method} {url} -> {response.status}: {await response.text()}")
        return await response.json() if response.status in (200, 201) else None


async def _wait(session: aiohttp.ClientSession, url: str, state: str, timeout: float = 60) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        node = await _call(session, "GET", url)
        if node["provision_state"] == state and not node["reservation"]:
            return node
        if time.monotonic() > deadline:
            raise RuntimeError(f"node {node['uuid']} stuck in {node['provision_state']} (wanted {state}): {node['last_error']}")
        await asyncio.sleep(0.05)


async def _one(session: aiohttp.ClientSession, api: str, index: int, run: str) -> dict[str, Any]:
    started = time.monotonic()
    node = await _call(session, "POST", f"{api}/v1/nodes", {"name": f"demo-{run}-{index:03d}", "driver": "fake-hardware",
                                                           "resource_class": "baremetal"})
    url = f"{api}/v1/nodes/{node['uuid']}"
    await _call(session, "POST", f"{api}/v1/ports", {"node_uuid": node["uuid"], "address": f"52:54:{run[:2]}:{run[2:]}:{index // 256:02x}:{index % 256:02x}"})
    timings = {}
    for verb, state in (("manage", "manageable"), ("provide", "available"), ("active", "active")):
        t0 = time.monotonic()
        await _call(session, "PUT", f"{url}/states/provision", {"target": verb})
        await _wait(session, url, state)
        timings[verb] = time.monotonic() - t0
    t0 = time.monotonic()
    await _call(session, "PUT", f"{url}/states/power", {"target": "power on"})
    deadline = time.monotonic() + 30
    while (await _call(session, "GET", url))["power_state"] != "power on":
        if time.monotonic() > deadline:
            raise RuntimeError(f"{node['uuid']} did not power on")
        await asyncio.sleep(0.05)
    timings["power on"] = time.monotonic() - t0
    final = await _call(session, "GET", url)
    return {"node": final, "timings": timings, "total": time.monotonic() - started}


async def run_demo(stack: Any, *, nodes: int) -> None:
    api = stack.endpoints["api REST (Ironic v1)"]
    async with aiohttp.ClientSession() as session:
        root = await _call(session, "GET", f"{api}/")
        print(f"\nAPI: {root['name']} (Ferrum), microversions {root['default_version']['min_version']}"
              f"..{root['default_version']['version']}")
        print(f"Enrolling {nodes} fake-hardware nodes and taking each to active over REST...\n")
        started = time.monotonic()
        run = secrets.token_hex(2)
        results = await asyncio.gather(*(_one(session, api, i, run) for i in range(nodes)))
        elapsed = time.monotonic() - started
        print(f"{'name':<15} {'uuid':<36} {'state':<8} {'power':<9} {'manage':>7} {'provide':>8} {'deploy':>7}")
        for r in results:
            n, t = r["node"], r["timings"]
            print(f"{n['name']:<15} {n['uuid']:<36} {n['provision_state']:<8} {n['power_state']:<9} "
                  f"{t['manage']:>6.3f}s {t['provide']:>7.3f}s {t['active']:>6.3f}s")
        print(f"\n{nodes} nodes enrolled, managed, provided and deployed in {elapsed:.2f} s.")
        sample = results[0]["node"]
        print(f"Example node (GET /v1/nodes/{sample['name']}): driver={sample['driver']} "
              f"deploy_interface={sample['deploy_interface']} conductor={sample['conductor']}")
