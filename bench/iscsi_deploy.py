"""The iSCSI deploy's data path against a local conversion and the direct deploy.

Builds a raw image (half random, half zeros, in 4 MiB stripes, as
``bench/image_write.py``) and its qcow2, then, per format and per run, onto a
fresh sparse file disk:

- **iscsi**: the conductor's write (``services.conductor.iscsi_writer``:
  the size checks and ``qemu-img convert -n`` with libiscsi and CHAP) into
  the agent's target (``services.agent.iscsi_target``, a real tgtd serving
  the disk file), then an fsync of the disk file;
- **local**: ``qemu-img convert -n`` of the same image into a local file of
  the same size, then the same fsync (the goal: iscsi at least 0.8 of this);
- **direct**: ``ferrum agent`` writing the same image from HTTP
  (``standby.prepare_image``, as ``bench/image_write.py`` runs it).

Prints MiB/s (image bytes over seconds) with the median over the runs, the
per-pair ratios iscsi/local and iscsi/direct, and the conductor's CPU seconds
per GiB written (the qemu-img children's user+system time: the conductor
process itself only waits), the agent's tgtd CPU seconds per GiB (all its
threads, from /proc), and the load average before and after each format (the
machine is shared: compare the per-pair ratios). Figures only.

    .venv/bin/python bench/iscsi_deploy.py                 # 2 GiB, 3 runs
    .venv/bin/python bench/iscsi_deploy.py --size-mib 512 --runs 1
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from image_write import fresh_disk, fsync_path, make_images, run_agent, sha256_file, start_servers  # noqa: E402

from services.agent.iscsi_target import IscsiTarget, TargetSpec  # noqa: E402
from services.common.iscsi_chap import chap_credentials  # noqa: E402
from services.conductor import iscsi_writer  # noqa: E402

MiB = 1024 * 1024
NODE = "6b1f0c1e-0000-4000-8000-00000000be02"
INITIATOR = "iqn.2026-11.io.ferrum:conductor.bench"


def process_cpu(pid: int | None) -> float:
    """User+system seconds of process ``pid`` (every thread), 0 when it cannot be read."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


async def iscsi_run(image: Path, fmt: str, disk: Path, workdir: Path, sessions: int) -> tuple[float, float, float]:
    """Seconds of the conductor's write (login, size checks, convert, fsync), its children's
    CPU seconds and tgtd's CPU seconds during the write."""
    user, password = chap_credentials("bench deploy key", NODE)
    spec = TargetSpec(
        iqn=f"iqn.2008-10.org.openstack:{NODE}.bench",
        backing_path=str(disk),
        chap_username=user,
        chap_password=password,
        initiator_iqn=INITIATOR,
    )
    target = IscsiTarget(spec, work_dir=str(workdir))
    portal = await target.start()
    try:
        login = iscsi_writer.IscsiLogin(
            address="127.0.0.1",
            port=portal.port,
            iqn=spec.iqn,
            username=user,
            password=password,
            initiator_iqn=INITIATOR,
        )
        cpu, tgtd_cpu = children_cpu(), process_cpu(target.pid)
        started = time.perf_counter()
        await iscsi_writer.write_image(image, login, declared_format=fmt, work_dir=str(workdir), sessions=sessions)
        cpu, tgtd_cpu = children_cpu() - cpu, process_cpu(target.pid) - tgtd_cpu
    finally:
        await target.stop()
    await asyncio.to_thread(fsync_path, disk)
    return time.perf_counter() - started, cpu, tgtd_cpu


async def local_run(image: Path, fmt: str, disk: Path) -> float:
    started = time.perf_counter()
    proc = await asyncio.create_subprocess_exec(
        "qemu-img", "convert", "-n", "-f", fmt, "-O", "raw", str(image), str(disk)
    )
    if await proc.wait():
        raise RuntimeError("qemu-img convert failed")
    await asyncio.to_thread(fsync_path, disk)
    return time.perf_counter() - started


def rate(size: int, seconds: float) -> float:
    return size / MiB / seconds


async def bench(args: argparse.Namespace) -> None:
    size = args.size_mib * MiB
    with tempfile.TemporaryDirectory(prefix="ferrum-bench-iscsi-", dir=args.dir) as tmp:
        workdir = Path(tmp)
        raw, qcow = make_images(workdir, size)
        for made in (raw, qcow):  # their write-back would otherwise run during the first format's runs
            fsync_path(made)
        runners, api, files = await start_servers(workdir)
        digests = {"raw": sha256_file(raw), "qcow2": sha256_file(qcow)}
        disk = workdir / "disk.img"
        try:
            print(
                f"image {args.size_mib} MiB (half random, half zeros), {args.runs} run(s) each, "
                f"{args.sessions} iSCSI session(s), disk: sparse file"
            )
            for fmt, image in (("raw", raw), ("qcow2", qcow)):
                results: dict[str, list[float]] = {"iscsi": [], "local": [], "direct": []}
                cpus, tgtd_cpus = [], []
                load_before = load()
                for _ in range(args.runs):
                    fresh_disk(disk, size + 64 * MiB)
                    seconds, cpu, tgtd_cpu = await iscsi_run(image, fmt, disk, workdir, args.sessions)
                    if sha256_file(disk, size) != digests["raw"]:  # qcow2 too: the disk holds the raw bytes
                        raise RuntimeError("the iSCSI write left a disk that differs from the image")
                    results["iscsi"].append(seconds)
                    cpus.append(cpu)
                    tgtd_cpus.append(tgtd_cpu)
                    fresh_disk(disk, size + 64 * MiB)
                    results["local"].append(await local_run(image, fmt, disk))
                    fresh_disk(disk, size + 64 * MiB)
                    elapsed, _, _, _ = await run_agent(api, f"{files}/{image.name}", digests[fmt], disk, workdir)
                    results["direct"].append(elapsed)
                print(f"\n{fmt}: load average (1/5/15 min) before {load_before}, after {load()}")
                for name, values in results.items():
                    rates = [rate(size, s) for s in values]
                    print(f"  {name:7s} median {statistics.median(rates):7.0f} MiB/s  runs {[round(r) for r in rates]}")
                for base in ("local", "direct"):
                    pairs = [b / a for a, b in zip(results["iscsi"], results[base], strict=True)]
                    print(
                        f"  iscsi/{base:6s} median {statistics.median(pairs):.2f}  per pair {[round(p, 2) for p in pairs]}"
                    )
                per_gib = statistics.median(cpus) / (size / 1024**3)
                print(f"  conductor CPU (qemu-img children) {per_gib:.2f} s per GiB")
                tgtd_per_gib = statistics.median(tgtd_cpus) / (size / 1024**3)
                print(f"  agent CPU (tgtd) {tgtd_per_gib:.2f} s per GiB")
        finally:
            for runner in runners:
                await runner.cleanup()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-mib", type=int, default=2048)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument(
        "--sessions", type=int, default=iscsi_writer.DEFAULT_SESSIONS, help="iSCSI sessions of the conductor's write"
    )
    parser.add_argument("--dir", default=os.environ.get("TMPDIR") or None, help="where images and disks go")
    asyncio.run(bench(parser.parse_args()))


if __name__ == "__main__":
    main()
