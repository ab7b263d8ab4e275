"""Scale-out as operators run it: one api and three conductors as separate
processes on one database. Nodes spread over the ring; after SIGKILL of one
conductor mid-deploy the survivors resume its in-flight deploys from their
recorded step: every node ends active, none failed, no stale lock."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import asyncpg
import pytest

ROOT = Path(__file__).resolve().parents[2]
V = {"X-OpenStack-Ironic-API-Version": "1.56"}
NODES = 200


def start(args: list[str], ports: Path, env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "services.cli", *args, "--ports-file", str(ports)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


async def ports_of(path: Path, process: subprocess.Popen) -> dict[str, str]:
    for _ in range(600):
        if path.exists() and path.read_text():
            return json.loads(path.read_text())
        assert process.poll() is None, process.stderr and process.stderr.read()
        await asyncio.sleep(0.05)
    raise AssertionError("service did not start")


async def wait_all(pool: asyncpg.Pool, predicate: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while await pool.fetchval(f"SELECT count(*) FROM nodes WHERE NOT ({predicate})"):
        assert time.monotonic() < deadline, await pool.fetch(
            f"SELECT provision_state, reservation, count(*) FROM nodes WHERE NOT ({predicate}) GROUP BY 1, 2"
        )
        await asyncio.sleep(0.2)


@pytest.mark.slow
async def test_conductor_killed_mid_deploy(database_url: str, tmp_path: Path) -> None:
    os.chmod(tmp_path, 0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith("FERRUM_")}
    env.update(
        FERRUM_DATABASE_URL=database_url,
        FERRUM_CONDUCTOR_FAKE_DEPLOY_DELAY="1,4",
        FERRUM_CONDUCTOR_HEARTBEAT_INTERVAL="0.5",
        FERRUM_CONDUCTOR_HEARTBEAT_TIMEOUT="3",
        FERRUM_CONDUCTOR_LOCK_LEASE="3",
        FERRUM_API_RING_REFRESH_INTERVAL="0.5",
        FERRUM_LOG_LEVEL="WARNING",
    )
    processes: list[subprocess.Popen] = []
    try:
        conductors = {}
        for name in ("c1", "c2", "c3"):
            p = start(
                ["conductor", "--hostname", name, "--grpc-port", "0", "--metrics-port", "0"],
                tmp_path / f"{name}.json",
                env,
            )
            processes.append(p)
            conductors[name] = p
        api_process = start(["api", "--port", "0", "--grpc-port", "0"], tmp_path / "api.json", env)
        processes.append(api_process)
        for name, p in conductors.items():
            await ports_of(tmp_path / f"{name}.json", p)
        api = (await ports_of(tmp_path / "api.json", api_process))["api REST (Ironic v1)"]
        pool = await asyncpg.create_pool(database_url, min_size=1, max_size=4)
        async with aiohttp.ClientSession() as session:

            async def call(method: str, path: str, body=None, ok=(200, 201, 202)):
                for _ in range(50):
                    async with session.request(method, api + path, json=body, headers=V) as r:
                        if r.status in (409, 503):  # retryable, as openstacksdk does
                            await asyncio.sleep(0.1)
                            continue
                        assert r.status in ok, (path, r.status, await r.text())
                        return await r.json() if r.status in (200, 201) else None
                raise AssertionError(f"{path} kept failing")

            await asyncio.sleep(1.0)  # the api's ring sees all three conductors
            uuids = [
                (
                    await call(
                        "POST", "/v1/nodes", {"driver": "fake-hardware", "name": f"s{i}", "automated_clean": False}
                    )
                )["uuid"]
                for i in range(NODES)
            ]
            await pool.execute("UPDATE nodes SET provision_state = 'available', target_provision_state = NULL")
            await asyncio.gather(*(call("PUT", f"/v1/nodes/{u}/states/provision", {"target": "active"}) for u in uuids))
            owners = {
                r["conductor"]
                for r in await pool.fetch("SELECT DISTINCT conductor FROM node_events WHERE event = 'deploy'")
            }
            assert owners == {"c1", "c2", "c3"}, owners  # the ring spread the nodes

            await asyncio.sleep(0.5)
            conductors["c2"].send_signal(signal.SIGKILL)
            conductors["c2"].wait(10)

            await wait_all(pool, "provision_state = 'active' AND reservation IS NULL", 90)
            assert await pool.fetchval("SELECT count(*) FROM nodes") == NODES  # none lost
            assert not await pool.fetchval(
                "SELECT count(*) FROM node_events WHERE event = 'fail' OR provision_state = 'deploy failed'"
            )  # none failed because a conductor died
            resumed = await pool.fetchval(
                "SELECT count(*) FROM node_events WHERE event = 'flow-resume' AND message LIKE '%c2 went offline%'"
            )
            assert resumed, "the killed conductor held no deploying node: the test proved nothing"
        await pool.close()
    finally:
        for p in processes:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in processes:
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)
    assert [p.returncode for p in processes if p is not conductors["c2"]] == [0, 0, 0]
