"""The default implementation of every optional interface kind, so a composed
driver never has a hole where an interface should be (Ironic's ``noop``).

``noop`` storage and network are real, trivial implementations: no volumes to
attach, a flat network. The ``no-<kind>`` ones stand for "this machine cannot
do that": their ``validate`` fails and every verb raises
``UnsupportedDriverExtension`` (a 400 naming the interface), so a request for
something the hardware cannot do is refused, never silently accepted.
"""

from __future__ import annotations

from typing import Any, NoReturn

from services.common import errors
from services.conductor.drivers import base, volumes


class NoopStorage(base.StorageInterface):
    """No volumes: the image is always written to the local disk. A node with a
    boot volume is refused rather than deployed to a disk it will not boot."""

    name = "noop"

    async def validate(self, task: base.Task) -> None:
        boot = volumes.boot_volume(task)
        if boot is not None:
            raise errors.InvalidParameterValue(
                f"Node {task.node['uuid']} has a boot volume (volume target {boot.get('uuid')}) but its storage "
                "interface is noop, which manages no volumes: set storage_interface to external (storage "
                "managed outside Ferrum) or cinder"
            )


class NoopNetwork(base.NetworkInterface):
    """Flat network; VIFs are bookkeeping only (what Nova needs)."""

    name = "noop"


class _Refusing(base.BaseInterface):
    """Fails validation and every verb with a 400 naming the interface."""

    def _refuse(self, what: str = "") -> NoReturn:
        raise base.unsupported(self, what or self.kind)

    async def validate(self, task: base.Task) -> None:
        self._refuse()


class NoVendor(_Refusing, base.VendorInterface):
    name = "no-vendor"


class NoInspect(_Refusing, base.InspectInterface):
    name = "no-inspect"

    async def inspect_hardware(self, task: base.Task) -> str:
        self._refuse("inspection")


class NoConsole(_Refusing, base.ConsoleInterface):
    name = "no-console"

    async def start_console(self, task: base.Task) -> None:
        self._refuse("a console")

    async def stop_console(self, task: base.Task) -> None:
        self._refuse("a console")

    async def get_console(self, task: base.Task) -> dict[str, Any]:
        self._refuse("a console")


class NoRAID(_Refusing, base.RAIDInterface):
    name = "no-raid"

    async def validate_raid_config(self, task: base.Task, raid_config: Any) -> None:
        self._refuse("RAID configuration")

    async def create_configuration(
        self, task: base.Task, *, create_root_volume: bool = True, create_nonroot_volumes: bool = True
    ) -> str | None:
        self._refuse("RAID configuration")

    async def delete_configuration(self, task: base.Task) -> str | None:
        self._refuse("RAID configuration")


class NoBIOS(_Refusing, base.BIOSInterface):
    name = "no-bios"

    async def apply_configuration(self, task: base.Task, settings: Any) -> str | None:
        self._refuse("BIOS settings")

    async def factory_reset(self, task: base.Task) -> str | None:
        self._refuse("a BIOS factory reset")


class NoRescue(_Refusing, base.RescueInterface):
    name = "no-rescue"

    async def rescue(self, task: base.Task) -> str:
        self._refuse()

    async def unrescue(self, task: base.Task) -> str:
        self._refuse()


class NoFirmware(_Refusing, base.FirmwareInterface):
    name = "no-firmware"

    async def update(self, task: base.Task, settings: Any) -> str | None:
        self._refuse("firmware updates")
