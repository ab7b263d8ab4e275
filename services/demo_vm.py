"""`ferrum demo --backend qemu`: real VMs provisioned end to end, shown live.

The same operator's path as the simulated demo (enroll, manage, provide,
deploy with a config drive, undeploy, delete over the Ironic REST API), but
each machine is a QEMU VM behind the simulator's Redfish service: it
network-boots the deploy ramdisk built by ``ferrum ramdisk build``, the real
agent writes the demo OS built by ``ferrum image build-demo`` to its virtio
disk, and the deployed OS prints the hostname from its config drive on the
serial console. The live view shows each node's state and image write, and
the tail of each VM's serial console.

The guest reaches the host's loopback as 10.0.2.2, so the api and the object
store must be addressed that way in what the guest is told (the agent's
``ipa-api-url``, temp URLs): :func:`guest_settings` picks their ports before
the stack starts. The ramdisk and the image are built before the stack starts
too (:func:`prepare_files`): nothing slow runs on a live stack's loop.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import secrets
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from services.common.config import Settings
from services.common.ports import unused_tcp_port
from services.demo import REDFISH_PASSWORD, REDFISH_USER, DemoError, rest_call, wait_provision_state
from services.ramdisk.demo_os import DemoOsImage, build_demo_os
from services.ramdisk.deploy_ramdisk import RamdiskBuild, build_ramdisk

MiB = 1024 * 1024
MAX_NODES = 4  # each VM is a TCG process: more than the cores make every one of them crawl
DEPLOY_TIMEOUT = 900.0
OS_TIMEOUT = 240.0
CONSOLE_TAIL = 4
STAGES = ("power_on", "kernel", "ramdisk", "agent", "image", "reboot", "os")


@dataclass(frozen=True)
class VmFiles:
    ramdisk: RamdiskBuild
    os_image: DemoOsImage


def guest_settings(settings: Settings) -> Settings:
    """The api and object store on known ports, announced to guests as 10.0.2.2 (their view of our loopback)."""
    api_port, objects_port = unused_tcp_port(), unused_tcp_port()
    return dataclasses.replace(
        settings,
        api=dataclasses.replace(settings.api, port=api_port),
        ipxe=dataclasses.replace(settings.ipxe, api_url=f"http://10.0.2.2:{api_port}"),
        objectstore=dataclasses.replace(
            settings.objectstore, http_port=objects_port, public_url=f"http://10.0.2.2:{objects_port}"
        ),
    )


def prepare_files(state_dir: Path, console: Console) -> VmFiles:
    """The deploy ramdisk and the demo OS image, built (or found current) under ``state_dir``."""
    cache = state_dir / "cache" / "debian"
    console.print(
        "Building the deploy ramdisk and the demo OS image from Debian packages (cached after the first run)..."
    )
    ramdisk = build_ramdisk(state_dir / "ramdisk", cache=cache, reuse=True)
    os_image = build_demo_os(state_dir / "images", cache=cache, reuse=True)
    console.print(
        f"Deploy ramdisk: {ramdisk.kernel_package}, initramfs {ramdisk.compressed_bytes / MiB:.1f} MiB "
        f"(built in {ramdisk.seconds:.0f} s); demo OS image {os_image.size // MiB} MiB GPT + syslinux"
    )
    return VmFiles(ramdisk=ramdisk, os_image=os_image)


def _stage(node: dict[str, Any] | None, lines: list[str]) -> str:
    """Where a machine is, from its console (the ramdisk's and the demo OS's own lines)."""
    text = "\n".join(lines)
    if any(line.startswith("hostname=") for line in lines):
        return "OS booted"
    for marker, stage in (
        ("ferrum-demo-os:", "OS booting"),
        ("leaving the ramdisk", "rebooting"),
        ("image written", "image written"),
        ("command started", "writing image"),
        ("lookup succeeded", "agent up"),
        ("ferrum-ramdisk:", "ramdisk booting"),
        ("Linux version", "kernel"),
        ("iPXE", "network boot"),
        ("SeaBIOS", "firmware"),
    ):
        if marker in text:
            return stage
    return (node or {}).get("provision_state") or "-"


def _view(nodes: list[dict[str, Any]], machines: dict[str, Any], shown: dict[str, dict[str, Any]], size: int) -> Group:
    table = Table(expand=True)
    for column in ("node", "provision state", "power", "image written", "machine"):
        table.add_column(column, no_wrap=True)
    panels: list[Any] = [table]
    for node in nodes:
        machine = machines[node["name"]]
        state = shown.get(node["uuid"]) or node
        lines = machine.console_lines(40)
        written = (state.get("driver_internal_info") or {}).get("deploy_progress", {}).get("bytes_written", 0)
        table.add_row(
            node["name"],
            state.get("provision_state") or "-",
            machine.power_state,
            f"{min(written, size) / MiB:5.1f} / {size / MiB:.0f} MiB",
            _stage(state, lines),
        )
        tail = Text(f"{node['name']} serial console:\n", style="bold")
        for line in lines[-CONSOLE_TAIL:]:
            tail.append(f"  {line[:150]}\n", style="dim")
        panels.append(tail)
    return Group(*panels)


def _image_digest(path: Path, start: int, end: int) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        handle.seek(start)
        left = end - start
        while left > 0 and (chunk := handle.read(min(4 * MiB, left))):
            digest.update(chunk)
            left -= len(chunk)
    return digest.hexdigest()


async def run_vm_demo(stack: Any, *, nodes: int, files: VmFiles, simulators: list[Any]) -> None:
    """Provision ``nodes`` QEMU machines through ``stack`` (the simulator goes into ``simulators``
    for the caller to stop after the stack, whose conductors log out of the BMC on the way down)."""
    from services.simulator.options import SimulatorOptions
    from services.simulator.service import Simulator

    if not 1 <= nodes <= MAX_NODES:
        raise DemoError(f"the qemu demo runs 1 to {MAX_NODES} machines, not {nodes}")
    console = Console(width=None if Console().is_terminal else 120)
    api = stack.endpoints["api REST (Ironic v1)"]
    run = secrets.randbelow(4000)
    state = Path(stack.settings.state_dir) / "demo" / f"vm-run-{run}"
    started = time.monotonic()
    simulator = Simulator(
        SimulatorOptions(
            machines=nodes,
            state_dir=str(state / "machines"),
            boot_url=stack.endpoints["ipxe HTTP"],
            username=REDFISH_USER,
            password=REDFISH_PASSWORD,
            name_prefix=f"vm{run}-",
            first_index=run * 1000,
            disk_size=512 * MiB,
            backend="qemu",
        ).validate()
    )
    simulators.append(simulator)
    await simulator.start()
    store = next(s for s in stack.services if s.name == "conductor").objectstore
    if store is None:
        raise DemoError("the demo needs the stack's object store")
    objects = {
        "ferrum-agent.kernel": files.ramdisk.kernel,
        "ferrum-agent.initramfs": files.ramdisk.initramfs,
        "ferrum-demo-os.raw": files.os_image.path,
    }
    # The object store's public URL is the guests' view of this host (10.0.2.2), which this
    # host cannot reach: upload over gRPC rather than try HTTP first and warn on the way back.
    for name, path in objects.items():
        await store.put_file("demo-vm", name, path, content_type="application/octet-stream", via="grpc")
    urls = {name: await store.temp_url("demo-vm", name, lifetime=3600) for name in objects}
    image = files.os_image
    machines = {m.name: m for m in simulator.machines}
    async with aiohttp.ClientSession() as session:
        console.print(
            f"\n[bold]Ferrum[/] at {api}; {nodes} QEMU machines (TCG) behind Redfish at {simulator.redfish_url}; "
            f"they network-boot {stack.endpoints['ipxe HTTP']} (10.0.2.2 from inside the VMs)"
        )
        enrolled = []
        for machine in simulator.machines:
            node = await rest_call(
                session,
                "POST",
                f"{api}/v1/nodes",
                {
                    "name": machine.name,
                    "driver": "redfish",
                    "boot_interface": "ipxe",
                    "deploy_interface": "direct",
                    "resource_class": "baremetal",
                    "driver_info": {
                        **simulator.driver_info(machine),
                        "deploy_kernel": urls["ferrum-agent.kernel"],
                        "deploy_ramdisk": urls["ferrum-agent.initramfs"],
                    },
                    "properties": {"root_device": {"serial": machine.disk_serial}},
                    "instance_info": {
                        "image_source": urls["ferrum-demo-os.raw"],
                        "image_os_hash_algo": "sha256",
                        "image_os_hash_value": image.sha256,
                    },
                },
            )
            await rest_call(session, "POST", f"{api}/v1/ports", {"node_uuid": node["uuid"], "address": machine.macs[0]})
            enrolled.append(node)
        console.print(f"Enrolled {nodes} nodes (redfish + ipxe + direct); manage, provide, deploy...")
        for node in enrolled:
            url = f"{api}/v1/nodes/{node['uuid']}"
            for verb, wanted in (("manage", "manageable"), ("provide", "available")):
                await rest_call(session, "PUT", f"{url}/states/provision", {"target": verb})
                await wait_provision_state(session, url, wanted, timeout=DEPLOY_TIMEOUT)
        deploy_started = time.monotonic()
        for node in enrolled:
            await rest_call(
                session,
                "PUT",
                f"{api}/v1/nodes/{node['uuid']}/states/provision",
                {
                    "target": "active",
                    "configdrive": {
                        "meta_data": {"hostname": f"{node['name']}.demo"},
                        "user_data": f"#cloud-config provisioned by Ferrum: {node['name']}\n",
                    },
                },
            )
        timings: dict[str, float] = {}
        shown: dict[str, dict[str, Any]] = {}
        with Live(_view(enrolled, machines, shown, image.size), console=console, refresh_per_second=2) as live:
            deadline = time.monotonic() + DEPLOY_TIMEOUT
            while len(timings) < nodes:
                for node in enrolled:
                    current = await rest_call(session, "GET", f"{api}/v1/nodes/{node['uuid']}")
                    shown[node["uuid"]] = current
                    if current["provision_state"] in ("deploy failed", "error"):
                        raise DemoError(f"node {node['name']} failed to deploy: {current['last_error']}")
                    lines = await asyncio.to_thread(machines[node["name"]].console_lines, 40)
                    if node["uuid"] not in timings and any(line.startswith("hostname=") for line in lines):
                        timings[node["uuid"]] = time.monotonic() - deploy_started
                live.update(_view(enrolled, machines, shown, image.size))
                if time.monotonic() > deadline:
                    raise DemoError(f"{nodes - len(timings)} machines did not boot their deployed OS in time")
                await asyncio.sleep(1)
        table = Table(title=f"{nodes} real VMs provisioned in {time.monotonic() - started:.0f} s")
        for column in ("node", "state", "power", "to OS", "disk", "OS printed"):
            table.add_column(column, no_wrap=True)
        expected = await asyncio.to_thread(_image_digest, image.path, MiB, image.size - MiB)
        bad = []
        for node in enrolled:
            machine = machines[node["name"]]
            current = await rest_call(session, "GET", f"{api}/v1/nodes/{node['uuid']}")
            digest = await asyncio.to_thread(_image_digest, Path(machine.disk_path), MiB, image.size - MiB)
            if digest != expected:
                bad.append(node["name"])
            printed = [line for line in machine.console_lines(40) if line.startswith("hostname=")]
            table.add_row(
                node["name"],
                current["provision_state"],
                current["power_state"],
                f"{timings[node['uuid']]:.0f} s",
                "[green]image[/]" if digest == expected else "[red]DIFFERS[/]",
                printed[-1] if printed else "-",
            )
        console.print(table)
        if bad:
            raise DemoError(f"disks differ from the image on {bad}")
        console.print("Each VM booted the OS the agent wrote and printed the hostname from its config drive.")
        console.print("Tearing down: undeploy every node...")
        for node in enrolled:
            await rest_call(session, "PUT", f"{api}/v1/nodes/{node['uuid']}/states/provision", {"target": "deleted"})
        for node in enrolled:
            await wait_provision_state(session, f"{api}/v1/nodes/{node['uuid']}", "available", DEPLOY_TIMEOUT)
        powered = [m.name for m in simulator.machines if m.power_state != "Off"]
        for node in enrolled:
            await rest_call(session, "DELETE", f"{api}/v1/nodes/{node['uuid']}")
        for name in objects:
            await store.delete("demo-vm", name)
        console.print(
            f"All {nodes} nodes undeployed"
            + (f" (still powered: {powered})" if powered else ", their VMs powered off")
            + ", then deleted."
        )
    await asyncio.to_thread(shutil.rmtree, state, True)
