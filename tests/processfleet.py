"""Ferrum as operators run it at scale, for fault tests and bench/takeover.py.

PostgreSQL (its own embedded server, so a test may restart it), api, N
conductors, the iPXE renderer, the object store and the simulator each run as
a separate process on 127.0.0.1 ephemeral ports; the caller gets their PIDs
to kill and helpers to enroll and deploy the simulator's machines over REST
with the demo's image and a config drive.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg

from services.common.db import migrate
from services.common.db.embedded import EmbeddedPostgres
from services.common.db.service_secrets import SecretRepository
from services.common.internal_token import SECRET_NAME as INTERNAL_TOKEN
from services.common.objectstore_client import ObjectStoreClient
from services.demo_image import DemoImage, build_demo_image

ROOT = Path(__file__).resolve().parents[1]
HEADERS = {"X-OpenStack-Ironic-API-Version": "1.78"}
IMAGES = "fleet-images"
FAILED_STATES = ("deploy failed", "clean failed", "inspect failed", "rescue failed", "service failed", "error")


@dataclasses.dataclass
class Process:
    name: str
    popen: subprocess.Popen[bytes]
    ports: dict[str, str]
    log: Path

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None


class ProcessFleet:
    def __init__(
        self,
        work: Path,
        *,
        machines: int,
        conductors: Sequence[str] = ("c1", "c2"),
        power_delay: str = "0",
        image_mib: int = 64,
        disk_size: str = "512MiB",
        log_level: str = "WARNING",
        env: dict[str, str] | None = None,
        deploy_interface: str = "direct",
    ) -> None:
        self.work = work
        self.deploy_interface = deploy_interface
        self.machines = machines
        self.conductor_names = tuple(conductors)
        self.power_delay = power_delay
        self.image_mib = image_mib
        self.disk_size = disk_size
        self.log_level = log_level
        self.extra_env = dict(env or {})
        self.pg = EmbeddedPostgres(work / "pg", fsync=False)
        self.database_url = ""
        self.processes: dict[str, Process] = {}
        self.api = ""
        self.inventory: list[dict[str, Any]] = []
        self.image: DemoImage | None = None
        self.pool: asyncpg.Pool | None = None

    # -- start and stop ------------------------------------------------------------

    async def start(self) -> None:
        self.work.mkdir(parents=True, exist_ok=True)
        os.chmod(self.work, 0o755)
        await asyncio.to_thread(self.pg.start)
        await asyncio.to_thread(self.pg.ensure_database, "ferrum")
        self.database_url = self.pg.database_url("ferrum")
        await migrate.upgrade(self.database_url)
        self.pool = await asyncpg.create_pool(self.database_url, min_size=1, max_size=4)
        await self._spawn("objectstore", ["objectstore", "--grpc-port", "0", "--http-port", "0"])
        for name in self.conductor_names:
            await self.start_conductor(name)
        api = await self._spawn("api", ["api", "--port", "0", "--grpc-port", "0"])
        self.api = api.ports["api REST (Ironic v1)"]
        ipxe = await self._spawn("ipxe", ["ipxe", "--port", "0", "--grpc-port", "0"], FERRUM_IPXE_API_URL=self.api)
        boot_url = ipxe.ports["ipxe HTTP"]
        await self._spawn(
            "simulator",
            [
                "simulator",
                "--machines",
                str(self.machines),
                "--state-dir",
                str(self.work / "simulator"),
                "--port",
                "0",
                "--disk-size",
                self.disk_size,
                "--boot-url",
                boot_url,
                "--power-delay",
                self.power_delay,
            ],
        )
        self.inventory = json.loads((self.work / "simulator" / "machines.json").read_text())["machines"]
        self.image = await asyncio.to_thread(build_demo_image, self.work / "image", size_mib=self.image_mib)
        # The internal token every process generated and shares through PostgreSQL.
        token = await SecretRepository(self.pool).get_or_create(INTERNAL_TOKEN)
        self._objectstore = ObjectStoreClient(self.processes["objectstore"].ports["objectstore gRPC"], token=token)

    async def start_conductor(self, name: str) -> None:
        """Start conductor ``name`` (again, after a kill: it rejoins under the same hostname)."""
        objectstore = self.processes["objectstore"].ports["objectstore gRPC"]
        await self._spawn(
            name,
            ["conductor", "--hostname", name, "--grpc-port", "0", "--metrics-port", "0"],
            FERRUM_CONDUCTOR_OBJECTSTORE_ADDRESS=objectstore,
        )

    def _env(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("FERRUM_")}
        env.update(
            PYTHONPATH=str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else ""),
            FERRUM_DATABASE_URL=self.database_url,
            FERRUM_STATE_DIR=str(self.work / "state"),
            FERRUM_LOG_LEVEL=self.log_level,
            **self.extra_env,
            **extra,
        )
        return env

    async def _spawn(self, name: str, args: list[str], **env: str) -> Process:
        ports = self.work / f"{name}.ports.json"
        log = self.work / f"{name}.log"
        with open(log, "ab") as out:
            popen = subprocess.Popen(
                [sys.executable, "-m", "services.cli", *args, "--ports-file", str(ports)],
                cwd=ROOT,
                env=self._env(**env),
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + 120
        while not (ports.exists() and ports.read_text()):
            if popen.poll() is not None:
                raise RuntimeError(f"{name} exited ({popen.returncode}): {log.read_text()[-3000:]}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{name} did not start within 120 s: {log.read_text()[-3000:]}")
            await asyncio.sleep(0.05)
        process = Process(name, popen, json.loads(ports.read_text()), log)
        self.processes[name] = process
        return process

    def kill(self, name: str) -> None:
        """SIGKILL, as a crash or the kernel's OOM killer would."""
        process = self.processes[name]
        process.popen.send_signal(signal.SIGKILL)
        process.popen.wait(10)

    async def restart_database(self) -> None:
        """PostgreSQL stops (fast: every session ends) and starts again on the same port."""
        await asyncio.to_thread(self.pg.stop)
        await asyncio.to_thread(self.pg.start)

    async def stop(self) -> None:
        if getattr(self, "_objectstore", None) is not None:
            await self._objectstore.close()
        if self.pool is not None:
            await self.pool.close()
        for process in reversed(list(self.processes.values())):
            if process.alive():
                process.popen.send_signal(signal.SIGTERM)
        for process in self.processes.values():
            try:
                process.popen.wait(20)
            except subprocess.TimeoutExpired:
                process.popen.kill()
                process.popen.wait(5)
        await asyncio.to_thread(self.pg.stop)

    # -- REST ------------------------------------------------------------------------

    async def call(self, session: aiohttp.ClientSession, method: str, path: str, body: Any = None) -> Any:
        """One REST call; 409 (locked) and 503 (restarting) are retried as clients do."""
        for attempt in range(600):
            async with session.request(method, self.api + path, json=body, headers=HEADERS) as r:
                if r.status in (409, 503):
                    await asyncio.sleep(min(0.1 * (attempt + 1), 1.0))
                    continue
                text = await r.text()
                if r.status >= 400:
                    raise AssertionError(f"{method} {path}: {r.status} {text}")
                return json.loads(text) if text else None
        raise AssertionError(f"{method} {path} kept answering 409/503")

    async def publish_image(self) -> tuple[str, str, str]:
        """The image and stand-in deploy kernel/ramdisk in the object store, as temp URLs."""
        assert self.image is not None
        store = self._objectstore
        await store.put_file(IMAGES, "disk.raw", self.image.path, content_type="application/octet-stream")
        await store.put_bytes(IMAGES, "agent.kernel", b"simulated deploy kernel\n")
        await store.put_bytes(IMAGES, "agent.initramfs", b"simulated deploy ramdisk\n")
        return (
            await store.temp_url(IMAGES, "disk.raw", lifetime=7200),
            await store.temp_url(IMAGES, "agent.kernel", lifetime=7200),
            await store.temp_url(IMAGES, "agent.initramfs", lifetime=7200),
        )

    async def enroll_all(self, session: aiohttp.ClientSession) -> list[str]:
        """Every machine enrolled with redfish + ipxe + direct, managed and provided."""
        assert self.image is not None
        image_url, kernel, ramdisk = await self.publish_image()

        async def one(machine: dict[str, Any]) -> str:
            node = await self.call(
                session,
                "POST",
                "/v1/nodes",
                {
                    "name": machine["name"],
                    "driver": "redfish",
                    "boot_interface": "ipxe",
                    "deploy_interface": self.deploy_interface,
                    "driver_info": {**machine["driver_info"], "deploy_kernel": kernel, "deploy_ramdisk": ramdisk},
                    "properties": {"root_device": {"serial": machine["disk_serial"]}},
                    "instance_info": {
                        "image_source": image_url,
                        "image_os_hash_algo": "sha256",
                        "image_os_hash_value": self.image.sha256,  # type: ignore[union-attr]
                    },
                },
            )
            await self.call(session, "POST", "/v1/ports", {"node_uuid": node["uuid"], "address": machine["macs"][0]})
            for verb, state in (("manage", "manageable"), ("provide", "available")):
                await self.call(session, "PUT", f"/v1/nodes/{node['uuid']}/states/provision", {"target": verb})
                await self.wait_state(session, [node["uuid"]], state, timeout=120)
            return str(node["uuid"])

        return list(await asyncio.gather(*(one(m) for m in self.inventory)))

    async def deploy(self, session: aiohttp.ClientSession, node_uuid: str, hostname: str) -> None:
        await self.call(
            session,
            "PUT",
            f"/v1/nodes/{node_uuid}/states/provision",
            {
                "target": "active",
                "configdrive": {"meta_data": {"hostname": hostname}, "user_data": "#cloud-config\n"},
            },
        )

    async def wait_state(
        self, session: aiohttp.ClientSession, uuids: Sequence[str], state: str, *, timeout: float
    ) -> None:
        """Until every node is in ``state`` and unlocked; fails at once on a failure state."""
        deadline = time.monotonic() + timeout
        pending = set(uuids)
        while pending:
            for uuid in list(pending):
                node = await self.call(session, "GET", f"/v1/nodes/{uuid}")
                if node["provision_state"] == state and node["reservation"] is None:
                    pending.discard(uuid)
                elif node["provision_state"] in FAILED_STATES:
                    raise AssertionError(f"{node['name']}: {node['provision_state']}: {node['last_error']}")
            if pending:
                if time.monotonic() > deadline:
                    raise AssertionError(
                        f"{len(pending)} nodes not {state} after {timeout} s: "
                        + "; ".join([await self._describe(session, uuid) for uuid in sorted(pending)])
                    )
                await asyncio.sleep(0.5)

    async def _describe(self, session: aiohttp.ClientSession, uuid: str) -> str:
        """What a stuck node looks like, so a failure names where its flow stopped."""
        node = await self.call(session, "GET", f"/v1/nodes/{uuid}")
        internal = node.get("driver_internal_info") or {}
        try:
            history = await self.call(session, "GET", f"/v1/nodes/{uuid}/history?detail=True")
            recent = [f"{h.get('event_type')}:{h.get('event')}" for h in (history.get("history") or [])[-4:]]
        except AssertionError as exc:  # the description must not hide the failure it describes
            recent = [f"history unavailable: {exc}"]
        return (
            f"{node['name']} {node['provision_state']} (target {node['target_provision_state']}, "
            f"power {node['power_state']}, reservation {node['reservation']}, conductor {node.get('conductor')}, "
            f"last_error {node['last_error']!r}, internal keys {sorted(internal)}, history {recent})"
        )

    def disk_matches_image(self, machine: dict[str, Any]) -> bool:
        """The image's payload (its partition, whose bytes no deploy step changes) is on the disk."""
        assert self.image is not None
        start, end = self.image.payload_start, self.image.payload_end
        with open(machine["disk_path"], "rb") as disk, open(self.image.path, "rb") as image:
            disk.seek(start)
            image.seek(start)
            remaining = end - start
            while remaining:
                count = min(remaining, 8 * 1024 * 1024)
                if disk.read(count) != image.read(count):
                    return False
                remaining -= count
        return True
