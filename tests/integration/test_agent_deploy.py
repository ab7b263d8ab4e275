"""The deploy agent against a real HTTP image server and a tiny Ironic-style
api written here (lookup + heartbeat recorder; the real api's endpoints are
exercised end to end in test_direct_deploy.py). Images are written byte for
byte onto sparse disk files; qcow2 images are made with Debian's qemu-img."""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import hashlib
import os
import subprocess
import time
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from services.agent.agent import Agent, AgentOptions, Disk
from services.common.aiohttp_serving import start_http_site

MiB = 1024 * 1024
GiB = 1024 * MiB
TOKEN = "t" * 43


class FakeIronic:
    """Lookup answers for registered MACs (404 otherwise); heartbeats are recorded."""

    def __init__(self) -> None:
        self.nodes: dict[str, dict[str, Any]] = {}  # mac -> node
        self.heartbeats: list[tuple[str, dict[str, Any], str]] = []
        self.lookups = 0
        self.heartbeat_timeout = 300

    def register(self, mac: str, **properties: Any) -> dict[str, Any]:
        node = {
            "uuid": str(uuid.uuid4()),
            "properties": properties,
            "instance_info": {},
            "driver_internal_info": {},
            "links": [],
        }
        self.nodes[mac] = node
        return node

    async def root(self, request: web.Request) -> web.Response:
        return web.json_response(
            {"default_version": {"version": "1.99"}}, headers={"X-OpenStack-Ironic-API-Maximum-Version": "1.99"}
        )

    async def lookup(self, request: web.Request) -> web.Response:
        self.lookups += 1
        for mac in request.query.get("addresses", "").split(","):
            if mac in self.nodes:
                return web.json_response(
                    {
                        "node": self.nodes[mac],
                        "config": {
                            "agent_token": TOKEN,
                            "agent_token_required": True,
                            "heartbeat_timeout": self.heartbeat_timeout,
                        },
                    }
                )
        return web.json_response({"error_message": "not found"}, status=404)

    async def heartbeat(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.heartbeats.append(
            (request.match_info["node"], body, request.headers.get("X-OpenStack-Ironic-API-Version", ""))
        )
        if body.get("agent_token") != TOKEN:
            return web.json_response({"error_message": "Invalid or missing agent token"}, status=400)
        return web.Response(status=202)

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/", self.root)
        app.router.add_get("/v1/lookup", self.lookup)
        app.router.add_post("/v1/heartbeat/{node}", self.heartbeat)
        return app


class ImageServer:
    """Static files with Range support, plus faults: drop a connection after N
    bytes once, or trickle bytes slowly."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.requests: list[tuple[str, str | None]] = []
        self.drop_after: dict[str, list[int | None]] = {}  # per request, in order: drop after N bytes
        self.trickle: dict[str, float] = {}  # name -> seconds per MiB
        self.chunked: set[str] = set()  # no Content-Length: the agent's aiohttp path
        self.ignore_range: set[str] = set()  # always 200 with the whole file

    async def serve(self, request: web.Request) -> web.StreamResponse:
        name = request.match_info["name"]
        self.requests.append((name, request.headers.get("Range")))
        path = self.root / name
        if not path.is_file():
            raise web.HTTPNotFound()
        size = path.stat().st_size
        start, status, headers = 0, 200, {}
        rng = request.headers.get("Range")
        if rng and name not in self.ignore_range:
            start = int(rng.removeprefix("bytes=").split("-")[0])
            status = 206
            headers["Content-Range"] = f"bytes {start}-{size - 1}/{size}"
        resp = web.StreamResponse(status=status, headers=headers)
        if name in self.chunked:
            resp.enable_chunked_encoding()
        else:
            resp.content_length = size - start
        await resp.prepare(request)
        drops = self.drop_after.get(name) or [None]
        drop = drops.pop(0)
        step = 256 * 1024
        with open(path, "rb") as fh:  # streamed from the file: many agents at once stay cheap
            fh.seek(start)
            sent = 0
            while chunk := fh.read(step):
                if drop is not None and sent >= drop:
                    assert request.transport is not None
                    request.transport.abort()  # mid-body: the client sees a truncated payload
                    return resp
                await resp.write(chunk)
                sent += len(chunk)
                if name in self.trickle:
                    await asyncio.sleep(self.trickle[name] * step / MiB)
        await resp.write_eof()
        return resp

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/{name}", self.serve)
        return app


@pytest.fixture
async def env(tmp_path: Path) -> AsyncIterator[dict[str, Any]]:
    async with agent_env(tmp_path) as running:
        yield running


@contextlib.asynccontextmanager
async def agent_env(tmp_path: Path) -> AsyncIterator[dict[str, Any]]:
    ironic, images = FakeIronic(), ImageServer(tmp_path)
    api_runner, api_port = await start_http_site(ironic.app(), "127.0.0.1", 0)
    img_runner, img_port = await start_http_site(images.app(), "127.0.0.1", 0)
    agents: list[Agent] = []
    session = aiohttp.ClientSession()

    def make_agent(*disks: Disk, mac: str = "52:54:00:00:00:01", **kw: Any) -> Agent:
        options = AgentOptions(
            api_url=f"http://127.0.0.1:{api_port}",
            macs=(mac,),
            disks=disks,
            lookup_interval=0.05,
            heartbeat_interval=kw.pop("heartbeat_interval", 0.2),
            tmp_dir=str(tmp_path),
            **kw,
        )
        agent = Agent(options)
        agents.append(agent)
        return agent

    try:
        yield {
            "ironic": ironic,
            "images": images,
            "tmp": tmp_path,
            "session": session,
            "make_agent": make_agent,
            "image_base": f"http://127.0.0.1:{img_port}",
            "ironic_url": f"http://127.0.0.1:{api_port}",
        }
    finally:
        for agent in agents:
            await agent.stop()
        await session.close()
        await api_runner.cleanup()
        await img_runner.cleanup()


def make_disk(tmp: Path, name: str, size: int) -> Path:
    path = tmp / name
    with open(path, "wb") as fh:
        fh.truncate(size)  # sparse
    return path


def make_raw_image(tmp: Path, name: str, size: int, *, seed: int = 1) -> bytes:
    """A GPT-partitioned image with non-zero data (so byte-exact checks mean something)."""
    path = tmp / name
    with open(path, "wb") as fh:
        fh.truncate(size)
    subprocess.run(
        ["sgdisk", "-n", "1:2048:+1M", "-t", "1:ef00", "-n", "2:0:0", str(path)], check=True, capture_output=True
    )
    data = bytearray(path.read_bytes())
    block = hashlib.sha512(str(seed).encode()).digest() * 64
    for off in range(3 * MiB, size - 64 * 1024, 512 * 1024):
        data[off : off + len(block)] = block
    path.write_bytes(bytes(data))
    return bytes(data)


def read_head(path: Path, size: int) -> bytes:
    with open(path, "rb") as fh:
        return fh.read(size)


async def started(agent: Agent, ironic: FakeIronic, *, heartbeats: int = 1, timeout: float = 20) -> Agent:
    if not ironic.nodes:
        ironic.register(agent.options.macs[0])
    await agent.start()
    await wait_for(lambda: agent.heartbeats_sent >= heartbeats, timeout, "heartbeats")
    return agent


async def wait_for(check: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)


async def command(
    env: dict[str, Any],
    agent: Agent,
    name: str,
    params: dict[str, Any],
    *,
    wait: bool = False,
    token: str | None = TOKEN,
    expect: int = 200,
) -> dict[str, Any]:
    query = {"wait": "true" if wait else "false"}
    if token is not None:
        query["agent_token"] = token
    async with env["session"].post(
        f"{agent.callback_url}/v1/commands/", params=query, json={"name": name, "params": params}
    ) as resp:
        body = await resp.json()
        assert resp.status == expect, body
        return body


async def finished(env: dict[str, Any], agent: Agent, command_id: str, timeout: float = 60) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        async with env["session"].get(
            f"{agent.callback_url}/v1/commands/{command_id}", params={"agent_token": TOKEN}
        ) as resp:
            body = await resp.json()
        if body["command_status"] != "RUNNING":
            return body
        assert time.monotonic() < deadline, f"command still running: {body}"
        await asyncio.sleep(0.05)


def image_info(env: dict[str, Any], name: str, data: bytes, **extra: Any) -> dict[str, Any]:
    info = {
        "id": name,
        "urls": [f"{env['image_base']}/{name}"],
        "disk_format": None,
        "os_hash_algo": "sha256",
        "os_hash_value": hashlib.sha256(data).hexdigest(),
    }
    info.update(extra)
    return info


async def test_lookup_retries_until_known_then_heartbeats(env):
    ironic: FakeIronic = env["ironic"]
    agent = env["make_agent"](Disk(str(make_disk(env["tmp"], "d", 8 * MiB))), global_request_id="req-abc")
    await agent.start()
    await wait_for(lambda: ironic.lookups >= 3, 10, "lookups")
    assert agent.node_uuid is None and agent.heartbeats_sent == 0  # 404 = not yet
    node = ironic.register("52:54:00:00:00:01")
    await wait_for(lambda: agent.heartbeats_sent >= 3, 10, "heartbeats")
    assert agent.node_uuid == node["uuid"] and agent.last_error is None
    node_uuid, body, version = ironic.heartbeats[0]
    assert node_uuid == node["uuid"] and version == "1.68"  # min(server max 1.99, 1.68)
    assert body == {"callback_url": agent.callback_url, "agent_version": body["agent_version"], "agent_token": TOKEN}
    async with env["session"].get(f"{agent.callback_url}/v1/status") as resp:
        assert set(await resp.json()) == {"started_at", "version"}


async def test_lookup_gives_up_after_timeout(env):
    agent = env["make_agent"](Disk(str(make_disk(env["tmp"], "d", MiB))), lookup_timeout=0.3)
    await agent.start()
    await wait_for(lambda: agent.last_error is not None, 10, "lookup timeout")
    assert "lookup failed" in agent.last_error and agent.node_uuid is None


async def test_heartbeat_interval_follows_ipa_from_heartbeat_timeout(env):
    ironic: FakeIronic = env["ironic"]
    ironic.heartbeat_timeout = 10
    agent = env["make_agent"](Disk(str(make_disk(env["tmp"], "d", MiB))), heartbeat_interval=None)
    await started(agent, ironic)
    intervals = [agent._heartbeat_interval() for _ in range(200)]
    assert min(intervals) >= 5.0 and max(intervals) <= 6.0  # 10 s x [0.3, 0.6], at least 5 s


async def test_token_and_request_errors(env):
    agent = await started(env["make_agent"](Disk(str(make_disk(env["tmp"], "d", MiB)))), env["ironic"])
    session = env["session"]
    for params in ({}, {"agent_token": "wrong"}):
        async with session.get(f"{agent.callback_url}/v1/commands/", params=params) as resp:
            assert resp.status == 401 and (await resp.json()) == {
                "faultcode": "Client",
                "faultstring": "Token invalid.",
            }
    body = await command(env, agent, "standby.sync", {}, token="x" * 43, expect=401)
    assert body["faultstring"] == "Token invalid."
    async with session.get(f"{agent.callback_url}/commands/", params={"agent_token": TOKEN}) as resp:
        assert resp.status == 200 and (await resp.json()) == {"commands": []}
    async with session.post(
        f"{agent.callback_url}/v1/commands/", params={"agent_token": TOKEN}, json={"name": "x"}
    ) as resp:
        assert resp.status == 400 and "params" in (await resp.json())["faultstring"]
    assert "Unknown command" in (await command(env, agent, "nope.nothing", {}, expect=404))["faultstring"]
    bad = await command(env, agent, "standby.prepare_image", {"image_info": {"urls": ["http://x/y"]}}, expect=400)
    assert "'id'" in bad["faultstring"]
    md5 = {"id": "a", "urls": ["http://x/a"], "checksum": "0" * 32}
    assert "MD5" in (await command(env, agent, "standby.prepare_image", {"image_info": md5}, expect=400))["faultstring"]
    async with session.get(f"{agent.callback_url}/v1/commands/", params={"agent_token": TOKEN}) as resp:
        assert (await resp.json()) == {"commands": []}  # refused commands left nothing behind


async def test_raw_image_streamed_byte_exact_with_progress_in_heartbeats(env):
    tmp, images = env["tmp"], env["images"]
    data = make_raw_image(tmp, "disk.raw", 12 * MiB)
    images.trickle["disk.raw"] = (
        0.2  # ~2.4 s for the whole image (4 MiB direct-I/O buffers), so heartbeats see it in flight
    )
    disk = make_disk(tmp, "sda.img", 64 * MiB)
    agent = await started(
        env["make_agent"](Disk(str(disk)), heartbeat_interval=10, progress_heartbeat_interval=0.1), env["ironic"]
    )
    result = await command(env, agent, "standby.prepare_image", {"image_info": image_info(env, "disk.raw", data)})
    assert result["command_status"] == "RUNNING" and result["command_name"] == "prepare_image"
    done = await finished(env, agent, result["id"])
    assert done["command_status"] == "SUCCEEDED", done
    assert done["command_result"].startswith("image (disk.raw) written to device /dev/sda root_uuid=")
    assert done["deploy_progress"]["bytes_written"] == len(data) and done["deploy_progress"]["stage"] == "done"
    assert os.path.getsize(disk) == 64 * MiB  # written in place, not truncated
    with open(disk, "rb") as fh:
        assert fh.read(len(data)) == data
        assert fh.read(MiB) == b"\0" * MiB
    progress = [b["deploy_progress"] for _, b, _ in env["ironic"].heartbeats if "deploy_progress" in b]
    assert any(0 < p["bytes_written"] < len(data) and p["stage"] == "writing" for p in progress), progress
    await wait_for(
        lambda: any(b.get("deploy_progress", {}).get("stage") == "done" for _, b, _ in env["ironic"].heartbeats),
        5,
        "a heartbeat right after the command finished",
    )
    uuids = await command(env, agent, "standby.get_partition_uuids", {})
    sfdisk = subprocess.run(["sfdisk", "--json", str(disk)], check=True, capture_output=True, text=True).stdout
    assert uuids["command_result"]["root uuid"] in sfdisk.lower()
    assert uuids["command_result"]["efi system partition uuid"] is not None
    assert set(uuids["command_result"]["partitions"]) == {"/dev/sda1", "/dev/sda2"}


@pytest.mark.parametrize(
    "method, compress", [("qcow2-stream", False), ("qcow2-stream", True), ("qcow2-qemu-img", True)]
)
async def test_qcow2_image_converted_byte_exact_through_deploy_step(env, method, compress):
    tmp = env["tmp"]
    data = make_raw_image(tmp, "src.raw", 16 * MiB, seed=7)
    subprocess.run(
        [
            "qemu-img",
            "convert",
            "-f",
            "raw",
            "-O",
            "qcow2",
            *(["-c"] if compress else []),
            str(tmp / "src.raw"),
            str(tmp / "disk.qcow2"),
        ],
        check=True,
    )
    qcow = (tmp / "disk.qcow2").read_bytes()
    disk = make_disk(tmp, "sda.img", 32 * MiB)
    with open(disk, "r+b") as fh:  # a previous deployment's leftovers must be overwritten
        fh.write(b"\xff" * 20 * MiB)
    agent = await started(
        env["make_agent"](
            Disk(str(disk)), conversion_slots=asyncio.Semaphore(1), qcow2_stream=method == "qcow2-stream"
        ),
        env["ironic"],
    )
    step = {
        "interface": "deploy",
        "step": "write_image",
        "priority": 80,
        "args": {"image_info": image_info(env, "disk.qcow2", qcow, disk_format="qcow2"), "configdrive": None},
    }
    done = await command(env, agent, "deploy.execute_deploy_step", {"step": step, "node": {}, "ports": []}, wait=True)
    assert done["command_status"] == "SUCCEEDED", done
    assert done["command_result"]["deploy_step"] == step
    assert done["deploy_progress"]["method"] == method
    assert done["deploy_progress"]["bytes_written"] == len(data) == done["deploy_progress"]["total"]
    with open(disk, "rb") as fh:
        assert fh.read(len(data)) == data  # zeros of the image included: the 0xff leftovers are gone
        assert fh.read(MiB) == b"\xff" * MiB  # past the image: untouched
    assert os.path.getsize(disk) == 32 * MiB
    assert not list(tmp.glob("ferrum-agent-*"))  # no staged file or spool left behind


async def test_format_mismatch_and_backing_file_refused(env):
    tmp = env["tmp"]
    data = make_raw_image(tmp, "plain.raw", 4 * MiB)
    subprocess.run(
        ["qemu-img", "create", "-f", "qcow2", "-F", "raw", "-b", str(tmp / "plain.raw"), str(tmp / "backed.qcow2")],
        check=True,
        capture_output=True,
    )
    backed = (tmp / "backed.qcow2").read_bytes()
    agent = await started(env["make_agent"](Disk(str(make_disk(tmp, "sda.img", 8 * MiB)))), env["ironic"])
    done = await command(
        env,
        agent,
        "standby.prepare_image",
        {"image_info": image_info(env, "plain.raw", data, disk_format="qcow2")},
        wait=True,
    )
    assert done["command_status"] == "FAILED" and "format mismatch" in done["command_error"]["message"]
    done = await command(
        env, agent, "standby.prepare_image", {"image_info": image_info(env, "backed.qcow2", backed)}, wait=True
    )
    assert done["command_status"] == "FAILED" and "backing file" in done["command_error"]["message"]


async def test_checksum_mismatch_fails_clearly_then_redeploy_works(env):
    tmp = env["tmp"]
    data = make_raw_image(tmp, "disk.raw", 4 * MiB)
    disk = make_disk(tmp, "sda.img", 8 * MiB)
    agent = await started(env["make_agent"](Disk(str(disk))), env["ironic"])
    wrong = "0" * 64
    done = await command(
        env,
        agent,
        "standby.prepare_image",
        {"image_info": image_info(env, "disk.raw", data, os_hash_value=wrong)},
        wait=True,
    )
    assert done["command_status"] == "FAILED"
    assert done["command_error"]["type"] == "ChecksumMismatch"
    assert done["command_error"]["message"] == (
        f"Checksum mismatch for image disk.raw: expected sha256 {wrong} got {hashlib.sha256(data).hexdigest()}"
    )
    done = await command(
        env, agent, "standby.prepare_image", {"image_info": image_info(env, "disk.raw", data)}, wait=True
    )
    assert done["command_status"] == "SUCCEEDED"
    with open(disk, "rb") as fh:
        assert fh.read(len(data)) == data


async def test_checksum_url_file_and_sha512(env):
    tmp, base = env["tmp"], env["image_base"]
    data = make_raw_image(tmp, "disk.raw", 4 * MiB, seed=3)
    (tmp / "SHA256SUMS").write_text(f"{'1' * 64}  other.raw\n{hashlib.sha256(data).hexdigest()}  disk.raw\n")
    (tmp / "BAD256SUMS").write_text(f"{'2' * 64}  disk.raw\n")
    disk = make_disk(tmp, "sda.img", 8 * MiB)
    agent = await started(env["make_agent"](Disk(str(disk))), env["ironic"])
    info = {"id": "disk.raw", "urls": [f"{base}/disk.raw"], "checksum": f"{base}/SHA256SUMS"}
    done = await command(env, agent, "standby.prepare_image", {"image_info": info}, wait=True)
    assert done["command_status"] == "SUCCEEDED", done
    done = await command(
        env, agent, "standby.prepare_image", {"image_info": {**info, "checksum": f"{base}/BAD256SUMS"}}, wait=True
    )
    assert done["command_status"] == "FAILED" and "Checksum mismatch" in done["command_error"]["message"]
    info512 = {
        "id": "disk.raw",
        "urls": [f"{base}/disk.raw"],
        "os_hash_algo": "sha512",
        "os_hash_value": hashlib.sha512(data).hexdigest(),
    }
    done = await command(env, agent, "standby.prepare_image", {"image_info": info512}, wait=True)
    assert done["command_status"] == "SUCCEEDED", done
    with open(disk, "rb") as fh:
        assert fh.read(len(data)) == data


@pytest.mark.parametrize("mode", ["raw socket", "chunked (aiohttp)", "server ignores Range"])
async def test_download_resumes_after_dropped_connection(env, mode):
    tmp, images = env["tmp"], env["images"]
    data = make_raw_image(tmp, "disk.raw", 10 * MiB, seed=5)
    images.drop_after["disk.raw"] = [3 * MiB]
    if mode.startswith("chunked"):  # the raw-socket probe reads only the headers, then aiohttp streams it
        images.chunked.add("disk.raw")
        images.drop_after["disk.raw"] = [None, 3 * MiB]
    if mode == "server ignores Range":
        images.ignore_range.add("disk.raw")
    disk = make_disk(tmp, "sda.img", 16 * MiB)
    agent = await started(env["make_agent"](Disk(str(disk))), env["ironic"])
    done = await command(
        env, agent, "standby.prepare_image", {"image_info": image_info(env, "disk.raw", data)}, wait=True
    )
    assert done["command_status"] == "SUCCEEDED", done
    ranges = [r for name, r in images.requests if name == "disk.raw"]
    assert ranges[:-1] == [None] * (len(ranges) - 1) and len(ranges) == (3 if mode.startswith("chunked") else 2)
    resumed_at = int(ranges[-1].removeprefix("bytes=").rstrip("-"))
    assert 0 < resumed_at <= 3 * MiB  # asked to resume where the first connection died, not from zero
    assert done["deploy_progress"]["bytes_downloaded"] == len(data)  # every byte delivered exactly once
    with open(disk, "rb") as fh:
        assert fh.read(len(data)) == data


async def test_busy_agent_answers_409(env):
    tmp, images = env["tmp"], env["images"]
    data = make_raw_image(tmp, "disk.raw", 8 * MiB)
    images.trickle["disk.raw"] = 0.25  # ~2 s
    agent = await started(env["make_agent"](Disk(str(make_disk(tmp, "sda.img", 16 * MiB)))), env["ironic"])
    first = await command(env, agent, "standby.prepare_image", {"image_info": image_info(env, "disk.raw", data)})
    assert first["command_status"] == "RUNNING"
    busy = await command(env, agent, "standby.get_partition_uuids", {}, expect=409)
    assert busy == {"faultcode": "Client", "faultstring": "Agent is busy"}
    assert (await finished(env, agent, first["id"]))["command_status"] == "SUCCEEDED"
    assert (await command(env, agent, "standby.sync", {}))["command_status"] == "SUCCEEDED"


async def test_root_device_hints_pick_the_disk_among_several(env):
    tmp = env["tmp"]
    data = make_raw_image(tmp, "disk.raw", 4 * MiB)
    paths = {
        name: make_disk(tmp, f"{name}.img", size)
        for name, size in (("sda", 5 * GiB), ("sdb", 10 * GiB), ("sdc", 20 * GiB))
    }  # sparse: no real space used
    disks = [
        Disk(str(paths["sda"]), "/dev/sda", serial="SA"),
        Disk(str(paths["sdb"]), "/dev/sdb", serial="SB", wwn="0x5001"),
        Disk(str(paths["sdc"]), "/dev/sdc", serial="SC", rotational=True),
    ]
    agent = await started(env["make_agent"](*disks), env["ironic"])
    inv = await command(env, agent, "poll.get_hardware_info", {})
    assert [(d["name"], d["size"], d["serial"]) for d in inv["command_result"]["disks"]] == [
        ("/dev/sda", 5 * GiB, "SA"),
        ("/dev/sdb", 10 * GiB, "SB"),
        ("/dev/sdc", 20 * GiB, "SC"),
    ]
    assert inv["command_result"]["interfaces"][0]["mac_address"] == "52:54:00:00:00:01"

    async def deploy(hints: dict[str, Any] | None) -> str:
        for path in paths.values():
            with open(path, "r+b") as fh:
                fh.write(b"\0" * len(data))
        step = {"interface": "deploy", "step": "write_image", "args": {"image_info": image_info(env, "disk.raw", data)}}
        node = {"properties": {"root_device": hints} if hints else {}}
        done = await command(env, agent, "deploy.execute_deploy_step", {"step": step, "node": node}, wait=True)
        assert done["command_status"] == "SUCCEEDED", done
        written = [name for name, path in paths.items() if read_head(path, len(data)) == data]
        assert len(written) == 1 and f"/dev/{written[0]}" in done["command_result"]["deploy_result"]["result"]
        return written[0]

    assert await deploy(None) == "sda"  # smallest disk of at least 4 GiB
    assert await deploy({"size": ">= 15"}) == "sdc"
    assert await deploy({"serial": "SB"}) == "sdb"
    assert await deploy({"wwn": "0x5001"}) == "sdb"
    assert await deploy({"name": "/dev/sdc"}) == "sdc"
    step = {"interface": "deploy", "step": "write_image", "args": {"image_info": image_info(env, "disk.raw", data)}}
    done = await command(
        env,
        agent,
        "deploy.execute_deploy_step",
        {"step": step, "node": {"properties": {"root_device": {"serial": "nope"}}}},
        wait=True,
    )
    assert done["command_status"] == "FAILED" and "No suitable device" in done["command_error"]["message"]


async def test_image_larger_than_disk_fails(env):
    tmp = env["tmp"]
    data = make_raw_image(tmp, "disk.raw", 8 * MiB)
    disk = make_disk(tmp, "small.img", 4 * MiB)
    agent = await started(env["make_agent"](Disk(str(disk))), env["ironic"])
    done = await command(
        env, agent, "standby.prepare_image", {"image_info": image_info(env, "disk.raw", data)}, wait=True
    )
    assert done["command_status"] == "FAILED" and "larger than the disk" in done["command_error"]["message"]
    assert os.path.getsize(disk) == 4 * MiB


async def test_config_drive_partition_written_after_image(env):
    from services.common.images.configdrive_partition import read_configdrive_partition
    from services.common.images.iso9660 import write_iso

    tmp = env["tmp"]
    data = make_raw_image(tmp, "disk.raw", 8 * MiB)
    iso = write_iso({"openstack/latest/meta_data.json": b'{"uuid": "x"}'}, label="config-2")
    import base64

    encoded = base64.b64encode(gzip.compress(iso)).decode()
    (tmp / "cd.txt").write_text(encoded)
    for source in (encoded, f"{env['image_base']}/cd.txt"):
        disk = make_disk(tmp, "sda.img", 128 * MiB)
        agent = await started(env["make_agent"](Disk(str(disk))), env["ironic"])
        done = await command(
            env,
            agent,
            "standby.prepare_image",
            {"image_info": image_info(env, "disk.raw", data), "configdrive": source},
            wait=True,
        )
        assert done["command_status"] == "SUCCEEDED", done
        _part, content = read_configdrive_partition(str(disk))
        assert content[: len(iso)] == iso
        uuids = (await command(env, agent, "standby.get_partition_uuids", {}))["command_result"]
        assert len(uuids["partitions"]) == 3  # ESP, root and the new config-2
        await agent.stop()
        env["ironic"].nodes.clear()


async def test_power_off_and_reboot_hooks_run_after_the_result(env):
    calls: list[str] = []

    async def off() -> None:
        calls.append("off")

    async def reboot() -> None:
        calls.append("reboot")

    agent = await started(
        env["make_agent"](Disk(str(make_disk(env["tmp"], "d", MiB))), power_off=off, reboot=reboot), env["ironic"]
    )
    done = await command(env, agent, "standby.power_off", {}, wait=True)
    assert done["command_status"] == "SUCCEEDED"
    await wait_for(lambda: calls == ["off"], 5, "power_off hook")
    sent = agent.heartbeats_sent
    await asyncio.sleep(0.5)
    assert agent.heartbeats_sent <= sent + 1  # the machine left the ramdisk: heartbeats stop
    done = await command(env, agent, "standby.run_image", {}, wait=True)
    await wait_for(lambda: calls == ["off", "reboot"], 5, "reboot hook")
    assert (await command(env, agent, "image.install_bootloader", {"root_uuid": "x"}, wait=True))[
        "command_status"
    ] == "SUCCEEDED"
    steps = (await command(env, agent, "deploy.get_deploy_steps", {"node": {}, "ports": []}))["command_result"]
    assert [s["step"] for s in steps["deploy_steps"]["GenericHardwareManager"]] == ["write_image"]


async def test_many_embedded_agents_share_one_session(env):
    """The simulator's way: many agents in one loop over one ClientSession."""
    ironic: FakeIronic = env["ironic"]
    tmp = env["tmp"]
    data = make_raw_image(tmp, "disk.raw", 4 * MiB)
    shared, slots = aiohttp.ClientSession(), asyncio.Semaphore(2)  # at most two writes at a time
    agents = []
    try:
        for i in range(20):
            mac = f"52:54:00:00:10:{i:02x}"
            ironic.register(mac)
            options = AgentOptions(
                api_url=env["ironic_url"],
                macs=(mac,),
                disks=(Disk(str(make_disk(tmp, f"m{i}.img", 8 * MiB))),),
                lookup_interval=0.05,
                heartbeat_interval=0.5,
                write_slots=slots,
                write_block_size=MiB,
            )
            agent = Agent(options, session=shared)
            agents.append(agent)
            await agent.start()
        await wait_for(lambda: all(a.heartbeats_sent for a in agents), 30, "every agent heartbeating")
        assert len({a.node_uuid for a in agents}) == 20 and len({a.callback_url for a in agents}) == 20
        results = await asyncio.gather(
            *(
                command(env, a, "standby.prepare_image", {"image_info": image_info(env, "disk.raw", data)}, wait=True)
                for a in agents[:8]
            )
        )
        assert [r["command_status"] for r in results] == ["SUCCEEDED"] * 8
        assert all(read_head(Path(a.options.disks[0].path), len(data)) == data for a in agents[:8])
        assert not slots.locked()
        await agents[0].stop()
        assert not shared.closed  # an embedder's session is never closed by an agent
        assert (await command(env, agents[1], "standby.sync", {}))["command_status"] == "SUCCEEDED"
    finally:
        for agent in agents:
            await agent.stop()
        await shared.close()


async def test_clean_steps_erase_metadata_then_whole_disks(env):
    tmp = env["tmp"]
    data = make_raw_image(tmp, "disk.raw", 8 * MiB)
    disk = make_disk(tmp, "sda.img", 16 * MiB)
    agent = await started(env["make_agent"](Disk(str(disk))), env["ironic"])
    done = await command(
        env, agent, "standby.prepare_image", {"image_info": image_info(env, "disk.raw", data)}, wait=True
    )
    assert done["command_status"] == "SUCCEEDED"
    steps = (await command(env, agent, "clean.get_clean_steps", {"node": {}, "ports": []}))["command_result"]
    by_name = {s["step"]: s["priority"] for s in steps["clean_steps"]["GenericHardwareManager"]}
    assert by_name == {"erase_devices_metadata": 99, "erase_devices": 0}
    step = {"interface": "deploy", "step": "erase_devices_metadata", "priority": 99}
    done = await command(env, agent, "clean.execute_clean_step", {"step": step, "node": {}, "ports": []}, wait=True)
    assert done["command_status"] == "SUCCEEDED" and done["command_result"]["clean_step"] == step
    uuids = (await command(env, agent, "standby.get_partition_uuids", {}))["command_result"]
    assert uuids["root uuid"] is None and uuids["partitions"] == {}  # no partition table left
    with open(disk, "rb") as fh:
        head = fh.read(4 * MiB)
    assert head[:MiB] == b"\0" * MiB and head[3 * MiB :] == data[3 * MiB : 4 * MiB]  # only metadata went
    done = await command(env, agent, "clean.execute_clean_step", {"step": {**step, "step": "erase_devices"}}, wait=True)
    assert done["command_status"] == "SUCCEEDED"
    assert read_head(disk, 16 * MiB) == b"\0" * 16 * MiB and os.path.getsize(disk) == 16 * MiB
    assert os.stat(disk).st_blocks * 512 < MiB  # holes punched: the sparse disk stays sparse
    bad = await command(env, agent, "clean.execute_clean_step", {"step": {"step": "shred"}}, expect=400)
    assert "unknown clean step" in bad["faultstring"]


async def test_masked_token_locks_down_unless_pregenerated(env):
    ironic = FakeIronic()  # its own api: one whose lookup answers a masked token, as after a first lookup
    node = ironic.register("52:54:00:00:00:01")

    async def lookup(request: web.Request) -> web.Response:
        ironic.lookups += 1
        return web.json_response({"node": node, "config": {"agent_token": "******", "heartbeat_timeout": 300}})

    ironic.lookup = lookup  # type: ignore[method-assign]
    app_runner, port = await start_http_site(ironic.app(), "127.0.0.1", 0)
    try:
        options: dict[str, Any] = {
            "api_url": f"http://127.0.0.1:{port}",
            "macs": ("52:54:00:00:00:01",),
            "lookup_interval": 0.05,
            "heartbeat_interval": 0.2,
            "disks": (Disk(str(make_disk(env["tmp"], "d", MiB))),),
        }
        locked = Agent(AgentOptions(**options, masked_token_grace=0.5))
        await locked.start()
        try:
            await wait_for(lambda: locked.last_error is not None, 10, "lock down")
            assert "no usable agent token" in (locked.last_error or "") and locked.heartbeats_sent == 0
            assert ironic.lookups >= 3  # asked again during the grace: a token may be re-issued
            await command(env, locked, "standby.sync", {}, expect=401)
        finally:
            await locked.stop()
        pregenerated = Agent(AgentOptions(**options, agent_token=TOKEN))
        await pregenerated.start()
        try:
            await wait_for(lambda: pregenerated.heartbeats_sent >= 1, 10, "heartbeat with the pre-generated token")
            assert ironic.heartbeats[-1][1]["agent_token"] == TOKEN
            assert (await command(env, pregenerated, "standby.sync", {}))["command_status"] == "SUCCEEDED"
        finally:
            await pregenerated.stop()
    finally:
        await app_runner.cleanup()


async def test_unreachable_urls_fail_and_the_next_url_is_tried(env):
    tmp = env["tmp"]
    data = make_raw_image(tmp, "disk.raw", 4 * MiB)
    disk = make_disk(tmp, "sda.img", 8 * MiB)
    agent = await started(env["make_agent"](Disk(str(disk))), env["ironic"])
    missing = image_info(env, "disk.raw", data, urls=[f"{env['image_base']}/missing.raw"])
    done = await command(env, agent, "standby.prepare_image", {"image_info": missing}, wait=True)
    assert done["command_status"] == "FAILED"
    assert done["command_error"]["message"] == f"Download of {env['image_base']}/missing.raw failed: HTTP 404 Not Found"
    both = image_info(env, "disk.raw", data, urls=[f"{env['image_base']}/missing.raw", f"{env['image_base']}/disk.raw"])
    done = await command(env, agent, "standby.prepare_image", {"image_info": both}, wait=True)
    assert done["command_status"] == "SUCCEEDED", done
    assert read_head(disk, len(data)) == data


async def test_system_logs_bundle_explains_a_failure(env):
    import base64
    import io
    import json
    import tarfile

    tmp = env["tmp"]
    data = make_raw_image(tmp, "disk.raw", 4 * MiB)
    agent = await started(env["make_agent"](Disk(str(make_disk(tmp, "sda.img", 8 * MiB)), serial="S7")), env["ironic"])
    await command(
        env,
        agent,
        "standby.prepare_image",
        {"image_info": image_info(env, "disk.raw", data, os_hash_value="0" * 64)},
        wait=True,
    )
    logs = (await command(env, agent, "log.collect_system_logs", {}))["command_result"]["system_logs"]
    with tarfile.open(fileobj=io.BytesIO(base64.b64decode(logs)), mode="r:gz") as tar:
        names = tar.getnames()
        commands = json.load(tar.extractfile("commands.json"))  # type: ignore[arg-type]
        inventory = json.load(tar.extractfile("inventory.json"))  # type: ignore[arg-type]
    assert set(names) == {"status.json", "node.json", "inventory.json", "commands.json"}
    assert commands[0]["command_error"]["type"] == "ChecksumMismatch"
    assert inventory["disks"][0]["serial"] == "S7"


async def test_https_image_with_ca_file_resumes_and_unknown_ca_fails(env):
    import ssl

    tmp, images = env["tmp"], env["images"]
    cert, key = tmp / "cert.pem", tmp / "key.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
            "-keyout",
            str(key),
            "-out",
            str(cert),
        ],
        check=True,
        capture_output=True,
    )
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    runner = web.AppRunner(images.app())
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=context)
    await site.start()
    try:
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        data = make_raw_image(tmp, "disk.raw", 6 * MiB, seed=9)
        info = image_info(env, "disk.raw", data, urls=[f"https://127.0.0.1:{port}/disk.raw"])
        disk = make_disk(tmp, "sda.img", 8 * MiB)
        trusted = await started(env["make_agent"](Disk(str(disk)), ca_file=str(cert)), env["ironic"])
        images.drop_after["disk.raw"] = [2 * MiB]
        done = await command(env, trusted, "standby.prepare_image", {"image_info": info}, wait=True)
        assert done["command_status"] == "SUCCEEDED", done
        assert read_head(disk, len(data)) == data
        assert [r for n, r in images.requests if n == "disk.raw"][-1].startswith("bytes=")  # resumed over TLS
        await trusted.stop()
        untrusted = await started(env["make_agent"](Disk(str(disk))), env["ironic"])
        done = await command(env, untrusted, "standby.prepare_image", {"image_info": info}, wait=True)
        assert done["command_status"] == "FAILED" and "certificate" in done["command_error"]["message"].lower()
        await untrusted.stop()
        insecure = await started(env["make_agent"](Disk(str(disk)), insecure=True), env["ironic"])
        done = await command(env, insecure, "standby.prepare_image", {"image_info": info}, wait=True)
        assert done["command_status"] == "SUCCEEDED", done
    finally:
        await runner.cleanup()


@pytest.mark.parametrize("size", [0, 100, 511, 513])
async def test_tiny_images_are_written_exactly(env, size):
    tmp = env["tmp"]
    data = bytes((i * 7 + 3) % 251 for i in range(size))
    (tmp / "tiny.raw").write_bytes(data)
    disk = make_disk(tmp, "sda.img", MiB)
    with open(disk, "r+b") as fh:
        fh.write(b"\xaa" * 1024)
    agent = await started(env["make_agent"](Disk(str(disk))), env["ironic"])
    done = await command(
        env, agent, "standby.prepare_image", {"image_info": image_info(env, "tiny.raw", data)}, wait=True
    )
    assert done["command_status"] == "SUCCEEDED", done
    assert read_head(disk, 1024) == data + b"\xaa" * (1024 - size)
    assert done["deploy_progress"]["bytes_written"] == size
