"""Where the slow 1% of sequential GET node requests spend their time (issue 22).

bench/api.py --raw reports the 1-worker GET node p99 against Ironic's. This
says which hop makes that tail. It starts `ferrum stack --ephemeral` through
itself (``--serve``), which wraps the api's GET node handler and the two
queries it may send with timers, then creates nodes and sends sequential
GETs with bench/raw_http.py's client. Client and server both stamp
``time.perf_counter()`` (CLOCK_MONOTONIC, one clock for every process of
the machine), so each GET splits into:

- in: from the client's send to the handler's start (the client's write,
  waking the stack, aiohttp's parse, the middlewares);
- db: the node's query, from asking the pool to holding the rows (waking a
  PostgreSQL backend and back);
- handler: the rest of the handler (rendering, or reusing, the document);
- out: from the handler's return to the client holding the last byte
  (aiohttp's write, waking the client, its parse of the head).

It prints the median of each part, the 30 slowest GETs part by part, and by
how much each part of the slowest 1% exceeds its median. A GET of a node the
api knows to be unchanged since it last read it sends no query
(services/api/fresh_nodes.py): its db part is 0. Only the first 50 nodes
are read before the timed GETs, so with ``--nodes 50`` every timed GET is of
a known node, and with more nodes the first GET of each of the others reads
its row.

    .venv/bin/python bench/api_get_tail.py [--gets 3000] [--nodes 300]
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import bisect
import gc
import itertools
import os
import random
import runpy
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import api_raw  # bench/ is on sys.path: this script's own directory
from api import ROOT, Stack
from raw_http import HttpClient


def serve(log: Path, argv: list[str]) -> None:
    """Run ``services.cli`` with timers around GET node; write them to ``log`` at exit."""
    sys.path.insert(0, str(ROOT))
    from services.api import nodes as api_nodes
    from services.common.db import nodes as db_nodes

    handled: list[tuple[float, float]] = []
    queried: list[tuple[float, float]] = []

    def timed(call: Callable[..., Awaitable[Any]], into: list[tuple[float, float]]) -> Callable[..., Awaitable[Any]]:
        async def wrapper(*args: Any) -> Any:
            start = time.perf_counter()
            try:
                return await call(*args)
            finally:
                into.append((start, time.perf_counter()))

        return wrapper

    setattr(api_nodes.NodesApi, "get_node", timed(api_nodes.NodesApi.get_node, handled))  # noqa: B010 - a method replaced
    for name in ("version_by_ident", "versioned_by_ident"):  # the two queries a GET node may send
        setattr(db_nodes.NodeRepository, name, timed(getattr(db_nodes.NodeRepository, name), queried))

    def write() -> None:
        with log.open("w") as out:
            out.writelines(f"H {a:.7f} {b:.7f}\n" for a, b in handled)
            out.writelines(f"D {a:.7f} {b:.7f}\n" for a, b in queried)

    atexit.register(write)
    sys.argv = ["services.cli", *argv]
    runpy.run_module("services.cli", run_name="__main__", alter_sys=True)


async def client(base: str, nodes: int, gets: int) -> list[tuple[float, float]]:
    """(sent, last byte) of each of ``gets`` sequential GETs of random nodes."""
    gc.collect()
    gc.freeze()
    macs = itertools.count(1)
    async with HttpClient(base) as http:
        api = api_raw.Client(http)

        async def create(index: int) -> str:
            node = await api.call("POST", "/v1/nodes", {"driver": "fake-hardware", "name": f"t-{index}"}, expect=(201,))
            mac = "52:54:" + ":".join(f"{b:02x}" for b in next(macs).to_bytes(4, "big"))
            await api.call("POST", "/v1/ports", {"node_uuid": node["uuid"], "address": mac}, expect=(201,))
            return str(node["uuid"])

        _, _, made = await api_raw.run_workers(8, list(range(nodes)), create)
        for node in made[:50]:  # warm every path once
            await api.call("GET", f"/v1/nodes/{node}")
        stamps = []
        for _ in range(gets):
            node = random.choice(made)
            sent = time.perf_counter()
            took, body = await api.timed_get(f"/v1/nodes/{node}")
            assert body["uuid"] == node, body
            stamps.append((sent, sent + took))
    return stamps


def split(stamps: list[tuple[float, float]], log: Path) -> list[tuple[float, ...]]:
    """(total, in, db, handler, out) in seconds of each GET the server's log matched."""
    handled: list[tuple[float, float]] = []
    queried: list[tuple[float, float]] = []
    for line in log.read_text().splitlines():
        kind, began, ended = line.split()
        (handled if kind == "H" else queried).append((float(began), float(ended)))
    handled.sort()
    queried.sort()
    handler_starts = [h[0] for h in handled]
    query_starts = [q[0] for q in queried]
    parts = []
    for sent, done in stamps:
        i = bisect.bisect_left(handler_starts, sent)
        if i == len(handled) or handled[i][1] > done:
            continue  # not matched (should not happen with one request at a time)
        start, end = handled[i]
        j = bisect.bisect_left(query_starts, start)
        db = sum(b - a for a, b in queried[j : j + 2] if b <= end)
        parts.append((done - sent, start - sent, db, end - start - db, done - end))
    return sorted(parts)


def report(parts: list[tuple[float, ...]]) -> None:
    names = ("in", "db", "handler", "out")
    medians = [statistics.median(p[k] for p in parts) for k in range(5)]
    print(
        f"{len(parts)} GETs; total p50 {medians[0] * 1e3:.2f} ms, p99 {parts[round(0.99 * (len(parts) - 1))][0] * 1e3:.2f} ms"
    )
    print("median, ms:       " + "  ".join(f"{n} {m * 1e3:.2f}" for n, m in zip(names, medians[1:], strict=True)))
    print("slowest 30, ms:")
    for p in parts[-30:]:
        print(
            f"  total {p[0] * 1e3:6.2f}  " + "  ".join(f"{n} {v * 1e3:5.2f}" for n, v in zip(names, p[1:], strict=True))
        )
    tail = parts[-max(1, len(parts) // 100) :]
    excess = [statistics.mean(p[k] for p in tail) - medians[k] for k in range(1, 5)]
    print(
        "slowest 1%, mean excess over the median, ms: "
        + "  ".join(f"{n} {e * 1e3:.2f}" for n, e in zip(names, excess, strict=True))
    )


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "--serve":
        serve(Path(sys.argv[2]), sys.argv[3:])
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gets", type=int, default=3000, help="sequential GET node requests (default 3000)")
    parser.add_argument("--nodes", type=int, default=300, help="nodes created first (default 300)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="ferrum-get-tail-") as tmp:
        workdir = Path(tmp)
        os.chmod(workdir, 0o755)  # the embedded PostgreSQL's user must traverse it
        log = workdir / "server-times.txt"
        stack = Stack(workdir, launch=(str(Path(__file__).resolve()), "--serve", str(log)))
        stack.start()
        try:
            stamps = asyncio.run(client(stack.endpoints["api REST (Ironic v1)"], args.nodes, args.gets))
        finally:
            stack.stop()
        report(split(stamps, log))


if __name__ == "__main__":
    main()
