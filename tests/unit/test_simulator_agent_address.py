"""A simulated machine's agent advertises a callback address conductors can reach.

In the compose stack the simulator runs its agents on every address
(``--agent-host 0.0.0.0``) and the conductors in other containers; an agent
that advertised ``http://0.0.0.0:PORT`` failed every deploy there with
"Agent at http://0.0.0.0:... is unreachable" (issue 24). It advertises the
address that routes to the api instead, as IPA does.
"""

from __future__ import annotations

from services.agent.agent import route_address
from services.simulator.agents import AgentLaunch, real_agent


async def _nothing() -> None:
    return None


def launch(listen_host: str) -> AgentLaunch:
    api = "http://127.0.0.1:6385"
    return AgentLaunch(
        machine="sim-0000",
        kernel_cmdline=f"ipa-api-url={api} BOOTIF=01-52-54-00-00-00-00",
        kernel_args={"ipa-api-url": api},
        api_url=api,
        macs=("52:54:00:00:00:00",),
        disk_path="/nonexistent/disk",
        disk_serial="SIM0000",
        listen_host=listen_host,
        power_off=_nothing,
        reboot=_nothing,
    )


async def test_wildcard_listener_advertises_the_route_to_the_api() -> None:
    agent = await real_agent(launch("0.0.0.0"))
    options = agent.options  # type: ignore[attr-defined]
    assert options.listen_host == "0.0.0.0"
    assert options.advertise_host == "", "a wildcard listener must not advertise itself"
    assert route_address(options.api_url) == "127.0.0.1"


async def test_specific_listener_advertises_itself() -> None:
    agent = await real_agent(launch("127.0.0.1"))
    assert agent.options.advertise_host == "127.0.0.1"  # type: ignore[attr-defined]
