"""The ``agent`` inspect interface: in-band inspection by the agent ramdisk
(Ironic's ``agent`` inspect interface).

``inspect`` boots the ramdisk (``inspect wait``); the renderer adds
``ipa-inspection-callback-url`` to its kernel line, and the agent posts its
inventory to ``/v1/continue_inspection``. The conductor then stores it,
sets the node's properties and ports from it and runs the inspection rules
(services/conductor/inspection.py), and this interface powers the ramdisk off.
"""

from __future__ import annotations

from services.common import states
from services.conductor.drivers import base, ramdisk_boot


class AgentInspect(base.InspectInterface):
    name = "agent"

    async def validate(self, task: base.Task) -> None:
        await task.driver.boot.validate(task)

    async def inspect_hardware(self, task: base.Task) -> str:
        await ramdisk_boot.boot_ramdisk(task, fresh=False)
        return states.INSPECTWAIT

    async def tear_down_inspection(self, task: base.Task) -> None:
        await ramdisk_boot.power_off_ramdisk(task)
