"""How long each 1-worker lifecycle step takes, node by node (issue 22).

bench/api.py --raw prints one median "server settled" time a step; this
shows the spread behind it, and the client's part: it starts
`ferrum stack --ephemeral`, creates fake-hardware nodes with a port, and
moves them one at a time, back to back as the benchmark's single worker
does, through manage, provide, deploy (with bench/api_raw.py's config drive)
and undeploy, each settled with bench/api_raw.py's poll. For each step it
prints percentiles (min, 10, 25, 50, 75, 90, max) of

- the PUT (request to 202),
- the server settled time (request to the ``provision_updated_at`` the server
  wrote with the final state),
- the client's total (request to the GET that saw the node settled), and
- the GETs each node took.

    .venv/bin/python bench/api_settle.py [--nodes 100] [--runs 1]

Figures only; run it on a quiet machine, and compare two trees by running
each in turn (``--runs`` repeats the whole measurement on a fresh stack, to
see how much one run differs from the next).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import api_raw  # bench/ is on sys.path: this script's own directory
from api import Stack
from raw_http import HttpClient

QUANTILES = (0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 1.0)


def spread(values: Sequence[float]) -> str:
    ordered = sorted(values)
    return " ".join(f"{ordered[round(q * (len(ordered) - 1))]:.1f}" for q in QUANTILES)


async def measure(base: str, nodes: int) -> list[str]:
    drive = api_raw.config_drive()
    lines = []
    async with HttpClient(base) as http:
        client = api_raw.Client(http)
        uuids = []
        for index in range(nodes):
            node = await client.call(
                "POST", "/v1/nodes", {"driver": "fake-hardware", "name": f"settle-{index}"}, expect=(201,)
            )
            mac = "52:54:00:" + ":".join(f"{b:02x}" for b in index.to_bytes(3, "big"))
            await client.call("POST", "/v1/ports", {"node_uuid": node["uuid"], "address": mac}, expect=(201,))
            uuids.append(node["uuid"])
        for name, target, state in api_raw.STEPS:
            body = {"target": target, **({"configdrive": drive} if target == "active" else {})}
            puts, settled, totals, polls = [], [], [], []
            for node_uuid in uuids:
                sent = time.time()
                await client.call("PUT", f"/v1/nodes/{node_uuid}/states/provision", body, expect=(202,))
                puts.append((time.time() - sent) * 1000)
                done, gets = await api_raw.settle(client, node_uuid, state)
                totals.append((time.time() - sent) * 1000)
                settled.append((done - sent) * 1000)
                polls.append(gets)
            lines.append(
                f"{name:<9} PUT {spread(puts)} | settled {spread(settled)} | total {spread(totals)} ms"
                f" | GETs {sum(polls) / len(polls):.1f}"
            )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--runs", type=int, default=1)
    args = parser.parse_args()
    print(f"percentiles {', '.join(str(round(q * 100)) for q in QUANTILES)} of {args.nodes} nodes, one at a time")
    for run in range(1, args.runs + 1):
        with tempfile.TemporaryDirectory(prefix="ferrum-settle-") as tmp:
            os.chmod(tmp, 0o755)  # the embedded PostgreSQL runs as another user
            stack = Stack(Path(tmp))
            stack.start()
            try:
                lines = asyncio.run(measure(stack.endpoints["api REST (Ironic v1)"], args.nodes))
            finally:
                stack.stop()
        print(f"run {run}:")
        for line in lines:
            print(f"  {line}")


if __name__ == "__main__":
    main()
