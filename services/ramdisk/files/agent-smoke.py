# Run by the ramdisk build with the ramdisk's own Python: the agent serves its
# command API and answers a command (importing alone does not prove that the
# aiohttp Debian ships runs Ferrum's server and client code).
import asyncio
import tempfile

import aiohttp

from services.agent.agent import Agent, AgentOptions, Disk


async def main() -> None:
    with tempfile.NamedTemporaryFile() as disk:
        disk.truncate(1024 * 1024)
        options = AgentOptions(
            api_url="http://127.0.0.1:9",
            macs=("52:54:00:00:00:01",),
            disks=(Disk(path=disk.name),),
            agent_token="smoke",
            lookup_interval=60,
        )
        agent = Agent(options)
        await agent.start()
        try:
            base = f"http://127.0.0.1:{agent.port}/v1"
            async with aiohttp.ClientSession() as session:
                async with session.get(f"{base}/status") as response:
                    assert response.status == 200, await response.text()
                body = {"name": "standby.sync", "params": {}}
                async with session.post(f"{base}/commands/?agent_token=smoke&wait=true", json=body) as response:
                    result = await response.json()
                    assert response.status == 200 and result["command_status"] == "SUCCEEDED", result
        finally:
            await agent.stop()
    print("agent smoke test passed")


asyncio.run(main())
