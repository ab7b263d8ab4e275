# Run by the ramdisk build with the ramdisk's own Python (Debian's Python and
# aiohttp, not the build machine's): the agent serves its command API and
# writes an image with a config drive from a local HTTP server, the way a
# conductor would ask for it. Importing alone would not prove that Ferrum's
# server and client code runs on the libraries the ramdisk carries.
import asyncio
import hashlib
import os
import struct
import tempfile
import time

import aiohttp
from aiohttp import web

from services.agent.agent import Agent, AgentOptions, Disk
from services.common.images.configdrive import build_configdrive, encode_configdrive


def mbr_image() -> bytes:
    """3 MiB: an MBR with one Linux partition (sectors 2048-6143) full of text."""
    sector = bytearray(512)
    sector[446:462] = bytes([0, 0, 0, 0, 0x83, 0, 0, 0]) + struct.pack("<II", 2048, 4096)
    sector[510:512] = b"\x55\xaa"
    body = (b"ferrum ramdisk smoke test " * 90_000)[: 4096 * 512]
    return bytes(sector) + bytes(2047 * 512) + body


IMAGE = mbr_image()


def blank_disk(path: str) -> None:
    with open(path, "wb") as handle:
        handle.truncate(96 * 1024 * 1024)


def disk_holds_image(path: str) -> bool:
    """Sector 0 now lists the config drive partition too, so compare from sector 1."""
    with open(path, "rb") as handle:
        handle.seek(512)
        return handle.read(len(IMAGE) - 512) == IMAGE[512:]


async def serve_image(request: web.Request) -> web.Response:
    return web.Response(body=IMAGE)


async def main() -> None:
    app = web.Application()
    app.router.add_get("/image.raw", serve_image)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    image_url = f"http://127.0.0.1:{runner.addresses[0][1]}/image.raw"
    with tempfile.TemporaryDirectory() as tmp:
        disk = os.path.join(tmp, "disk")
        await asyncio.to_thread(blank_disk, disk)
        options = AgentOptions(
            api_url="http://127.0.0.1:9",
            macs=("52:54:00:00:00:01",),
            disks=(Disk(path=disk),),
            agent_token="smoke",
            lookup_interval=60,
            tmp_dir=tmp,
        )
        agent = Agent(options)
        await agent.start()
        try:
            base = f"http://127.0.0.1:{agent.port}/v1"
            drive = build_configdrive({"uuid": "0" * 8 + "-0000-4000-8000-" + "0" * 12, "name": "smoke"}, [], {})
            params = {
                "image_info": {
                    "id": "smoke",
                    "urls": [image_url],
                    "os_hash_algo": "sha256",
                    "os_hash_value": hashlib.sha256(IMAGE).hexdigest(),
                    "disk_format": "raw",
                    "stream_raw_images": True,
                },
                "configdrive": encode_configdrive(drive),
            }
            async with aiohttp.ClientSession() as session:
                async with session.get(f"{base}/status") as response:
                    assert response.status == 200, await response.text()
                body = {"name": "standby.prepare_image", "params": params}
                async with session.post(f"{base}/commands/?agent_token=smoke", json=body) as response:
                    result = await response.json()
                    assert response.status == 200, result
                deadline = time.monotonic() + 60
                while result["command_status"] == "RUNNING" and time.monotonic() < deadline:
                    await asyncio.sleep(0.2)
                    async with session.get(f"{base}/commands/{result['id']}?agent_token=smoke") as response:
                        result = await response.json()
                assert result["command_status"] == "SUCCEEDED", result
        finally:
            await agent.stop()
            await runner.cleanup()
        assert await asyncio.to_thread(disk_holds_image, disk), "the disk does not hold the image"
    print("agent smoke test passed: command API, image write, config drive")


asyncio.run(main())
