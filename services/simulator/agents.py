"""Starting a deploy agent when a simulated machine boots the deploy kernel.

The firmware hands an :class:`AgentLaunch` to a factory; the default one
builds Ferrum's real agent (``services.agent.agent``) from the kernel command
line and, after a virtual-media boot, the inserted removable media (the agent
finds its ``ir-vfd-dev`` floppy among them, as on a machine), bound to this
machine's disk file and power hooks. A different factory
(``SimulatorOptions.agent_factory``) can stand in, e.g. in tests; it may
return the agent or an awaitable of it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import aiohttp

WILDCARD_HOSTS = ("0.0.0.0", "::", "")


class AgentHandle(Protocol):
    """What the simulator needs from an agent: start it, stop it."""

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


@dataclass(frozen=True)
class AgentLaunch:
    machine: str  # machine name, for logs
    kernel_cmdline: str  # as the iPXE script gave it
    kernel_args: dict[str, str]  # the same, split into key=value
    api_url: str  # ipa-api-url (first of the list)
    macs: tuple[str, ...]  # BOOTIF's MAC first, then the machine's other NICs
    disk_path: str
    disk_serial: str
    listen_host: str
    power_off: Callable[[], Awaitable[None]]
    reboot: Callable[[], Awaitable[None]]
    # The rescue login of the booted ramdisk: receives the crypt(3) password hash.
    set_rescue_password: Callable[[str], Awaitable[None]] | None = None
    hardware: Any = None  # services.agent.hardware.MachineFacts: what the machine's inventory reports
    session: aiohttp.ClientSession | None = field(default=None, compare=False)
    # What a virtual-media boot left inserted besides the CD (the floppy / USB stick), as bytes.
    removable_media: tuple[bytes, ...] = field(default=(), compare=False, repr=False)
    # The LUN an HBA presents (boot from volume): (path, wwn), or empty.
    hba_lun: tuple[str, str] | tuple[()] = ()


async def real_agent(launch: AgentLaunch) -> AgentHandle:
    """Ferrum's agent for one simulated machine (imported only when a machine needs it)."""
    from services.agent import vmedia
    from services.agent.agent import Agent, Disk, options_from_kernel_cmdline

    floppy = None
    if launch.removable_media and vmedia.wants_floppy(launch.kernel_cmdline):
        floppy = await asyncio.to_thread(vmedia.image_parameters, launch.removable_media)
    options = options_from_kernel_cmdline(
        launch.kernel_cmdline,
        floppy_parameters=floppy,
        macs=launch.macs,
        disks=(
            Disk(path=launch.disk_path, name="/dev/sda", serial=launch.disk_serial),
            *(
                (
                    Disk(
                        path=launch.hba_lun[0],
                        name="/dev/sdb",
                        serial=f"{launch.disk_serial}-LUN0",
                        wwn=launch.hba_lun[1],
                    ),
                )
                if launch.hba_lun
                else ()
            ),
        ),
        power_off=launch.power_off,
        reboot=launch.reboot,
        set_rescue_password=launch.set_rescue_password,
        hardware=launch.hardware,
        # Every simulated machine lives in this process: whatever the kernel line
        # says about listening, agents share one host on ephemeral ports. Listening
        # on every address (the simulator in a container), an agent advertises the
        # address that routes to the api, as IPA does; 0.0.0.0 reaches no conductor.
        listen_host=launch.listen_host,
        listen_port=0,
        advertise_host="" if launch.listen_host in WILDCARD_HOSTS else launch.listen_host,
        hostname=launch.machine,
    )
    agent: Any = Agent(options, session=launch.session)
    return agent
