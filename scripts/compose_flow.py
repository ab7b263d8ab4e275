"""The demo's deploy flow against a running compose stack, from the host (scripts/compose-demo.sh).

The stack runs in containers; this process only has what an operator outside
them has: the api's REST port, the object store's gRPC port with the internal
token (read from PostgreSQL by the caller), the simulator's status port, the
simulator's disk volume on the host, and a command that kills a conductor's
container. It

1. waits for both conductors to be alive;
2. builds the demo image and stores it (and the stand-in deploy kernel and
   ramdisk) in the object store; the temp URLs name ``objectstore:6391``, which
   the agents in the simulator's container resolve;
3. enrolls every simulated machine over REST (redfish + ipxe + direct),
   manages, provides and deploys them with a config drive, checks every disk
   byte for byte against the image and that each machine's OS read its
   hostname from the config drive, and undeploys them;
4. deploys them again, kills the conductor owning the most deploys in flight
   (``--kill-command``, ``{conductor}`` replaced by its hostname, which is its
   compose service name), and checks that the other conductor takes them over
   and finishes them, disks checked again; then undeploys and deletes the nodes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from services.common.objectstore_client import ObjectStoreClient
from services.demo import SSH_KEY, STAND_IN_KERNEL, STAND_IN_RAMDISK, rest_call, wait_provision_state
from services.demo_image import DemoImage, build_demo_image, payload_digest

CONTAINER_STATE_DIR = "/var/lib/ferrum/simulator"  # the simulator's --state-dir in deploy/docker-compose.yml
IMAGES = "compose-demo"


def writing(node: dict[str, Any]) -> bool:
    """The node's agent called back and is writing the image: the take-over resumes a write in progress.

    The kill waits for this point on purpose. A kill while a machine's ramdisk
    was still booting once left that node in "wait call-back" for good: its
    agent's first lookup came back with the token masked and the agent locked
    itself down (see the README's status, issue 24).
    """
    internal = node["driver_internal_info"] or {}
    # agent_url appears with the agent's first heartbeat, which starts the write (the direct deploy).
    return bool(node["provision_state"] == "wait call-back" and node["conductor"] and internal.get("agent_url"))


def log(message: str) -> None:
    print(f"compose-flow: {message}", flush=True)


class Flow:
    def __init__(self, args: argparse.Namespace, session: aiohttp.ClientSession, store: ObjectStoreClient) -> None:
        self.api = args.api.rstrip("/")
        self.simulator = args.simulator.rstrip("/")
        self.machines_dir = Path(args.machines_dir)
        self.kill_command: str = args.kill_command
        self.session = session
        self.store = store
        self.inventory: list[dict[str, Any]] = json.loads((self.machines_dir / "machines.json").read_text())["machines"]
        self.image: DemoImage | None = None
        self.expected = ""
        self.instance_info: dict[str, str] = {}
        self.uuids: dict[str, str] = {}  # machine name -> node uuid

    async def call(self, method: str, path: str, body: Any = None) -> Any:
        return await rest_call(self.session, method, self.api + path, body)

    async def wait_conductors(self, count: int, timeout: float = 60) -> list[str]:
        deadline = time.monotonic() + timeout
        while True:
            listed = (await self.call("GET", "/v1/conductors?detail=True"))["conductors"]
            alive = sorted(c["hostname"] for c in listed if c["alive"])
            if len(alive) >= count:
                return alive
            if time.monotonic() > deadline:
                raise AssertionError(f"{len(alive)} conductors alive after {timeout} s, wanted {count}: {listed}")
            await asyncio.sleep(0.5)

    async def publish(self, work: Path) -> tuple[str, str, str]:
        self.image = await asyncio.to_thread(build_demo_image, work / "images", size_mib=128, marker="compose demo")
        self.expected = await asyncio.to_thread(payload_digest, self.image.path, self.image)
        await self.store.put_file(IMAGES, "disk.raw", self.image.path, via="grpc")
        await self.store.put_bytes(IMAGES, "agent.kernel", STAND_IN_KERNEL)
        await self.store.put_bytes(IMAGES, "agent.initramfs", STAND_IN_RAMDISK)
        return (
            await self.store.temp_url(IMAGES, "disk.raw", lifetime=7200),
            await self.store.temp_url(IMAGES, "agent.kernel", lifetime=7200),
            await self.store.temp_url(IMAGES, "agent.initramfs", lifetime=7200),
        )

    async def enroll(self, machine: dict[str, Any], image_url: str, kernel: str, ramdisk: str) -> str:
        assert self.image is not None
        self.instance_info = {
            "image_source": image_url,
            "image_os_hash_algo": "sha256",
            "image_os_hash_value": self.image.sha256,
        }
        node = await self.call(
            "POST",
            "/v1/nodes",
            {
                "name": machine["name"],
                "driver": "redfish",
                "boot_interface": "ipxe",
                "deploy_interface": "direct",
                "resource_class": "baremetal",
                "driver_info": {**machine["driver_info"], "deploy_kernel": kernel, "deploy_ramdisk": ramdisk},
                "properties": {"root_device": {"serial": machine["disk_serial"]}},
                "instance_info": self.instance_info,
            },
        )
        await self.call("POST", "/v1/ports", {"node_uuid": node["uuid"], "address": machine["macs"][0]})
        for verb, state in (("manage", "manageable"), ("provide", "available")):
            await self.call("PUT", f"/v1/nodes/{node['uuid']}/states/provision", {"target": verb})
            await wait_provision_state(self.session, f"{self.api}/v1/nodes/{node['uuid']}", state, timeout=300)
        return str(node["uuid"])

    async def deploy(self, uuid: str, hostname: str) -> None:
        await self.call(
            "PUT",
            f"/v1/nodes/{uuid}/states/provision",
            {
                "target": "active",
                "configdrive": {
                    "meta_data": {"hostname": hostname, "public_keys": {"operator": SSH_KEY}},
                    "user_data": "#cloud-config\nfinal_message: provisioned by Ferrum in containers\n",
                },
            },
        )

    async def wait_all(self, state: str, timeout: float) -> None:
        await asyncio.gather(
            *(
                wait_provision_state(self.session, f"{self.api}/v1/nodes/{uuid}", state, timeout=timeout)
                for uuid in self.uuids.values()
            )
        )

    def host_path(self, container_path: str) -> Path:
        return self.machines_dir / Path(container_path).relative_to(CONTAINER_STATE_DIR)

    async def os_hostname(self, name: str, timeout: float = 120) -> str:
        """The hostname the machine's OS read from its config drive, once it booted from disk."""
        deadline = time.monotonic() + timeout
        while True:
            async with self.session.get(f"{self.simulator}/simulator/machines/{name}") as response:
                report = (await response.json()).get("os_report") or {}
            drive = report.get("config_drive") or {}
            if drive.get("hostname"):
                return str(drive["hostname"])
            if time.monotonic() > deadline:
                raise AssertionError(f"{name} did not boot an OS that read a config drive: {report}")
            await asyncio.sleep(0.5)

    async def verify(self, suffix: str) -> None:
        """Every disk holds the image's payload; every OS found its hostname on the config drive."""
        assert self.image is not None
        for machine in self.inventory:
            digest = await asyncio.to_thread(payload_digest, self.host_path(machine["disk_path"]), self.image)
            assert digest == self.expected, f"{machine['name']}: the disk differs from the image"
            hostname = await self.os_hostname(machine["name"])
            assert hostname == f"{machine['name']}.{suffix}", f"{machine['name']}: config drive says {hostname}"
        log(f"{len(self.inventory)} disks identical to the image; each OS read its hostname (*.{suffix})")

    async def undeploy(self) -> None:
        for uuid in self.uuids.values():
            await self.call("PUT", f"/v1/nodes/{uuid}/states/provision", {"target": "deleted"})
        await self.wait_all("available", timeout=600)

    async def takeover(self) -> None:
        """Deploy everything, kill the busiest conductor mid-flight, the survivor finishes the deploys."""
        for name, uuid in self.uuids.items():
            # Undeploying cleared instance_info, as in Ironic: the image is named again.
            await self.call(
                "PATCH",
                f"/v1/nodes/{uuid}",
                [
                    {"op": "add", "path": f"/instance_info/{key}", "value": value}
                    for key, value in self.instance_info.items()
                ],
            )
            await self.deploy(uuid, f"{name}.takeover")
        deadline = time.monotonic() + 120
        while True:
            owners: dict[str, list[str]] = {}
            for name, uuid in self.uuids.items():
                node = await self.call("GET", f"/v1/nodes/{uuid}")
                if writing(node):
                    owners.setdefault(node["conductor"], []).append(name)
            if owners:
                break
            assert time.monotonic() < deadline, "no image write was ever in flight"
            await asyncio.sleep(0.1)
        victim, nodes = max(owners.items(), key=lambda item: len(item[1]))
        command = shlex.split(self.kill_command.format(conductor=victim))
        log(
            f"killing {victim}, which owns {len(nodes)} image writes in progress ({', '.join(nodes)}): {' '.join(command)}"
        )
        killed = time.monotonic()
        await asyncio.to_thread(subprocess.run, command, check=True, capture_output=True, timeout=60)
        await self.wait_all("active", timeout=600)
        log(f"every node active {time.monotonic() - killed:.1f} s after the kill")
        for name in nodes:
            node = await self.call("GET", f"/v1/nodes/{self.uuids[name]}")
            assert node["conductor"] != victim, f"{name} still maps to the dead {victim}"
        survivors = await self.wait_conductors(1)
        assert victim not in survivors, f"{victim} is still listed alive after being killed"
        log(f"{victim} is gone from the live conductors ({survivors}); its nodes moved to the survivor")
        await self.verify("takeover")


async def run(args: argparse.Namespace) -> None:
    token = Path(args.token_file).read_text().strip()
    store = ObjectStoreClient(args.objectstore, token=token)
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
            flow = Flow(args, session, store)
            started = time.monotonic()
            alive = await flow.wait_conductors(2)
            log(f"conductors alive: {alive}; {len(flow.inventory)} simulated machines")
            image_url, kernel, ramdisk = await flow.publish(Path(args.work))
            assert flow.image is not None
            log(f"image {flow.image.size // 2**20} MiB stored in the object store: {image_url.split('?')[0]}")
            uuids = await asyncio.gather(*(flow.enroll(m, image_url, kernel, ramdisk) for m in flow.inventory))
            flow.uuids = {m["name"]: u for m, u in zip(flow.inventory, uuids, strict=True)}
            log(f"{len(uuids)} nodes enrolled, managed and provided ({time.monotonic() - started:.1f} s)")
            deploy_started = time.monotonic()
            for name, uuid in flow.uuids.items():
                await flow.deploy(uuid, f"{name}.demo")
            await flow.wait_all("active", timeout=600)
            log(f"{len(uuids)} nodes active in {time.monotonic() - deploy_started:.1f} s")
            await flow.verify("demo")
            undeploy_started = time.monotonic()
            await flow.undeploy()
            log(f"undeployed and cleaned to available in {time.monotonic() - undeploy_started:.1f} s")
            await flow.takeover()
            await flow.undeploy()
            for uuid in flow.uuids.values():
                await flow.call("DELETE", f"/v1/nodes/{uuid}")
            for name in ("disk.raw", "agent.kernel", "agent.initramfs"):
                await store.delete(IMAGES, name)
            log(f"nodes undeployed and deleted; the whole flow took {time.monotonic() - started:.1f} s")
    finally:
        await store.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--api", required=True, help="the api's REST URL on the host")
    parser.add_argument("--objectstore", required=True, help="the object store's gRPC address on the host")
    parser.add_argument("--token-file", required=True, help="file holding the internal gRPC token")
    parser.add_argument("--simulator", required=True, help="the simulator's HTTP URL on the host")
    parser.add_argument("--machines-dir", required=True, help="the simulator's state volume, as the host sees it")
    parser.add_argument("--work", required=True, help="a scratch directory for the image")
    parser.add_argument("--kill-command", required=True, help="kills a conductor; {conductor} is its hostname")
    asyncio.run(run(parser.parse_args()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
