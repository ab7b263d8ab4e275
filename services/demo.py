"""`ferrum demo`: a rack of simulated machines provisioned end to end.

It starts the simulator (Redfish BMCs, iPXE-booting firmware, the real deploy
agent, sparse-file disks) next to a freshly started stack, builds a small
GPT + ext4 disk image, stores it in Ferrum's object store, then does what an
operator does over the Ironic REST API: enroll the machines, manage, provide
and deploy them with a config drive. It shows each machine's image write
live, checks every disk byte for byte against the image, shows what each
machine's "OS" found on its config drive, undeploys them and stops.
"""

from __future__ import annotations

import asyncio
import secrets
import shutil
import time
from pathlib import Path
from typing import Any

import aiohttp
from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeElapsedColumn, TransferSpeedColumn
from rich.table import Table

from services.demo_image import DemoImage, build_demo_image, payload_digest

HEADERS = {"X-OpenStack-Ironic-API-Version": "latest"}
REDFISH_USER, REDFISH_PASSWORD = "admin", "demo-password"
SSH_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFerrumDemoKey operator@ferrum"


class DemoError(RuntimeError):
    """A step of the demo failed; the message says which node and why."""


RETRIES = 8  # 409 (node locked for a moment) and 503 (database or conductor restarting)


async def rest_call(session: aiohttp.ClientSession, method: str, url: str, body: Any = None) -> Any:
    """One REST call, retried with backoff as openstacksdk retries: on 409 and
    on 503, honouring Retry-After."""
    delay = 0.2
    for attempt in range(RETRIES + 1):
        async with session.request(method, url, json=body, headers=HEADERS) as response:
            if response.status in (409, 503) and attempt < RETRIES:
                wait = float(response.headers.get("Retry-After") or delay)
                await asyncio.sleep(min(wait, 5.0))
                delay = min(delay * 2, 5.0)
                continue
            if response.status >= 400:
                raise DemoError(f"{method} {url} -> {response.status}: {await response.text()}")
            return await response.json() if response.status in (200, 201) else None
    raise AssertionError("unreachable")


async def wait_provision_state(session: aiohttp.ClientSession, url: str, state: str, timeout: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        node = await rest_call(session, "GET", url)
        if node["provision_state"] == state and not node["reservation"]:
            return node
        if node["provision_state"] in ("deploy failed", "clean failed", "error") and state != node["provision_state"]:
            raise DemoError(f"node {node['name']} failed in {node['provision_state']}: {node['last_error']}")
        if time.monotonic() > deadline:
            raise DemoError(
                f"node {node['name']} stuck in {node['provision_state']} (wanted {state}): {node['last_error']}"
            )
        await asyncio.sleep(0.2)


async def _publish(stack: Any, image: DemoImage) -> tuple[str, str, str]:
    """Put the image and stand-in deploy kernel/ramdisk in the object store; temp URLs for them."""
    conductor = next(s for s in stack.services if s.name == "conductor")
    store = conductor.objectstore
    if store is None:
        raise DemoError("the demo needs the stack's object store")
    await store.put_file("demo-images", "demo-disk.raw", image.path, content_type="application/octet-stream")
    # The simulator reads the kernel command line instead of running a kernel;
    # these stand-ins exist so the URLs in the boot script resolve like real ones.
    await store.put_bytes("demo-images", "ferrum-agent.kernel", b"simulated deploy kernel\n")
    await store.put_bytes("demo-images", "ferrum-agent.initramfs", b"simulated deploy ramdisk\n")
    urls = []
    for name in ("demo-disk.raw", "ferrum-agent.kernel", "ferrum-agent.initramfs"):
        urls.append(await store.temp_url("demo-images", name, lifetime=3600))
    return urls[0], urls[1], urls[2]


async def _enroll(
    session: aiohttp.ClientSession,
    api: str,
    machine: Any,
    redfish_url: str,
    kernel: str,
    ramdisk: str,
    image_url: str,
    image: DemoImage,
) -> dict[str, Any]:
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
                "redfish_address": redfish_url,
                "redfish_system_id": machine.system_path,
                "redfish_username": REDFISH_USER,
                "redfish_password": REDFISH_PASSWORD,
                "deploy_kernel": kernel,
                "deploy_ramdisk": ramdisk,
            },
            "properties": {"root_device": {"serial": machine.disk_serial}},
            "instance_info": {
                "image_source": image_url,
                "image_os_hash_algo": "sha256",
                "image_os_hash_value": image.sha256,
            },
        },
    )
    await rest_call(session, "POST", f"{api}/v1/ports", {"node_uuid": node["uuid"], "address": machine.macs[0]})
    return node


async def _provision(session: aiohttp.ClientSession, api: str, node: dict[str, Any], timings: dict[str, float]) -> None:
    url = f"{api}/v1/nodes/{node['uuid']}"
    for verb, state in (("manage", "manageable"), ("provide", "available")):
        started = time.monotonic()
        await rest_call(session, "PUT", f"{url}/states/provision", {"target": verb})
        await wait_provision_state(session, url, state, timeout=120)
        timings[verb] = time.monotonic() - started
    started = time.monotonic()
    await rest_call(
        session,
        "PUT",
        f"{url}/states/provision",
        {
            "target": "active",
            "configdrive": {
                "meta_data": {"hostname": f"{node['name']}.demo", "public_keys": {"operator": SSH_KEY}},
                "user_data": "#cloud-config\nfinal_message: provisioned by Ferrum\n",
            },
        },
    )
    timings["deploy_started"] = started


async def _watch(
    session: aiohttp.ClientSession,
    api: str,
    nodes: list[dict[str, Any]],
    image: DemoImage,
    timings: dict[str, dict[str, float]],
    console: Console,
) -> None:
    """rich progress bars fed by each node's deploy_progress until all are active."""
    columns = (
        TextColumn("{task.fields[name]:<10}"),
        TextColumn("{task.fields[state]:<15}"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=console, transient=False) as progress:
        bars = {n["uuid"]: progress.add_task("", total=image.size, name=n["name"], state="deploying") for n in nodes}
        pending = {n["uuid"] for n in nodes}
        deadline = time.monotonic() + 600
        while pending:
            for uuid in list(pending):
                node = await rest_call(session, "GET", f"{api}/v1/nodes/{uuid}")
                done = (node["driver_internal_info"].get("deploy_progress") or {}).get("bytes_written", 0)
                progress.update(bars[uuid], completed=min(done, image.size), state=node["provision_state"])
                if node["provision_state"] == "active" and not node["reservation"]:
                    progress.update(bars[uuid], completed=image.size)
                    timings[uuid]["deploy"] = time.monotonic() - timings[uuid]["deploy_started"]
                    pending.discard(uuid)
                elif node["provision_state"] == "deploy failed":
                    raise DemoError(f"node {node['name']} failed to deploy: {node['last_error']}")
            if time.monotonic() > deadline:
                raise DemoError(f"{len(pending)} nodes did not become active within 10 minutes")
            await asyncio.sleep(0.25)


async def _wait_os(machines: list[Any], timeout: float = 60) -> None:
    """Each machine power-cycles into its disk; wait until its OS has looked at it."""
    deadline = time.monotonic() + timeout
    while any(m.os_report is None for m in machines):
        if time.monotonic() > deadline:
            missing = [m.name for m in machines if m.os_report is None]
            raise DemoError(f"machines {missing} did not boot from disk")
        await asyncio.sleep(0.2)


def _config_drive_seen(machine: Any) -> str:
    """The hostname cloud-init would set from the config drive (its ``local-hostname``), or "-"."""
    report = machine.os_report or {}
    drive = report.get("config_drive") or {}
    return str(drive.get("hostname") or "-")


async def run_demo(stack: Any, *, nodes: int, simulators: list[Any]) -> None:
    """Provision ``nodes`` simulated machines through ``stack``.

    The simulator is appended to ``simulators`` for the caller to stop after
    the stack: conductors close their BMC sessions on the way down, and the
    BMCs must still be there to answer.
    """
    from services.simulator.options import SimulatorOptions
    from services.simulator.service import Simulator

    console = Console(width=None if Console().is_terminal else 110)
    api = stack.endpoints["api REST (Ironic v1)"]
    boot_url = stack.endpoints["ipxe HTTP"]
    run = secrets.randbelow(4000)
    state = Path(stack.settings.state_dir) / "demo" / f"run-{run}"
    started = time.monotonic()
    image = await asyncio.to_thread(build_demo_image, state / "images", marker=f"ferrum demo {time.ctime()}")
    # A run number in names and MACs: the embedded database outlives a demo run.
    simulator = Simulator(
        SimulatorOptions(
            machines=nodes,
            state_dir=str(state / "machines"),
            boot_url=boot_url,
            username=REDFISH_USER,
            password=REDFISH_PASSWORD,
            name_prefix=f"demo{run}-",
            first_index=run * 1000,
            disk_size=256 * 1024 * 1024,
        ).validate()
    )
    simulators.append(simulator)
    await simulator.start()
    async with aiohttp.ClientSession() as session:
        root = await rest_call(session, "GET", f"{api}/")
        console.print(
            f"\n[bold]Ferrum[/] at {api} (Ironic API {root['default_version']['min_version']}"
            f"..{root['default_version']['version']}), simulator with {nodes} Redfish machines at "
            f"{simulator.redfish_url}, boot script at {boot_url}"
        )
        image_url, kernel, ramdisk = await _publish(stack, image)
        console.print(
            f"Image: {image.path.name}, {image.size // (1024 * 1024)} MiB GPT + ext4, sha256 "
            f"{image.sha256[:16]}..., served by the object store\n"
        )
        enrolled = await asyncio.gather(
            *(
                _enroll(session, api, m, simulator.redfish_url, kernel, ramdisk, image_url, image)
                for m in simulator.machines
            )
        )
        console.print(f"Enrolled {len(enrolled)} nodes (redfish + ipxe + direct); manage, provide, deploy...")
        timings: dict[str, dict[str, float]] = {n["uuid"]: {} for n in enrolled}
        await asyncio.gather(*(_provision(session, api, n, timings[n["uuid"]]) for n in enrolled))
        await _watch(session, api, enrolled, image, timings, console)
        await _wait_os(simulator.machines)
        expected = await asyncio.to_thread(payload_digest, image.path, image)
        table = Table(title=f"{nodes} machines provisioned in {time.monotonic() - started:.1f} s")
        for column in ("node", "uuid", "state", "power", "manage", "provide", "deploy", "disk", "OS found hostname"):
            table.add_column(column, no_wrap=True)
        by_name = {m.name: m for m in simulator.machines}
        bad = []
        for node in enrolled:
            shown = await rest_call(session, "GET", f"{api}/v1/nodes/{node['uuid']}")
            machine = by_name[node["name"]]
            digest = await asyncio.to_thread(payload_digest, Path(machine.disk_path), image)
            ok = digest == expected
            if not ok:
                bad.append(node["name"])
            t = timings[node["uuid"]]
            table.add_row(
                node["name"],
                node["uuid"][:8],
                shown["provision_state"],
                shown["power_state"],
                f"{t['manage']:.1f}s",
                f"{t['provide']:.1f}s",
                f"{t['deploy']:.1f}s",
                "[green]identical[/]" if ok else "[red]DIFFERS[/]",
                _config_drive_seen(machine),
            )
        console.print(table)
        if bad:
            raise DemoError(f"disks differ from the image on {bad}")
        console.print("Every disk holds the image byte for byte; each machine's OS found its config-2 drive.")
        console.print("Tearing down: undeploy every node...")
        await asyncio.gather(
            *(
                rest_call(session, "PUT", f"{api}/v1/nodes/{n['uuid']}/states/provision", {"target": "deleted"})
                for n in enrolled
            )
        )
        await asyncio.gather(
            *(wait_provision_state(session, f"{api}/v1/nodes/{n['uuid']}", "available", 120) for n in enrolled)
        )
        powered = [m.name for m in simulator.machines if m.power_state != "Off"]
        await asyncio.gather(*(rest_call(session, "DELETE", f"{api}/v1/nodes/{n['uuid']}") for n in enrolled))
        store = next(s for s in stack.services if s.name == "conductor").objectstore
        for name in ("demo-disk.raw", "ferrum-agent.kernel", "ferrum-agent.initramfs"):
            await store.delete("demo-images", name)
        console.print(
            f"All {nodes} nodes were undeployed to available"
            + (f" (still powered: {powered})" if powered else ", powered off")
            + ", then deleted with the images."
        )
    await asyncio.to_thread(shutil.rmtree, state, True)
