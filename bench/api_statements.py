"""The SQL one node's lifecycle step costs (issue 22): statements and round trips.

bench/api_cpu.py says how much PostgreSQL CPU a manage, provide or undeploy
costs; this says why. It starts `ferrum stack --ephemeral`, creates a few
fake-hardware nodes with a port, warms every path once (so asyncpg's
statement caches hold what a busy server's would), then turns on
``log_min_duration_statement=0`` on the stack's own PostgreSQL and moves one
node at a time through manage, provide, deploy and undeploy. Between two
steps the client waits for the node to settle without polling (a poll would
add its own SELECT), so every statement in the window belongs to the step,
except the periodic work's (lease refresh, conductor heartbeat and ring,
power sync...), which is counted apart, and the one GET that checks the
step settled, which is left out.

    .venv/bin/python bench/api_statements.py [--nodes 3] [--show]

For each step it prints, per node, the statements (an extended-protocol
execute or a simple query such as BEGIN) and the parses; ``--show`` lists
them in order. A round trip is one statement, plus one for each parse.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import itertools
import os
import re
import sys
import tempfile
from pathlib import Path

import api_raw  # bench/ is on sys.path: this script's own directory
import asyncpg
from api import Stack
from raw_http import HttpClient

SETTLE = 1.0  # seconds a step is given before the one GET that checks it settled
# Statements the conductor's periodic work sends whatever the client does.
PERIODIC = re.compile(
    r"^SELECT 1$|\bconductors\b|reservation IS NOT NULL AND reservation_expires_at < now\(\)"
    r"|WHERE reservation = \$1 AND uuid = ANY|WHERE console_enabled|provision_state = ANY\(|FROM nodes WHERE id > \$1"
)
LINE = re.compile(r"^\S+ \S+ \S+ \[(\d+)\] (?:LOG|DETAIL):\s+(.*)$")
DURATION = re.compile(r"duration: [\d.]+ ms\s+(parse|bind|execute|statement)(?: [^:]*)?:\s*(.*)$")


def _data_dir(state: Path) -> Path:
    """The embedded cluster's directory (the one holding postgres.password)."""
    found = sorted(state.rglob("postgres.password"))
    if not found:
        raise RuntimeError(f"no embedded PostgreSQL under {state}")
    return found[0].parent


async def _superuser(data_dir: Path) -> asyncpg.Connection:
    port = int((data_dir / "pgdata" / "postmaster.pid").read_text().splitlines()[3])
    password = (data_dir / "postgres.password").read_text().strip()
    return await asyncpg.connect(host="127.0.0.1", port=port, user="postgres", password=password, database="postgres")


def _statements(text: str) -> list[tuple[str, str]]:
    """(kind, SQL) of every logged parse/execute/simple statement, in log order
    (the SQL of a multi-line statement joined into one line)."""
    found: list[tuple[str, str]] = []
    continues = False
    for line in text.splitlines():
        match = LINE.match(line)
        if not match:
            if continues and found and line.strip():
                kind, sql = found[-1]
                found[-1] = (kind, f"{sql} {line.strip()}".strip())
            continue
        duration = DURATION.match(match.group(2))
        continues = bool(duration and duration.group(1) in ("parse", "execute", "statement"))
        if duration and continues:
            found.append((duration.group(1), duration.group(2).strip()))
    return found


async def run(stack: Stack, *, nodes: int, show: bool) -> None:
    data_dir = _data_dir(stack.workdir / "state")
    log_path = data_dir / "postgres.log"
    admin = await _superuser(data_dir)
    macs = itertools.count(1)
    async with HttpClient(stack.endpoints["api REST (Ironic v1)"]) as http:
        client = api_raw.Client(http)

        async def create(index: int) -> str:
            node = await client.call("POST", "/v1/nodes", {"driver": "fake-hardware", "name": f"sql-{index}"}, (201,))
            mac = "52:54:" + ":".join(f"{b:02x}" for b in next(macs).to_bytes(4, "big"))
            await client.call("POST", "/v1/ports", {"node_uuid": node["uuid"], "address": mac}, (201,))
            return str(node["uuid"])

        made = [await create(i) for i in range(nodes + 1)]

        async def step(node: str, target: str, state: str) -> None:
            await client.call("PUT", f"/v1/nodes/{node}/states/provision", {"target": target}, (202,))
            await asyncio.sleep(SETTLE)
            got = await client.call("GET", f"/v1/nodes/{node}")
            settled = got["target_provision_state"] is None and got["reservation"] is None
            if got["provision_state"] != state or not settled:
                raise RuntimeError(f"node {node} not settled in {state} after {SETTLE} s: {got}")

        for _, target, state in api_raw.STEPS:  # warm every path with the first node
            await step(made[0], target, state)
        await admin.execute("ALTER SYSTEM SET log_min_duration_statement = 0")
        await admin.execute("ALTER SYSTEM SET log_line_prefix = '%m [%p] '")
        await admin.execute("SELECT pg_reload_conf()")
        await asyncio.sleep(0.5)
        for name, target, state in api_raw.STEPS:
            counts: collections.Counter[str] = collections.Counter()
            periodic = 0
            listing: list[tuple[str, str]] = []
            for node in made[1:]:
                offset = log_path.stat().st_size
                await step(node, target, state)
                with log_path.open(errors="replace") as handle:
                    handle.seek(offset)
                    logged = _statements(handle.read())
                # The last execute is the client's check (a GET node), not the step's.
                for kind, sql in logged:
                    if PERIODIC.search(sql) or sql.startswith("SELECT pg_reload_conf"):
                        periodic += 1
                        continue
                    counts[kind] += 1
                    if node == made[1]:
                        listing.append((kind, sql))
            per = {kind: n / nodes for kind, n in counts.items()}
            print(
                f"{name:<9} statements {per.get('execute', 0) + per.get('statement', 0) - 1:5.1f}  "
                f"(of which simple {per.get('statement', 0):4.1f})  parses {per.get('parse', 0):4.1f}  "
                f"periodic, left out {periodic / nodes:4.1f}   per node, the check's GET left out",
                flush=True,
            )
            if show:
                for kind, sql in listing:
                    print(f"    {kind:<9} {sql[:200]}")
    await admin.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=3, help="nodes through each step (averaged)")
    parser.add_argument("--show", action="store_true", help="list the first node's statements per step")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="ferrum-bench-sql-") as tmp:
        os.chmod(tmp, 0o755)  # the embedded PostgreSQL runs as its own user when we are root
        stack = Stack(Path(tmp))
        try:
            stack.start()
            asyncio.run(run(stack, nodes=args.nodes, show=args.show))
        finally:
            stack.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
