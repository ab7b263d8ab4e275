"""An event-loop stall longer than the heartbeat timeout (a blocking download, a
swapping host) must not leave a stack unable to route: once the loop runs
again the conductor heartbeats, and the api reads its ring again as soon as a
node has no conductor, instead of answering "No valid host" until its next
periodic refresh."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import aiohttp
import pytest

from services.common.db.conductors import ConductorRepository
from services.runtime import ALL_SERVICES_ORDER, RunningStack
from tests.conftest import test_settings

V = {"X-OpenStack-Ironic-API-Version": "1.56"}
# Liveness scaled down 5x from the production defaults (interval 5 s, timeout 30 s),
# and a stall longer than the timeout: the same race in a fifth of the time.
HEARTBEAT_INTERVAL, HEARTBEAT_TIMEOUT = 1.0, 6.0
STALL = 8.0


@pytest.mark.timeout(120)
async def test_routable_again_within_seconds_after_a_stall_past_the_heartbeat_timeout(
    database_url: str, tmp_path: Path
) -> None:
    settings = test_settings(
        database_url,
        tmp_path,
        # A ring refresh interval longer than the stall, so that only a refresh on a
        # routing miss can bring the conductor back quickly.
        conductor={
            "hostname": "stall-c",
            "heartbeat_interval": HEARTBEAT_INTERVAL,
            "heartbeat_timeout": HEARTBEAT_TIMEOUT,
        },
        api={"ring_refresh_interval": 10.0},
    )
    stack = RunningStack()
    await stack.start(settings, list(ALL_SERVICES_ORDER))
    api = stack.endpoints["api REST (Ironic v1)"]
    conductors = ConductorRepository(stack.pool)
    try:
        async with aiohttp.ClientSession() as http:

            async def create(name: str) -> tuple[int, str]:
                body = {"driver": "fake-hardware", "name": name}
                async with http.post(f"{api}/v1/nodes", json=body, headers=V) as r:
                    return r.status, await r.text()

            assert (await create("before"))[0] == 201
            time.sleep(STALL)  # the point: nothing in this process runs past the heartbeat timeout
            stalled_at = time.monotonic()
            answers: list[tuple[int, str]] = []
            while time.monotonic() - stalled_at < 5.0:
                answers.append(await create(f"after-{len(answers)}"))
                if answers[-1][0] == 201:
                    break
            routable_after = time.monotonic() - stalled_at
            assert answers[-1][0] == 201, answers[-3:]
            assert routable_after < 3.0, (routable_after, answers[-3:])
            assert all(status in (201, 400) for status, _ in answers), answers  # never a 5xx meanwhile
            # Its heartbeat was due when the loop ran again; the first answer can come
            # back before that heartbeat's UPDATE commits (the api calls the conductor of
            # its own process without a network hop), so give it two heartbeat intervals.
            deadline = time.monotonic() + 2 * HEARTBEAT_INTERVAL
            while "stall-c" not in [c["hostname"] for c in await conductors.list_alive(HEARTBEAT_TIMEOUT)]:
                assert time.monotonic() < deadline, "the conductor did not heartbeat after the stall"
                await asyncio.sleep(0.05)
            for i in range(5):  # and it stays routable
                status, text = await create(f"steady-{i}")
                assert status == 201, text
    finally:
        await stack.close()
