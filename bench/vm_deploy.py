"""Real VMs deployed end to end: where the time goes, and how fast the agent writes.

Starts the whole stack in this process (embedded PostgreSQL in a temporary
state directory), a QEMU-backed simulator of N machines (TCG), builds (or
reuses) the deploy ramdisk and a demo OS image of ``--image-mib``, and deploys
every machine at once with a config drive. Each machine's serial console is
polled (every 0.25 s) for the moments that split the deploy:

- firmware: deploy request -> the deploy kernel starts ("Linux version"):
  BMC power on, SeaBIOS, iPXE's DHCP, the boot script, kernel and initramfs
  downloads;
- ramdisk boot: kernel -> the agent's lookup succeeded;
- image write: lookup -> "image written" (heartbeat, command, download + write);
- reboot: image written -> the node is ``active`` (config drive, partition
  UUIDs, soft power off, boot device, power on);
- and, after ``active``, the deployed OS printing its hostname.

The agent logs its write rate; ``ferrum-bench-dd=<MiB>`` on the kernel line
makes the ramdisk's init time ``dd`` of zeros onto the same virtio disk
first, which is the baseline. Figures only: no pass/fail.

    .venv/bin/python bench/vm_deploy.py [--machines 1,4] [--image-mib 128]
"""

from __future__ import annotations

import argparse
import asyncio
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

from services import runtime
from services.common.config import load_settings
from services.demo_vm import guest_settings
from services.ramdisk.demo_os import build_demo_os
from services.ramdisk.deploy_ramdisk import build_ramdisk
from services.simulator.options import SimulatorOptions
from services.simulator.qemu_machine import QemuMachine
from services.simulator.service import Simulator

REPO = Path(__file__).resolve().parents[1]
CACHE = REPO / ".ferrum" / "cache"
V = {"X-OpenStack-Ironic-API-Version": "1.56"}
MiB = 1024 * 1024
MARKERS = {
    "kernel": "Linux version",
    "agent": "lookup succeeded",
    "written": "image written",
    "os": "hostname=",
}
RATE = re.compile(r"image written .* bytes=(\d+) rate=([0-9.]+)")
DD = re.compile(r"dd wrote (\d+) MiB to \S+ in ([0-9.]+) s")


def read_log(path: Path) -> str:
    """The serial log so far ("" before the VM first starts)."""
    try:
        return path.read_text(errors="replace")
    except FileNotFoundError:
        return ""


async def request(session: aiohttp.ClientSession, method: str, url: str, body: Any = None) -> Any:
    for _ in range(600):
        async with session.request(method, url, json=body, headers=V) as response:
            if response.status in (409, 503):
                await asyncio.sleep(0.1)
                continue
            if response.status >= 400:
                raise RuntimeError(f"{method} {url}: {response.status} {await response.text()}")
            return await response.json() if response.status in (200, 201) else None
    raise RuntimeError(f"{method} {url}: still busy")


async def wait_state(session: aiohttp.ClientSession, url: str, wanted: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        node = await request(session, "GET", url)
        if node["provision_state"] == wanted and not node["reservation"]:
            return
        if "failed" in node["provision_state"] or time.monotonic() > deadline:
            raise RuntimeError(f"{url}: {node['provision_state']} ({node['last_error']})")
        await asyncio.sleep(0.5)


async def deploy_round(stack: Any, count: int, urls: dict[str, str], sha256: str, dd_mib: int) -> list[dict[str, Any]]:
    """Deploy ``count`` fresh VMs at once; one timing record per machine."""
    api = stack.endpoints["api REST (Ironic v1)"]
    workdir = Path(tempfile.mkdtemp(prefix=f"vm-bench-{count}-", dir=stack.settings.state_dir))
    simulator = Simulator(
        SimulatorOptions(
            machines=count,
            state_dir=str(workdir),
            boot_url=stack.endpoints["ipxe HTTP"],
            disk_size=1024 * MiB,
            name_prefix=f"bench{count}-",
            first_index=count * 100,
            backend="qemu",
        ).validate()
    )
    await simulator.start()
    try:
        async with aiohttp.ClientSession() as session:
            nodes: list[tuple[dict[str, Any], QemuMachine]] = []
            for machine in simulator.machines:
                assert isinstance(machine, QemuMachine)
                info = simulator.driver_info(machine)
                info["kernel_append_params"] += f" ferrum-bench-dd={dd_mib}"
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
                            **info,
                            "deploy_kernel": urls["kernel"],
                            "deploy_ramdisk": urls["initramfs"],
                        },
                        "instance_info": {
                            "image_source": urls["image"],
                            "image_os_hash_algo": "sha256",
                            "image_os_hash_value": sha256,
                        },
                    },
                )
                await request(
                    session, "POST", f"{api}/v1/ports", {"node_uuid": node["uuid"], "address": machine.macs[0]}
                )
                for verb, state in (("manage", "manageable"), ("provide", "available")):
                    await request(session, "PUT", f"{api}/v1/nodes/{node['uuid']}/states/provision", {"target": verb})
                    await wait_state(session, f"{api}/v1/nodes/{node['uuid']}", state, 120)
                nodes.append((node, machine))
            started = time.monotonic()
            for node, machine in nodes:
                await request(
                    session,
                    "PUT",
                    f"{api}/v1/nodes/{node['uuid']}/states/provision",
                    {"target": "active", "configdrive": {"meta_data": {"hostname": f"{machine.name}.bench"}}},
                )
            records: list[dict[str, Any]] = [{"name": m.name, "seen": {}} for _, m in nodes]
            deadline = started + 1800
            while any("os" not in r["seen"] for r in records):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"not every VM booted its OS within 30 minutes: {records}")
                now = time.monotonic() - started
                for (node, machine), record in zip(nodes, records, strict=True):
                    log = await asyncio.to_thread(read_log, Path(machine.serial_log))
                    for key, marker in MARKERS.items():
                        if key not in record["seen"] and marker in log:
                            record["seen"][key] = now
                    if "active" not in record["seen"]:
                        shown = await request(session, "GET", f"{api}/v1/nodes/{node['uuid']}")
                        if shown["provision_state"] == "active" and not shown["reservation"]:
                            record["seen"]["active"] = now
                        elif "failed" in shown["provision_state"]:
                            raise RuntimeError(f"{machine.name}: {shown['last_error']}")
                    if (rate := RATE.search(log)) and "rate" not in record:
                        record["bytes"], record["rate"] = int(rate.group(1)), float(rate.group(2))
                    if (dd := DD.search(log)) and "dd_rate" not in record:
                        record["dd_rate"] = int(dd.group(1)) * MiB / max(float(dd.group(2)), 0.01)
                await asyncio.sleep(0.25)
            for node, _ in nodes:
                await request(session, "PUT", f"{api}/v1/nodes/{node['uuid']}/states/provision", {"target": "deleted"})
            for node, _ in nodes:
                await wait_state(session, f"{api}/v1/nodes/{node['uuid']}", "available", 300)
                await request(session, "DELETE", f"{api}/v1/nodes/{node['uuid']}")
    finally:
        await simulator.stop()
    return records


def report(count: int, records: list[dict[str, Any]]) -> None:
    def phase(record: dict[str, Any], end: str, begin: str | None) -> float:
        return record["seen"][end] - (record["seen"][begin] if begin else 0.0)

    print(f"\n{count} machine(s) at once (median over machines, seconds; MiB/s):")
    rows = (
        ("firmware (power on -> kernel)", "kernel", None),
        ("ramdisk boot (kernel -> agent up)", "agent", "kernel"),
        ("image write (agent up -> written)", "written", "agent"),
        ("reboot (written -> active)", "active", "written"),
        ("deploy request -> active", "active", None),
        ("active -> OS printed its hostname", "os", "active"),
    )
    for label, end, begin in rows:
        values = [phase(r, end, begin) for r in records]
        print(f"  {label:<38} {statistics.median(values):7.1f}   (min {min(values):.1f}, max {max(values):.1f})")
    rates = [r["rate"] / MiB for r in records if "rate" in r]
    dd = [r["dd_rate"] / MiB for r in records if "dd_rate" in r]
    if rates and dd:
        agent, baseline = statistics.median(rates), statistics.median(dd)
        print(
            f"  agent write rate in the VM: {agent:.1f} MiB/s; dd of zeros to the same virtio disk: "
            f"{baseline:.1f} MiB/s (agent {100 * agent / baseline:.0f}%)"
        )


async def bench(stack: Any, args: argparse.Namespace) -> None:
    cache = CACHE / "debian"
    ramdisk = await asyncio.to_thread(build_ramdisk, CACHE / "vm-bench", cache=cache, reuse=True)
    image = await asyncio.to_thread(build_demo_os, CACHE / "vm-bench", cache=cache, size_mib=args.image_mib, reuse=True)
    store = next(s for s in stack.services if s.name == "conductor").objectstore
    for name, path in (("kernel", ramdisk.kernel), ("initramfs", ramdisk.initramfs), ("image", image.path)):
        await store.put_file("vm-bench", name, path, content_type="application/octet-stream", via="grpc")
    urls = {name: await store.temp_url("vm-bench", name, lifetime=7200) for name in ("kernel", "initramfs", "image")}
    print(f"image {image.size // MiB} MiB, initramfs {ramdisk.compressed_bytes / MiB:.1f} MiB, TCG, 2 vCPU host cores")
    for count in args.machines:
        report(count, await deploy_round(stack, count, urls, image.sha256, args.image_mib))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--machines", default="1,4", help="comma-separated machine counts (default 1,4)")
    parser.add_argument("--image-mib", type=int, default=128, help="demo OS image size, also dd's size (default 128)")
    args = parser.parse_args()
    args.machines = [int(n) for n in args.machines.split(",") if n.strip()]
    with tempfile.TemporaryDirectory(prefix="ferrum-vm-bench-") as state:
        settings = load_settings(
            {},
            overrides={
                None: {"state_dir": state, "log_level": "WARNING"},
                "api": {"grpc_port": 0},
                "conductor": {"grpc_port": 0, "metrics_port": 0, "automated_clean": False},
                "ipxe": {"port": 0, "grpc_port": 0},
                "objectstore": {"grpc_port": 0},
            },
        )
        settings = guest_settings(settings)
        from services.common.logs import configure_logging

        configure_logging("WARNING", "text")
        return asyncio.run(
            runtime.serve(settings, ["objectstore", "ipxe", "conductor", "api"], until=lambda s: bench(s, args))
        )


if __name__ == "__main__":
    sys.exit(main())
