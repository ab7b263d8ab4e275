"""Many simulated machines deployed at once: is the control plane the bottleneck?

Starts `ferrum stack --ephemeral` as its own process (api, conductor, ipxe,
object store and the embedded PostgreSQL), and the machine simulator in this
process (Redfish BMCs, iPXE firmware, one real deploy agent per machine,
sparse-file disks). Enrolls N machines over REST, takes them to available,
then asks for all N deploys at once with a config drive and waits until every
one is active. Prints machines/minute and the CPU seconds the control plane
(the stack process and its PostgreSQL) spent per machine, next to the CPU this
process (simulator + agents + client) spent. Figures only.

    .venv/bin/python bench/fleet.py --machines 100,1000 [--tls]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import psutil

from services.common.objectstore_client import ObjectStoreClient
from services.common.tls import TlsFiles, client_ssl_context
from services.demo_image import build_demo_image
from services.simulator.options import SimulatorOptions
from services.simulator.service import Simulator

V = {"X-OpenStack-Ironic-API-Version": "1.56"}
REPO = Path(__file__).resolve().parents[1]

BENCH_TOKEN = secrets.token_urlsafe(32)  # the internal token the bench and its stack share


def tree_cpu(pid: int) -> float:
    """CPU seconds (user + system) of a process and all its descendants."""
    total = 0.0
    try:
        root = psutil.Process(pid)
        for proc in [root, *root.children(recursive=True)]:
            try:
                times = proc.cpu_times()
                total += (
                    times.user
                    + times.system
                    + getattr(times, "children_user", 0)
                    + getattr(times, "children_system", 0)
                )
            except psutil.NoSuchProcess:
                pass
    except psutil.NoSuchProcess:
        pass
    return total


async def request(session: aiohttp.ClientSession, method: str, url: str, body: Any = None) -> Any:
    for _ in range(2000):
        async with session.request(method, url, json=body, headers=V) as r:
            if r.status in (409, 503):  # locked or saturated: retry, as a client would
                await asyncio.sleep(0.05)
                continue
            if r.status >= 400:
                raise RuntimeError(f"{method} {url}: {r.status} {await r.text()}")
            return await r.json() if r.status in (200, 201) else None
    raise RuntimeError(f"{method} {url}: still busy")


async def wait_all(session: aiohttp.ClientSession, api: str, uuids: list[str], state: str, timeout: float) -> None:
    pending = set(uuids)
    deadline = time.monotonic() + timeout
    while pending:
        page = await request(
            session, "GET", f"{api}/v1/nodes?fields=uuid,provision_state,reservation,last_error&limit=1000"
        )
        marker = None
        rows = page["nodes"]
        while page.get("next"):
            marker = rows[-1]["uuid"]
            page = await request(
                session,
                "GET",
                f"{api}/v1/nodes?fields=uuid,provision_state,reservation,last_error&limit=1000&marker={marker}",
            )
            rows += page["nodes"]
        for row in rows:
            if row["uuid"] in pending:
                if row["provision_state"] == state and not row["reservation"]:
                    pending.discard(row["uuid"])
                elif row["provision_state"] in ("deploy failed", "clean failed"):
                    raise RuntimeError(f"{row['uuid']} failed: {row['last_error']}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{len(pending)} of {len(uuids)} nodes not {state} after {timeout:.0f} s")
        await asyncio.sleep(0.5)


async def run(machines: int, image_mib: int, tmp: Path, *, tls: bool = False) -> dict[str, float]:
    ports_file = tmp / "ports.json"
    env = {
        **os.environ,
        "FERRUM_SECURITY_INTERNAL_TOKEN": BENCH_TOKEN,
        "FERRUM_LOG_LEVEL": "WARNING",
        "FERRUM_CONDUCTOR_WORKERS": "4000",
        "FERRUM_DATABASE_EMBEDDED_FSYNC": "false",
        "FERRUM_DATABASE_POOL_MAX": "40",
    }
    with open(tmp / "stack.log", "w") as log:  # the child keeps its own copy of the descriptor
        stack = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "services.cli",
                "stack",
                "--ephemeral",
                "--state-dir",
                str(tmp / "state"),
                "--ports-file",
                str(ports_file),
                *(["--tls"] if tls else []),
            ],
            cwd=REPO,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=log,
        )
    simulator = None
    try:
        deadline = time.monotonic() + 120
        while not ports_file.exists():
            if stack.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the stack did not start: {(tmp / 'stack.log').read_text()[-2000:]}")
            await asyncio.sleep(0.2)
        endpoints = json.loads(ports_file.read_text())
        api, boot_url = endpoints["api REST (Ironic v1)"], endpoints["ipxe HTTP"]
        # With --tls, REST and gRPC calls verify the stack against the CA it printed.
        trust = TlsFiles.trusting(endpoints["TLS CA (OS_CACERT)"]) if tls else None
        image = build_demo_image(tmp / "image", size_mib=image_mib, marker="fleet bench")
        store = ObjectStoreClient(endpoints["objectstore gRPC"], token=BENCH_TOKEN, tls=trust)
        await store.put_file("bench", "disk.raw", image.path)
        image_url = await store.temp_url("bench", "disk.raw", lifetime=7200)
        await store.put_bytes("bench", "kernel", b"k")
        kernel = await store.temp_url("bench", "kernel", lifetime=7200)
        await store.close()
        simulator = Simulator(
            SimulatorOptions(
                machines=machines,
                state_dir=str(tmp / "machines"),
                boot_url=boot_url,
                disk_size=(image_mib + 72) * 1024 * 1024,
            ).validate()
        )
        await simulator.start()
        connector = aiohttp.TCPConnector(limit=64, ssl=client_ssl_context(trust))
        async with aiohttp.ClientSession(connector=connector) as session:
            semaphore = asyncio.Semaphore(32)

            async def enroll(machine: Any) -> str:
                async with semaphore:
                    node = await request(
                        session,
                        "POST",
                        f"{api}/v1/nodes",
                        {
                            "name": machine.name,
                            "driver": "redfish",
                            "boot_interface": "ipxe",
                            "deploy_interface": "direct",
                            "driver_info": {
                                "redfish_address": simulator.redfish_url,
                                "redfish_system_id": machine.system_path,
                                "deploy_kernel": kernel,
                                "deploy_ramdisk": kernel,
                            },
                            "instance_info": {
                                "image_source": image_url,
                                "image_os_hash_algo": "sha256",
                                "image_os_hash_value": image.sha256,
                            },
                        },
                    )
                    await request(
                        session, "POST", f"{api}/v1/ports", {"node_uuid": node["uuid"], "address": machine.macs[0]}
                    )
                    return node["uuid"]

            uuids = await asyncio.gather(*(enroll(m) for m in simulator.machines))

            async def verb(uuid: str, target: str, body: dict[str, Any] | None = None) -> None:
                async with semaphore:
                    await request(
                        session, "PUT", f"{api}/v1/nodes/{uuid}/states/provision", {"target": target, **(body or {})}
                    )

            for target, state in (("manage", "manageable"), ("provide", "available")):
                await asyncio.gather(*(verb(u, target) for u in uuids))
                await wait_all(session, api, uuids, state, timeout=600)
            postmaster = int((tmp / "state" / "postgres" / "pgdata" / "postmaster.pid").read_text().split()[0])

            def control_plane_cpu() -> float:  # the stack process and its PostgreSQL (a daemon, not a child)
                return tree_cpu(stack.pid) + tree_cpu(postmaster)

            cpu_stack0, cpu_self0 = control_plane_cpu(), tree_cpu(os.getpid())
            started = time.monotonic()
            await asyncio.gather(
                *(verb(u, "active", {"configdrive": {"meta_data": {"hostname": "bench"}}}) for u in uuids)
            )
            await wait_all(session, api, uuids, "active", timeout=3600)
            elapsed = time.monotonic() - started
            cpu_stack, cpu_self = control_plane_cpu() - cpu_stack0, tree_cpu(os.getpid()) - cpu_self0
        return {
            "machines": machines,
            "seconds": elapsed,
            "per_minute": machines / elapsed * 60,
            "stack_cpu": cpu_stack,
            "stack_cpu_per_machine": cpu_stack / machines,
            "sim_cpu_per_machine": cpu_self / machines,
        }
    finally:
        if simulator is not None:
            await simulator.stop()
        stack.send_signal(signal.SIGTERM)
        try:
            stack.wait(timeout=60)
        except subprocess.TimeoutExpired:
            stack.kill()
            stack.wait()


async def main(sizes: list[int], image_mib: int, *, tls: bool = False) -> None:
    rows = []
    for machines in sizes:
        with tempfile.TemporaryDirectory(prefix="ferrum-fleet-") as tmp:
            Path(tmp).chmod(0o755)
            rows.append(await run(machines, image_mib, Path(tmp), tls=tls))
    print(
        ("TLS (ferrum stack --tls: https REST, TLS gRPC, auto-TLS agents). " if tls else "")
        + f"Fleet deploy: N simulated Redfish machines, {image_mib} MiB raw image + config drive each, "
        "all deploys requested at once (iPXE + direct agent); 2-core machine; control plane = the stack "
        "process (api, conductor, ipxe, objectstore) + its PostgreSQL"
    )
    print(
        f"{'machines':>8} {'wall s':>8} {'machines/min':>13} {'control plane CPU s':>20} "
        f"{'CPU s/machine':>14} {'sim+agents CPU s/machine':>25}"
    )
    for r in rows:
        print(
            f"{r['machines']:>8} {r['seconds']:>8.1f} {r['per_minute']:>13.1f} {r['stack_cpu']:>20.1f} "
            f"{r['stack_cpu_per_machine']:>14.3f} {r['sim_cpu_per_machine']:>25.3f}"
        )
    print(
        "Reference: Metal3 deploys 20 machines at a time by default; the goal is that all N complete and the "
        "control plane is not the bottleneck (its CPU per machine stays flat as N grows)."
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--machines", default="100", help="comma-separated fleet sizes (default 100; e.g. 100,1000)")
    parser.add_argument("--image-mib", type=int, default=8, help="image size in MiB (default 8)")
    parser.add_argument("--tls", action="store_true", help="run the stack with --tls and call it over TLS")
    options = parser.parse_args()
    asyncio.run(main([int(x) for x in options.machines.split(",")], options.image_mib, tls=options.tls))
