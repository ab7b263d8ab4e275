"""CPU per request of `ferrum stack` and of its PostgreSQL (issue 22).

bench/api.py --raw measures latency and rates, which on shared cores move
2-5x with whatever else runs. This measures what a change to the server
changes whatever the load: the CPU seconds (user + system, from
/proc/<pid>/stat) that the stack process and the embedded PostgreSQL's
processes spend per request, around

- 200 node+port creates at 8 workers,
- 1,500 sequential GET node,
- 30 sequential list details of 200 nodes,
- manage, provide, deploy (with a Nova-style config drive; ``--no-drive``
  without) and undeploy of 100 nodes at 8 workers, each node polled every
  0.2 s (not bench/api_raw.py's 10 ms), so the polls do not dominate.

    .venv/bin/python bench/api_cpu.py [--no-drive]
    .venv/bin/python bench/api_cpu.py --no-lifecycle --lists 60 [--profile FILE]

The second stops after the list details (about 30 s), to compare a change to
the list path often enough to see through the load.

Prints one line per measure; run it twice and interleave with the code it is
compared against, as the figures in docs/api.md were.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import api_raw  # bench/ is on sys.path: this script's own directory
from api import Stack
from raw_http import HttpClient

POLL = 0.2
TICK = os.sysconf("SC_CLK_TCK")


def _cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def _children_of(workdir: Path, stack_pid: int) -> set[int]:
    """The PostgreSQL postmaster (its command line names the state directory)."""
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != stack_pid:
            try:
                if str(workdir).encode() in (entry / "cmdline").read_bytes():
                    found.add(int(entry.name))
            except OSError:
                continue
    return found


def _postgres_cpu(postmasters: set[int]) -> float:
    """The postmasters and their backends (the backends are their children)."""
    total = 0.0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(entry.name) in postmasters or int(fields[1]) in postmasters:
            total += (int(fields[11]) + int(fields[12])) / TICK
    return total


async def measure(stack: Stack, *, drive: bool, lifecycle: bool = True, lists: int = 30) -> None:
    assert stack.process is not None
    pid = stack.process.pid
    postmasters = _children_of(stack.workdir, pid)

    def snapshot() -> tuple[float, float]:
        return _cpu(pid), _postgres_cpu(postmasters)

    def report(name: str, before: tuple[float, float], count: int) -> None:
        after = snapshot()
        server, database = (after[0] - before[0]) / count, (after[1] - before[1]) / count
        print(f"{name:<28} stack {server * 1000:7.2f} ms   PostgreSQL {database * 1000:6.2f} ms   per item", flush=True)

    config_drive = api_raw.config_drive()
    async with HttpClient(stack.endpoints["api REST (Ironic v1)"]) as http:
        client = api_raw.Client(http)
        macs = itertools.count(1)

        async def create(index: int) -> str:
            node = await client.call(
                "POST", "/v1/nodes", {"driver": "fake-hardware", "name": f"cpu-{index}"}, expect=(201,)
            )
            mac = "52:54:" + ":".join(f"{b:02x}" for b in next(macs).to_bytes(4, "big"))
            await client.call("POST", "/v1/ports", {"node_uuid": node["uuid"], "address": mac}, expect=(201,))
            return str(node["uuid"])

        before = snapshot()
        _, _, made = await api_raw.run_workers(8, list(range(200)), create)
        report("create node+port", before, len(made))

        async def get(node: str) -> None:
            await client.call("GET", f"/v1/nodes/{node}")

        async def list_detail(_: int) -> None:
            body = await client.call("GET", "/v1/nodes/detail?limit=200")
            assert len(body["nodes"]) == 200, len(body["nodes"])

        await api_raw.run_workers(1, made[:50], get)  # warm every path once
        picks = [random.choice(made) for _ in range(1500)]
        before = snapshot()
        await api_raw.run_workers(1, picks, get)
        report("GET node", before, len(picks))
        before = snapshot()
        await api_raw.run_workers(1, list(range(lists)), list_detail)
        report("list detail 200", before, lists)
        if not lifecycle:
            return

        batch = made[:100]
        for name, target, state in api_raw.STEPS:
            body: dict[str, Any] = {"target": target}
            if target == "active" and drive:
                body["configdrive"] = config_drive

            async def step(node: str, body: dict[str, Any] = body, state: str = state) -> None:
                await client.call("PUT", f"/v1/nodes/{node}/states/provision", body, expect=(202,))
                while True:
                    await asyncio.sleep(POLL)
                    got = await client.call("GET", f"/v1/nodes/{node}")
                    if got["provision_state"].endswith("failed"):
                        raise RuntimeError(f"node {node}: {got['provision_state']}: {got['last_error']}")
                    settled = got["target_provision_state"] is None and got["reservation"] is None
                    if got["provision_state"] == state and settled:
                        return

            before = snapshot()
            await api_raw.run_workers(8, batch, step)
            report(f"{name}{' + drive' if target == 'active' and drive else ''}, 0.2 s polls", before, len(batch))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--no-drive", dest="drive", action="store_false", help="deploy without a config drive")
    parser.add_argument(
        "--no-lifecycle", dest="lifecycle", action="store_false", help="stop after the list details (a quick run)"
    )
    parser.add_argument("--lists", type=int, default=30, help="sequential list details of 200 (default 30)")
    parser.add_argument("--profile", type=Path, help="write a cProfile of the stack process here")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="ferrum-bench-cpu-") as tmp:
        os.chmod(tmp, 0o755)  # the embedded PostgreSQL runs as its own user when we are root
        stack = Stack(Path(tmp), profile=args.profile)
        try:
            stack.start()
            started = time.perf_counter()
            asyncio.run(measure(stack, drive=args.drive, lifecycle=args.lifecycle, lists=args.lists))
            print(f"({time.perf_counter() - started:.0f} s)")
        finally:
            stack.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
