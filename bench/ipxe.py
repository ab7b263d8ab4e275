"""iPXE rendering throughput and boot-storm latency, against nginx serving the
same script as a static file (issue 5, seed 003).

Starts an embedded PostgreSQL, inserts N nodes (default 10,000) in
``deploying`` with one port each, runs ``ferrum ipxe`` as its own process
(cache off, then on), and measures with wrk (Debian) and a Lua script that
asks for a different MAC on every request:

- renders/s and p50/p99 latency of ``GET /ipxe?mac=<distinct MAC>``;
- the same URL pattern against nginx (1 worker, like the one renderer
  process) serving one rendered script as a static file; the ratio;
- the cached renderer again while node states change at ``--churn`` per
  second (each change evicts that node through NOTIFY ferrum_boot_data, so
  its next request is read and rendered again);
- a boot storm: every one of the N MACs asked once, C at a time (aiohttp
  client), p50/p99/max against the 60 s iPXE waits for the script
  (``chain --timeout``).

Figures only; nothing here passes or fails.

    .venv/bin/python bench/ipxe.py                      # 10,000 nodes, 10 s per wrk run
    .venv/bin/python bench/ipxe.py --nodes 2000 --duration 5 --connections 64
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Self

import aiohttp
import asyncpg

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from services.common.db import migrate  # noqa: E402
from services.common.db.embedded import EmbeddedPostgres  # noqa: E402

IPXE_WAIT_S = 60.0  # the chain/kernel --timeout our scripts give iPXE (FERRUM_IPXE_BOOT_TIMEOUT)
LUA = """
counter = 0
request = function()
  counter = counter + 1
  local n = (counter * 7919 + %(offset)d) %% %(nodes)d + 1
  local path = string.format("/ipxe?mac=52:54:%%02x:%%02x:%%02x:%%02x", math.floor(n / 16777216) %% 256,
                             math.floor(n / 65536) %% 256, math.floor(n / 256) %% 256, n %% 256)
  return wrk.format("GET", path)
end
"""


def mac_of(n: int) -> str:
    return "52:54:" + ":".join(f"{(n >> s) & 255:02x}" for s in (24, 16, 8, 0))


async def seed(url: str, nodes: int) -> None:
    """N deploying nodes with one port each, in two INSERT ... SELECT statements."""
    conn = await asyncpg.connect(url)
    try:
        await conn.execute(
            """
            INSERT INTO nodes (uuid, name, driver, boot_interface, driver_info, provision_state)
            SELECT gen_random_uuid(), 'bench-' || g, 'fake-hardware', 'ipxe',
                   jsonb_build_object('deploy_kernel', 'http://192.0.2.9/ipa.kernel',
                                      'deploy_ramdisk', 'http://192.0.2.9/ipa.initramfs'),
                   'deploying'
            FROM generate_series(1, $1) AS g""",
            nodes,
        )
        await conn.execute("""
            INSERT INTO ports (uuid, node_id, address)
            SELECT gen_random_uuid(), id,
                   '52:54:' || lpad(to_hex((n >> 24) & 255), 2, '0') || ':' || lpad(to_hex((n >> 16) & 255), 2, '0')
                   || ':' || lpad(to_hex((n >> 8) & 255), 2, '0') || ':' || lpad(to_hex(n & 255), 2, '0')
            FROM (SELECT id, row_number() OVER (ORDER BY id) AS n FROM nodes) AS numbered""")
        await conn.execute("ANALYZE")
    finally:
        await conn.close()


def start_renderer(db_url: str, workdir: Path, *, cache_ttl: float) -> tuple[subprocess.Popen[bytes], str]:
    ports_file = workdir / f"ports-{cache_ttl}.json"
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("FERRUM_")},
        "FERRUM_DATABASE_URL": db_url,
        "FERRUM_STATE_DIR": str(workdir / "state"),
        "FERRUM_IPXE_API_URL": "http://192.0.2.1:6385",
        "FERRUM_IPXE_CACHE_TTL": str(cache_ttl),
        "FERRUM_LOG_LEVEL": "WARNING",
        "FERRUM_DATABASE_POOL_MAX": "10",
    }
    with open(workdir / "renderer.log", "ab") as log:  # the child keeps its own copy of the descriptor
        process = subprocess.Popen(
            [
                sys.executable,
                "-c",
                "import sys; from services.cli import main; sys.exit(main())",
                "ipxe",
                "--port",
                "0",
                "--grpc-port",
                "0",
                "--ports-file",
                str(ports_file),
            ],
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=log,
        )
    deadline = time.monotonic() + 60
    while not ports_file.exists():
        if process.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"renderer did not start; see {workdir / 'renderer.log'}")
        time.sleep(0.1)
    boot = json.loads(ports_file.read_text())["ipxe HTTP"]
    return process, boot.rsplit("/", 1)[0]


def stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def start_nginx(workdir: Path, script: str) -> tuple[subprocess.Popen[bytes], str]:
    root = workdir / "nginx"
    (root / "www").mkdir(parents=True, exist_ok=True)
    (root / "www" / "script.ipxe").write_text(script)
    os.chmod(root, 0o755)
    os.chmod(root / "www", 0o755)
    os.chmod(root / "www" / "script.ipxe", 0o644)
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    user = "user root;" if os.geteuid() == 0 else ""
    (root / "nginx.conf").write_text(f"""
{user}
worker_processes 1;
pid {root}/nginx.pid;
error_log {root}/error.log warn;
events {{ worker_connections 1024; }}
http {{
  access_log off;
  client_body_temp_path {root}/tmp; proxy_temp_path {root}/tmp; fastcgi_temp_path {root}/tmp;
  uwsgi_temp_path {root}/tmp; scgi_temp_path {root}/tmp;
  server {{
    listen 127.0.0.1:{port};
    root {root}/www;
    location /ipxe {{ default_type text/plain; add_header Cache-Control no-store; try_files /script.ipxe =404; }}
  }}
}}
""")
    process = subprocess.Popen(
        ["nginx", "-p", str(root), "-c", str(root / "nginx.conf"), "-e", str(root / "error.log"), "-g", "daemon off;"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 20
    import urllib.request

    while True:
        try:
            with urllib.request.urlopen(f"{base}/ipxe?mac=52:54:00:00:00:01", timeout=2) as r:
                if r.read().decode() == script:
                    return process, base
        except OSError:
            pass
        if process.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"nginx did not start; see {root / 'error.log'}")
        time.sleep(0.1)


def to_ms(text: str) -> float:
    value, unit = re.fullmatch(r"([\d.]+)(us|ms|s|m)", text).groups()  # type: ignore[union-attr]
    return float(value) * {"us": 0.001, "ms": 1.0, "s": 1000.0, "m": 60000.0}[unit]


def run_wrk(base: str, lua: Path, *, duration: int, connections: int, threads: int) -> dict[str, float]:
    out = subprocess.run(
        ["wrk", f"-t{threads}", f"-c{connections}", f"-d{duration}s", "--latency", "-s", str(lua), f"{base}/ipxe"],
        capture_output=True,
        text=True,
        timeout=duration + 60,
        check=True,
    ).stdout
    rate = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))  # type: ignore[union-attr]
    p50 = to_ms(re.search(r"\s50%\s+(\S+)", out).group(1))  # type: ignore[union-attr]
    p99 = to_ms(re.search(r"\s99%\s+(\S+)", out).group(1))  # type: ignore[union-attr]
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    return {"rate": rate, "p50": p50, "p99": p99, "non2xx": float(errors.group(1)) if errors else 0.0}


def renders_and_requests(base: str) -> tuple[float, float]:
    """From the renderer's /metrics: per-node scripts read and rendered (the latency
    histogram times only those) and per-node requests answered, so far."""
    import urllib.request

    with urllib.request.urlopen(f"{base}/metrics", timeout=10) as r:
        text = r.read().decode()

    def value(pattern: str) -> float:
        found = re.search(pattern + r"\S*\s+([\d.e+]+)", text)
        return float(found.group(1)) if found else 0.0

    return (
        value(r'ferrum_request_seconds_count\{[^}]*method="GET /ipxe"'),
        value(r'ferrum_requests_total\{code="200",method="GET /ipxe"'),
    )


def timed_run(base: str, lua: Path, args: argparse.Namespace) -> dict[str, float]:
    """One wrk run plus how many of its requests needed a database read and a render."""
    renders0, requests0 = renders_and_requests(base)
    row = run_wrk(base, lua, duration=args.duration, connections=args.connections, threads=args.threads)
    renders1, requests1 = renders_and_requests(base)
    row["renders"] = renders1 - renders0
    row["requests"] = requests1 - requests0
    return row


async def boot_storm(base: str, nodes: int, concurrency: int) -> dict[str, float]:
    """Every MAC once, ``concurrency`` in flight; all must be deploy scripts."""
    latencies: list[float] = []
    wrong = 0
    queue = iter(range(1, nodes + 1))
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=IPXE_WAIT_S)) as http:

        async def worker() -> None:
            nonlocal wrong
            for n in queue:
                started = time.perf_counter()
                async with http.get(f"{base}/ipxe", params={"mac": mac_of(n)}) as r:
                    await r.read()
                    if r.status != 200 or r.headers.get("X-Ferrum-Boot-Kind") != "deploy":
                        wrong += 1
                latencies.append(time.perf_counter() - started)

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed = time.perf_counter() - started
    latencies.sort()
    return {
        "seconds": elapsed,
        "rate": nodes / elapsed,
        "p50": statistics.median(latencies) * 1000,
        "p99": latencies[int(len(latencies) * 0.99) - 1] * 1000,
        "max": latencies[-1] * 1000,
        "wrong": wrong,
    }


class Churn:
    """Flips random nodes between deploying and wait call-back (both render a
    deploy script) at ``rate`` per second on its own thread, until stopped."""

    def __init__(self, url: str, nodes: int, rate: float) -> None:
        self._url, self._nodes, self._rate = url, nodes, rate
        self._stop = threading.Event()
        self.changes = 0
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)

    async def _run(self) -> None:
        import random

        conn = await asyncpg.connect(self._url)
        try:
            started = time.monotonic()
            while not self._stop.is_set():
                await conn.execute(
                    "UPDATE nodes SET provision_state = CASE provision_state WHEN 'deploying' THEN 'wait call-back' "
                    "ELSE 'deploying' END WHERE id = (SELECT node_id FROM ports WHERE address = $1)",
                    mac_of(random.randint(1, self._nodes)),
                )
                self.changes += 1
                ahead = started + self.changes / self._rate - time.monotonic()
                if ahead > 0:
                    await asyncio.sleep(ahead)
        finally:
            await conn.close()

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(30)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=10_000)
    parser.add_argument("--duration", type=int, default=10, help="seconds per wrk run")
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--threads", type=int, default=1, help="wrk threads")
    parser.add_argument("--storm-concurrency", type=int, default=200)
    parser.add_argument(
        "--churn",
        type=float,
        default=200.0,
        help="node state changes per second during the extra cached run (0 = skip it)",
    )
    args = parser.parse_args()
    for tool in ("wrk", "nginx"):
        if shutil.which(tool) is None:
            sys.exit(f"{tool} is not installed (apt-get install -y {tool})")
    with tempfile.TemporaryDirectory(prefix="ferrum-bench-ipxe-") as tmp:
        workdir = Path(tmp)
        os.chmod(workdir, 0o755)
        pg = EmbeddedPostgres(workdir / "pg", fsync=False)
        pg.start()
        processes: list[subprocess.Popen[bytes]] = []
        try:
            pg.create_database("bench")
            db_url = pg.database_url("bench")
            asyncio.run(migrate.upgrade(db_url))
            started = time.perf_counter()
            asyncio.run(seed(db_url, args.nodes))
            print(f"seeded {args.nodes} deploying nodes with one port each in {time.perf_counter() - started:.1f} s")
            lua = workdir / "macs.lua"
            lua.write_text(LUA % {"nodes": args.nodes, "offset": 0})
            results: dict[str, dict[str, float]] = {}
            script = ""
            for label, ttl in (("ferrum renderer (no cache)", 0.0), ("ferrum renderer (cache 30 s)", 30.0)):
                process, base = start_renderer(db_url, workdir, cache_ttl=ttl)
                processes.append(process)
                import urllib.request

                with urllib.request.urlopen(f"{base}/ipxe?mac={mac_of(1)}", timeout=10) as r:
                    script = r.read().decode()
                run_wrk(base, lua, duration=2, connections=args.connections, threads=args.threads)  # warm-up
                results[label] = timed_run(base, lua, args)
                if ttl and args.churn:
                    with Churn(db_url, args.nodes, args.churn) as churn:
                        row = timed_run(base, lua, args)
                    results[f"  same, {churn.changes / args.duration:.0f} node changes/s"] = row
                if ttl == 0.0:
                    storm = asyncio.run(boot_storm(base, args.nodes, args.storm_concurrency))
                stop(process)
            nginx, nbase = start_nginx(workdir, script)
            processes.append(nginx)
            run_wrk(nbase, lua, duration=2, connections=args.connections, threads=args.threads)
            results["nginx static file (1 worker)"] = run_wrk(
                nbase, lua, duration=args.duration, connections=args.connections, threads=args.threads
            )
            stop(nginx)
        finally:
            for process in processes:
                stop(process)
            pg.stop()
    static = results["nginx static file (1 worker)"]["rate"]
    print(
        f"\nwrk: {args.duration} s, {args.connections} connections, {args.threads} thread(s), "
        f"a different MAC on every request ({args.nodes} nodes); one renderer process, nginx 1 worker"
    )
    print(f"{'server':<32} {'req/s':>9} {'p50 ms':>8} {'p99 ms':>8} {'non-2xx':>8} {'vs nginx':>9}  read+rendered")
    for label, row in results.items():
        rendered = (
            f"{row['renders']:.0f} of {row['requests']:.0f} ({row['renders'] / row['requests']:.1%})"
            if row.get("requests")
            else ""
        )
        print(
            f"{label:<32} {row['rate']:>9.0f} {row['p50']:>8.2f} {row['p99']:>8.2f} {row['non2xx']:>8.0f} "
            f"{row['rate'] / static:>8.0%}  {rendered}"
        )
    print(
        f"\nboot storm: {args.nodes} distinct MACs once each, {args.storm_concurrency} concurrent (aiohttp client, "
        f"no cache): {storm['seconds']:.1f} s, {storm['rate']:.0f} scripts/s, p50 {storm['p50']:.1f} ms, "
        f"p99 {storm['p99']:.1f} ms, max {storm['max']:.1f} ms, wrong answers {storm['wrong']:.0f}; "
        f"iPXE waits {IPXE_WAIT_S:.0f} s -> p99 is {storm['p99'] / (IPXE_WAIT_S * 1000):.2%} of it"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
