"""A power change asked of a BMC and confirmed by polling: what the ``redfish``
and ``ipmitool`` power interfaces (and any later BMC protocol) share.

BMCs apply power changes when they like (real ones 1-11 s later), so a
change is only done when the BMC reports the wanted state; a fixed sleep
would be a guess. Both protocols also share Ironic's shape around that:
asking for the state the machine is in sends nothing, and a hard reboot is
power off, confirmed, then power on, confirmed (a reset cannot be observed).
What differs is how to read and how to ask, so a protocol hands in a
:class:`PowerControl` of two coroutines and a description of its BMC.
Between polls no worker thread is held: only the event loop sleeps.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from services.common import errors, states

LOG = logging.getLogger(__name__)


@dataclass(frozen=True)
class PowerControl:
    """One node's BMC as a power change needs it.

    ``request`` takes Ironic's target (``power on``, ``power off``, ``soft power
    off``, ``soft rebooting``) and only asks; ``read`` answers ``power on`` or
    ``power off``. ``graceful_restart`` is whether the BMC can restart the OS
    itself (Redfish's GracefulRestart); without it a soft reboot is a soft
    power off, confirmed, then power on (IPMI)."""

    node_uuid: str
    bmc: str  # for errors and logs: "IPMI BMC 10.0.0.5:623", "Redfish BMC https://..."
    read: Callable[[], Awaitable[str]]
    request: Callable[[str], Awaitable[None]]
    poll_interval: float
    graceful_restart: bool


async def wait_for(control: PowerControl, wanted: str, deadline: float) -> None:
    """Poll until the BMC reports ``wanted``; a ``BMCError`` naming the state it still
    reports once ``deadline`` (time.monotonic()) has passed."""
    while True:
        last = await control.read()
        if last == wanted:
            return
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise errors.BMCError(
                f"Timed out waiting for node {control.node_uuid} to reach power state {wanted!r} "
                f"at {control.bmc}; it still reports {last!r}"
            )
        await asyncio.sleep(min(control.poll_interval, remaining))


async def reboot(control: PowerControl, timeout: float) -> None:
    """Power off (when on), confirmed, then power on, confirmed, within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    if await control.read() == states.POWER_ON:
        await control.request(states.POWER_OFF)
        await wait_for(control, states.POWER_OFF, deadline)
    await control.request(states.POWER_ON)
    await wait_for(control, states.POWER_ON, deadline)


async def set_power_state(control: PowerControl, state: str, timeout: float) -> None:
    """Bring the machine to ``state`` (Ironic's targets) and confirm it within ``timeout`` seconds."""
    if state == states.REBOOT:
        await reboot(control, timeout)
        return
    deadline = time.monotonic() + timeout
    current = await control.read()
    if state == states.SOFT_REBOOT:
        if current == states.POWER_ON and not control.graceful_restart:
            await control.request(states.SOFT_POWER_OFF)
            await wait_for(control, states.POWER_OFF, deadline)
            current = states.POWER_OFF
        await control.request(states.SOFT_REBOOT if current == states.POWER_ON else states.POWER_ON)
        await wait_for(control, states.POWER_ON, deadline)
        return
    wanted = states.POWER_ON if state == states.POWER_ON else states.POWER_OFF
    if current == wanted:
        LOG.info("power already in state node_uuid=%s bmc=%s state=%s", control.node_uuid, control.bmc, wanted)
        return
    await control.request(state)
    await wait_for(control, wanted, deadline)
