"""Virtual-media boot figures (issue 17): ISO builds, time to first heartbeat, builds per image.

1. **ISO build time.** Ferrum's ``create_iso_image`` (pycdlib) on the QEMU
   tests' Debian kernel and busybox initramfs (``tests/e2e/bootfiles.py``,
   fetched once), against ``xorriso -as mkisofs`` on exactly the same files
   (extracted from Ferrum's ISO: ISOLINUX El Torito entry, the ESP as the UEFI
   entry, Rock Ridge and Joliet), in the same run; the median of ``--repeat``
   builds of each.
2. **Time to the agent's first heartbeat** for ``--machines`` simulated
   machines deployed at once: by virtual media (``redfish-virtual-media``:
   a shared ISO built by the conductor, a floppy per node) against the same
   number booting by iPXE. Measured from the deploy request to the first
   ``agent_last_heartbeat`` the api shows for each node (polled every 0.2 s).
3. **ISO builds** for those virtual-media deploys of one image (the
   conductor's count). Goal: 1.

The stack runs in this process (embedded PostgreSQL, api, conductor, ipxe,
object store) next to the simulator; the deploy image is small, so the
figures are about booting, not writing disks. Figures only.

    .venv/bin/python bench/vmedia.py                        # about 2 minutes on 2 cores
    .venv/bin/python bench/vmedia.py --machines 20 --repeat 3
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import logging
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from services.common.config import load_settings  # noqa: E402
from services.common.images import boot_iso, efi  # noqa: E402
from services.runtime import ALL_SERVICES_ORDER, RunningStack  # noqa: E402
from services.simulator.options import SimulatorOptions  # noqa: E402
from services.simulator.service import Simulator  # noqa: E402
from tests.e2e.bootfiles import MARKER, ensure_initramfs, ensure_kernel  # noqa: E402

V = {"X-OpenStack-Ironic-API-Version": "1.56"}
USER, PASSWORD = "admin", "bench-password"
PARAMS = "nofb vga=normal console=ttyS0,115200n8 boot_method=vmedia"
IMAGE = b"\x00" * 512 + b"FERRUM-VMEDIA-BENCH" * 50_000


# ---- 1. ISO build time -------------------------------------------------------------------------


def timed(fn: Any) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def iso_builds(work: Path, repeat: int) -> dict[str, Any]:
    kernel, ramdisk = ensure_kernel(), ensure_initramfs(MARKER)
    esp = efi.build_esp({"EFI/BOOT/BOOTX64.EFI": efi.build_grub_efi(work / "BOOTX64.EFI")}, work_dir=str(work))
    bios = boot_iso.BiosLoader()

    def ferrum(out: Path) -> None:
        boot_iso.create_iso_image(out, kernel=kernel, ramdisk=ramdisk, kernel_params=PARAMS, bios=bios, esp=esp)

    ferrum(work / "reference.iso")
    tree = work / "tree"
    subprocess.run(
        ["xorriso", "-osirrox", "on", "-indev", str(work / "reference.iso"), "-extract", "/", str(tree)],
        check=True,
        capture_output=True,
    )
    subprocess.run(["chmod", "-R", "u+w", str(tree)], check=True)
    (tree / "isolinux" / "boot.cat").unlink(missing_ok=True)  # mkisofs writes its own catalog

    def xorriso(out: Path) -> None:
        argv = [
            "xorriso", "-as", "mkisofs", "-quiet", "-o", str(out), "-V", boot_iso.LABEL, "-R", "-J",
            "-b", "isolinux/isolinux.bin", "-c", "isolinux/boot.cat", "-no-emul-boot",
            "-boot-load-size", "4", "-boot-info-table",
            "-eltorito-alt-boot", "-e", "boot/grub/efiboot.img", "-no-emul-boot", str(tree),
        ]  # fmt: skip
        subprocess.run(argv, check=True, capture_output=True)

    times: dict[str, list[float]] = {"ferrum (pycdlib)": [], "xorriso -as mkisofs": []}
    sizes: dict[str, int] = {}
    for index in range(repeat):  # interleaved, so both see the same page cache and load
        for name, build in (("ferrum (pycdlib)", ferrum), ("xorriso -as mkisofs", xorriso)):
            out = work / f"{name.split()[0]}-{index}.iso"
            times[name].append(timed(lambda build=build, out=out: build(out)))
            sizes[name] = out.stat().st_size
            out.unlink()
    return {
        "inputs": f"kernel {kernel.stat().st_size // 1024} KiB, ramdisk {ramdisk.stat().st_size // 1024} KiB, "
        f"ESP {len(esp) // 1024} KiB",
        "median": {name: statistics.median(values) for name, values in times.items()},
        "sizes": sizes,
    }


# ---- 2 and 3. a fleet booting by virtual media, then by iPXE -----------------------------------


async def request(session: aiohttp.ClientSession, method: str, url: str, body: Any = None) -> Any:
    for _ in range(2000):
        async with session.request(method, url, json=body, headers=V) as reply:
            if reply.status in (409, 503):
                await asyncio.sleep(0.05)
                continue
            if reply.status >= 400:
                raise RuntimeError(f"{method} {url}: {reply.status} {await reply.text()}")
            return await reply.json() if reply.status in (200, 201) else None
    raise RuntimeError(f"{method} {url}: still busy")


async def wait_states(session: aiohttp.ClientSession, api: str, uuids: list[str], state: str) -> None:
    deadline = time.monotonic() + 600
    pending = set(uuids)
    while pending:
        for uuid in list(pending):
            node = await request(session, "GET", f"{api}/v1/nodes/{uuid}")
            if node["provision_state"] == state and node["reservation"] is None:
                pending.discard(uuid)
            elif node["provision_state"] in ("deploy failed", "clean failed"):
                raise RuntimeError(f"{uuid}: {node['provision_state']}: {node['last_error']}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{len(pending)} nodes not {state} after 600 s")
        await asyncio.sleep(0.2)


async def fleet(
    stack: RunningStack,
    session: aiohttp.ClientSession,
    tmp: Path,
    *,
    boot: str,
    machines: int,
    first: int,
    simulators: list[Simulator],
) -> list[float]:
    """Deploy ``machines`` at once booting by ``boot``; each node's seconds to its first heartbeat.
    The simulator goes into ``simulators``, stopped after the stack (whose conductor logs out of
    its BMCs on the way down)."""
    api = stack.endpoints["api REST (Ironic v1)"]
    conductor: Any = next(s for s in stack.services if s.name == "conductor")
    store = conductor.objectstore
    simulator = Simulator(
        SimulatorOptions(
            machines=machines,
            state_dir=str(tmp / f"machines-{boot}"),
            boot_url=stack.endpoints["ipxe HTTP"],
            username=USER,
            password=PASSWORD,
            disk_size=16 * 1024 * 1024,
            name_prefix=f"{boot}-",
            first_index=first,
        ).validate()
    )
    simulators.append(simulator)
    await simulator.start()
    kernel = await store.temp_url("bench", "vmlinuz", lifetime=3600)
    ramdisk = await store.temp_url("bench", "initrd", lifetime=3600)
    image = await store.temp_url("bench", "disk.raw", lifetime=3600)
    uuids = []
    for machine in simulator.machines:
        node = await request(
            session,
            "POST",
            f"{api}/v1/nodes",
            {
                "name": machine.name,
                "driver": "redfish",
                "boot_interface": "redfish-virtual-media" if boot == "virtual-media" else "ipxe",
                "deploy_interface": "direct",
                "driver_info": {
                    "redfish_address": simulator.redfish_url,
                    "redfish_system_id": machine.system_path,
                    "redfish_username": USER,
                    "redfish_password": PASSWORD,
                    "deploy_kernel": kernel,
                    "deploy_ramdisk": ramdisk,
                },
                "instance_info": {
                    "image_source": image,
                    "image_os_hash_algo": "sha256",
                    "image_os_hash_value": hashlib.sha256(IMAGE).hexdigest(),
                },
            },
        )
        await request(session, "POST", f"{api}/v1/ports", {"node_uuid": node["uuid"], "address": machine.macs[0]})
        uuids.append(node["uuid"])
    for verb, state in (("manage", "manageable"), ("provide", "available")):
        await asyncio.gather(
            *(request(session, "PUT", f"{api}/v1/nodes/{u}/states/provision", {"target": verb}) for u in uuids)
        )
        await wait_states(session, api, uuids, state)
    started = time.monotonic()
    await asyncio.gather(
        *(request(session, "PUT", f"{api}/v1/nodes/{u}/states/provision", {"target": "active"}) for u in uuids)
    )
    first_beat: dict[str, float] = {}
    deadline = time.monotonic() + 600
    while len(first_beat) < len(uuids):
        listing = await request(session, "GET", f"{api}/v1/nodes/detail?limit=1000")
        now = time.monotonic() - started
        for node in listing["nodes"]:
            if node["uuid"] in uuids and node["uuid"] not in first_beat:
                if (node.get("driver_internal_info") or {}).get("agent_last_heartbeat"):
                    first_beat[node["uuid"]] = now
                elif node["provision_state"] == "deploy failed":
                    raise RuntimeError(f"{node['name']}: {node['last_error']}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{len(uuids) - len(first_beat)} nodes never heartbeated")
        await asyncio.sleep(0.2)
    await wait_states(session, api, uuids, "active")
    return sorted(first_beat.values())


async def fleets(machines: int, tmp: Path) -> dict[str, Any]:
    settings = load_settings(
        {},
        overrides={
            None: {"state_dir": str(tmp / "state"), "log_level": "WARNING"},
            "database": {"pool_max": 40},
            "api": {"port": 0, "grpc_port": 0},
            "conductor": {
                "grpc_port": 0,
                "metrics_port": 0,
                "workers": 4000,
                "enabled_boot_interfaces": ("fake", "ipxe", "redfish-virtual-media"),
            },
            "ipxe": {"port": 0, "grpc_port": 0},
            "objectstore": {"grpc_port": 0, "http_port": 0},
        },
    )
    stack = RunningStack()
    simulators: list[Simulator] = []
    await stack.start(settings, list(ALL_SERVICES_ORDER))
    try:
        conductor: Any = next(s for s in stack.services if s.name == "conductor")
        store = conductor.objectstore
        await store.put_file("bench", "vmlinuz", ensure_kernel())
        await store.put_file("bench", "initrd", ensure_initramfs(MARKER))
        await store.put_bytes("bench", "disk.raw", IMAGE)
        results: dict[str, Any] = {}
        async with aiohttp.ClientSession() as session:
            results["virtual-media"] = await fleet(
                stack, session, tmp, boot="virtual-media", machines=machines, first=10_000, simulators=simulators
            )
            results["builds"] = conductor.manager.vmedia.builds
            results["ipxe"] = await fleet(
                stack, session, tmp, boot="ipxe", machines=machines, first=20_000, simulators=simulators
            )
        return results
    finally:
        await stack.close()
        for simulator in simulators:
            await simulator.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--machines", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=5, help="ISO builds of each kind (default 5)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    missing = [tool for tool in ("xorriso", "mkfs.vfat", "mcopy", "grub-mkimage") if shutil.which(tool) is None]
    if missing:
        print(f"bench/vmedia.py needs {', '.join(missing)} (scripts/apt-packages.txt)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="ferrum-vmedia-bench-") as tmp:
        builds = iso_builds(Path(tmp), args.repeat)
        print(f"ISO build ({builds['inputs']}), median of {args.repeat}:")
        for name, seconds in builds["median"].items():
            print(f"  {name:<22} {seconds * 1000:8.1f} ms   {builds['sizes'][name] / 1024**2:6.1f} MiB")
        ours, theirs = builds["median"]["ferrum (pycdlib)"], builds["median"]["xorriso -as mkisofs"]
        print(f"  ferrum / xorriso: {ours / theirs:.2f} (goal: <= 1)")
        beats = asyncio.run(fleets(args.machines, Path(tmp)))
    print(f"\nTime to the agent's first heartbeat, {args.machines} machines deployed at once (seconds):")
    print(f"  {'boot':<15} {'median':>7} {'p95':>7} {'last':>7}")
    for boot in ("virtual-media", "ipxe"):
        values = beats[boot]
        p95 = values[min(len(values) - 1, int(len(values) * 0.95))]
        print(f"  {boot:<15} {statistics.median(values):7.2f} {p95:7.2f} {values[-1]:7.2f}")
    print(f"\nISO builds for {args.machines} virtual-media deploys of one image: {beats['builds']} (goal: 1)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
