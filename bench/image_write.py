"""Image write throughput of the deploy agent against dd / curl|dd / qemu-img.

Builds a raw image (half random data, half zeros, in 4 MiB stripes) and its
qcow2 conversion, serves both from a local HTTP server, and writes each onto
a fresh sparse file disk:

- the agent: ``ferrum agent`` in its own process, driven over its command API
  (``standby.prepare_image?wait=true``), timed from the POST to the answer (download,
  sha256 of every byte, write, fsync; qcow2: staged + qemu-img convert);
- ``dd if=image of=disk`` (local copy, no network, no hash) and
  ``curl URL | dd of=disk`` for raw;
- ``qemu-img convert -n`` of the local qcow2, and ``curl -o tmp`` + the same
  convert for qcow2; the agent runs both ways: streamed (its default) and
  staged + qemu-img (``--qcow2-via-qemu-img``).

Every run ends with an fsync of the disk. The machine is shared (2 cores,
other work running), so the methods run round-robin, one run of each per
round (agent, dd, curl | dd, agent, ...), and the goals (agent raw >= 0.9 of
``curl | dd`` and >= 0.8 of ``dd``) are judged on the median of the per-round
ratios. Prints MiB/s per method (medians), those ratios, the agent's CPU
seconds per GiB written (user + system of the agent process and its
children, during the command), the load average, and the agent process's
peak RSS (VmHWM) plus the peak RSS of its qemu-img child. Figures only.

    .venv/bin/python bench/image_write.py            # 512 MiB
    .venv/bin/python bench/image_write.py --size-mib 2048
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import psutil
from aiohttp import web

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from services.common.aiohttp_serving import start_http_site  # noqa: E402

MiB = 1024 * 1024
TOKEN = "b" * 43
MAC = "52:54:00:be:0c:01"


def make_images(workdir: Path, size: int) -> tuple[Path, Path]:
    raw, qcow = workdir / "image.raw", workdir / "image.qcow2"
    pool = os.urandom(64 * MiB)
    stripe = 4 * MiB
    with open(raw, "wb") as fh:
        fh.truncate(size)
        for n, offset in enumerate(range(0, size, stripe)):
            if n % 2 == 0:
                start = (n * 1_048_583) % (len(pool) - stripe)
                fh.seek(offset)
                fh.write(pool[start : start + min(stripe, size - offset)])
    subprocess.run(["qemu-img", "convert", "-f", "raw", "-O", "qcow2", str(raw), str(qcow)], check=True)
    return raw, qcow


def sha256_file(path: Path, limit: int | None = None) -> str:
    h = hashlib.sha256()
    left = limit if limit is not None else 1 << 62
    with open(path, "rb") as fh:
        while left and (chunk := fh.read(min(8 * MiB, left))):
            h.update(chunk)
            left -= len(chunk)
    return h.hexdigest()


def fresh_disk(path: Path, size: int) -> Path:
    if path.exists():
        path.unlink()
    with open(path, "wb") as fh:
        fh.truncate(size)
    return path


def fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


async def start_servers(workdir: Path) -> tuple[list[web.AppRunner], str, str]:
    node = {
        "uuid": "6b1f0c1e-0000-4000-8000-00000000be01",
        "properties": {},
        "instance_info": {},
        "driver_internal_info": {},
        "links": [],
    }

    async def lookup(request: web.Request) -> web.Response:
        if MAC in request.query.get("addresses", ""):
            return web.json_response({"node": node, "config": {"agent_token": TOKEN, "heartbeat_timeout": 300}})
        return web.json_response({}, status=404)

    async def heartbeat(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(status=202)

    api = web.Application()
    api.router.add_get("/v1/lookup", lookup)
    api.router.add_post("/v1/heartbeat/{node}", heartbeat)
    files = web.Application()
    files.router.add_static("/", workdir)
    api_runner, api_port = await start_http_site(api, "127.0.0.1", 0)
    files_runner, files_port = await start_http_site(files, "127.0.0.1", 0)
    return [api_runner, files_runner], f"http://127.0.0.1:{api_port}", f"http://127.0.0.1:{files_port}"


def cpu_seconds(process: psutil.Process) -> float:
    """User + system CPU seconds of a process and its children (waited-for and live)."""
    times = process.cpu_times()
    total = times.user + times.system + times.children_user + times.children_system
    for child in process.children(recursive=True):
        with contextlib.suppress(psutil.Error):
            child_times = child.cpu_times()
            total += child_times.user + child_times.system
    return total


async def run_agent(
    api: str, image_url: str, digest: str, disk: Path, workdir: Path, extra: tuple[str, ...] = ()
) -> tuple[float, int, int, float]:
    """Seconds from POST to SUCCEEDED, the agent's VmHWM, its children's peak RSS (bytes)
    and the CPU seconds the agent (with its children) spent on the command."""
    ports = workdir / "agent-ports.json"
    if ports.exists():
        ports.unlink()
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "services.cli",
        "agent",
        "--api-url",
        api,
        "--mac",
        MAC,
        "--disk",
        str(disk),
        "--listen-port",
        "0",
        "--ports-file",
        str(ports),
        "--heartbeat-interval",
        "2",
        "--lookup-interval",
        "0.1",
        "--tmp-dir",
        str(workdir),
        "--exit-on-power-off",
        "--log-level",
        os.environ.get("BENCH_AGENT_LOG", "WARNING"),
        *extra,
        cwd=str(REPO),
        stdout=asyncio.subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        url = ""
        while not url:  # the file may exist before its contents are written
            if time.monotonic() > deadline or proc.returncode is not None:
                raise RuntimeError("ferrum agent did not start")
            try:
                url = json.loads(ports.read_text())["agent"]
            except (OSError, ValueError, KeyError):
                await asyncio.sleep(0.05)
        ps = psutil.Process(proc.pid)
        child_peak = 0
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None)) as session:
            info = {"id": "bench", "urls": [image_url], "os_hash_algo": "sha256", "os_hash_value": digest}
            done = asyncio.Event()

            async def watch_children() -> None:
                nonlocal child_peak
                while not done.is_set():
                    for child in ps.children(recursive=True):
                        with contextlib.suppress(psutil.Error):
                            child_peak = max(child_peak, child.memory_info().rss)
                    await asyncio.sleep(0.05)

            while True:  # the token is known once the agent has looked itself up
                async with session.get(f"{url}/v1/commands/", params={"agent_token": TOKEN}) as r:
                    if r.status == 200:
                        break
                if time.monotonic() > deadline:
                    raise RuntimeError("ferrum agent did not look itself up")
                await asyncio.sleep(0.05)
            watcher = asyncio.create_task(watch_children())
            cpu_before = cpu_seconds(ps)
            started = time.perf_counter()
            async with session.post(
                f"{url}/v1/commands/",
                params={"agent_token": TOKEN, "wait": "true"},
                json={"name": "standby.prepare_image", "params": {"image_info": info}},
            ) as r:
                cmd = await r.json()
            elapsed = time.perf_counter() - started
            cpu = cpu_seconds(ps) - cpu_before
            done.set()
            await watcher
            if r.status != 200 or cmd.get("command_status") != "SUCCEEDED":
                raise RuntimeError(f"agent write failed: {cmd}")
            hwm = 0
            for line in Path(f"/proc/{proc.pid}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    hwm = int(line.split()[1]) * 1024
            async with session.post(
                f"{url}/v1/commands/",
                params={"agent_token": TOKEN, "wait": "true"},
                json={"name": "standby.power_off", "params": {}},
            ) as r:
                await r.read()
        await asyncio.wait_for(proc.wait(), 30)
        return elapsed, hwm, child_peak, cpu
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def run_shell(cmd: str) -> float:
    started = time.perf_counter()
    proc = await asyncio.create_subprocess_shell(cmd)
    if await proc.wait():
        raise RuntimeError(f"baseline failed: {cmd}")
    return time.perf_counter() - started


def median(values: list[float]) -> float:
    return statistics.median(values)


async def bench(args: argparse.Namespace) -> None:
    size = args.size_mib * MiB
    workdir = Path(tempfile.mkdtemp(prefix="ferrum-bench-image-", dir=args.dir))
    runners: list[web.AppRunner] = []
    try:
        t0 = time.perf_counter()
        raw, qcow = make_images(workdir, size)
        digests = {"raw": sha256_file(raw), "qcow2": sha256_file(qcow)}
        os.sync()  # the images' own writeback must not land on the first runs
        print(
            f"images: raw {size // MiB} MiB, qcow2 {qcow.stat().st_size / MiB:.0f} MiB "
            f"(built in {time.perf_counter() - t0:.1f}s), {args.repeat} runs each, median shown"
        )
        runners, api, files = await start_servers(workdir)
        disk = workdir / "disk.img"
        disk_size = size + 64 * MiB
        results: dict[str, float] = {}
        runs: dict[str, list[float]] = {}
        cpu: dict[str, list[float]] = {}
        peaks: list[int] = []
        child_peaks: list[int] = []
        plans: dict[str, list[tuple[str, str | tuple[str, ...] | None]]] = {
            "raw": [
                ("agent raw", None),
                ("dd (local file)", f"dd if={raw} of={disk} bs=8M conv=notrunc,fsync status=none"),
                (
                    "curl | dd",
                    f"curl -sf {files}/image.raw | dd of={disk} bs=8M iflag=fullblock conv=notrunc,fsync status=none",
                ),
            ],
            "qcow2": [
                ("agent qcow2 (streamed)", None),
                ("agent qcow2 (qemu-img)", ("--qcow2-via-qemu-img",)),
                ("qemu-img convert (local)", f"qemu-img convert -n -f qcow2 -O raw {qcow} {disk} && sync {disk}"),
                (
                    "curl -o + qemu-img convert",
                    f"curl -sf -o {workdir}/dl.qcow2 {files}/image.qcow2 && "
                    f"qemu-img convert -n -f qcow2 -O raw {workdir}/dl.qcow2 {disk} && sync {disk} && rm -f {workdir}/dl.qcow2",
                ),
            ],
        }
        if args.page_cache:
            plans["raw"].insert(1, ("agent raw (page cache)", ("--no-direct-io",)))
        # Round-robin over the methods so each sees the same background (page cache, writeback).
        order = [
            (fmt, label, how) for fmt, plan in plans.items() if fmt in args.formats.split(",") for label, how in plan
        ]
        load_before = os.getloadavg()
        for _ in range(args.repeat):
            for fmt, label, how in order:
                fresh_disk(disk, disk_size)
                os.sync()  # start every run with no dirty pages from the previous one
                if how is None or isinstance(how, tuple):
                    elapsed, hwm, child, spent = await run_agent(
                        api, f"{files}/image.{fmt}", digests[fmt], disk, workdir, how or ()
                    )
                    cpu.setdefault(label, []).append(spent / (size / (1024 * MiB)))
                    peaks.append(hwm)
                    child_peaks.append(child)
                else:
                    elapsed = await run_shell(how)
                runs.setdefault(label, []).append(elapsed)
                if args.verify and sha256_file(disk, size) != digests["raw"]:
                    raise RuntimeError(f"{label}: disk content differs from the raw image")
        load_after = os.getloadavg()
        results.update({label: median(times) for label, times in runs.items()})
        print(f"\n{'method':32} {'seconds':>8} {'MiB/s':>8}   runs (s)")
        for label, seconds in results.items():
            print(
                f"{label:32} {seconds:8.2f} {size / MiB / seconds:8.0f}   {' '.join(f'{t:.2f}' for t in runs[label])}"
            )
        print("\nagent throughput / baseline throughput, per round (baseline s / agent s); median first:")
        qcow_bases = ("qemu-img convert (local)", "curl -o + qemu-img convert")
        goals = {("agent raw", "dd (local file)"): 0.8, ("agent raw", "curl | dd"): 0.9}
        for agent_label, bases in (
            ("agent raw", ("dd (local file)", "curl | dd")),
            ("agent raw (page cache)", ("dd (local file)", "curl | dd")),
            ("agent qcow2 (streamed)", qcow_bases),
            ("agent qcow2 (qemu-img)", qcow_bases),
        ):
            for base in bases:
                if agent_label not in runs or base not in runs:
                    continue
                pairs = [b / a for a, b in zip(runs[agent_label], runs[base], strict=True)]
                goal = goals.get((agent_label, base))
                verdict = (
                    "" if goal is None else f"   goal >= {goal:.2f}: {'met' if median(pairs) >= goal else 'NOT met'}"
                )
                print(
                    f"  {agent_label:22} vs {base:28} {median(pairs):5.2f}  "
                    f"({' '.join(f'{r:.2f}' for r in pairs)}){verdict}"
                )
        if cpu:
            print("\nagent CPU seconds per GiB of image (user + system, agent and children; median):")
            for label, values in cpu.items():
                print(f"  {label:32} {median(values):5.2f}   ({' '.join(f'{v:.2f}' for v in values)})")
        print(
            f"\nload average (1/5/15 min) before {' '.join(f'{x:.2f}' for x in load_before)}, "
            f"after {' '.join(f'{x:.2f}' for x in load_after)}, on {os.cpu_count()} CPUs"
        )
        if not peaks:
            return
        print(
            f"\nagent peak RSS (VmHWM): {max(peaks) / MiB:.1f} MiB (goal < 100 MiB); "
            f"its qemu-img child peaked at {max(child_peaks) / MiB:.1f} MiB"
        )
    finally:
        for runner in runners:
            await runner.cleanup()
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--size-mib", type=int, default=512, help="raw image size (default 512; the goal is stated for 2048)"
    )
    parser.add_argument("--repeat", type=int, default=3, help="runs per method; the median is printed (default 3)")
    parser.add_argument("--dir", default=None, help="work directory parent (default system temp)")
    parser.add_argument(
        "--no-verify", dest="verify", action="store_false", help="skip the byte-for-byte check of each run"
    )
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    parser.add_argument(
        "--page-cache",
        action="store_true",
        help="also run the agent with --no-direct-io (raw images through the page cache)",
    )
    parser.add_argument("--formats", default="raw,qcow2", help="which image formats to run (default raw,qcow2)")
    asyncio.run(bench(parser.parse_args()))


if __name__ == "__main__":
    main()
