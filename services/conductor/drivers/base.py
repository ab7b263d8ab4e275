"""Hardware interface contracts (Ironic's driver composition, asyncio).

Every interface has a fast, side-effect-free ``validate``, ``get_properties``
(the driver_info keys it reads), ``capabilities`` (seed 004: what neighbouring
interfaces may rely on, e.g. ``iscsi_volume_boot``) and ``take_over`` (called
when another conductor adopts an active node). Methods take the ``task`` first:
it carries the node, its ports and volumes, and the composed driver, so
signatures stay stable as features grow.
"""

from __future__ import annotations

import abc
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

INTERFACE_KINDS = (
    "power", "management", "boot", "deploy", "storage", "network", "vendor", "inspect",
)


@dataclass
class Task:
    """What one locked operation works on. ``node`` is refreshed as it changes."""

    node: dict[str, Any]
    ports: list[dict[str, Any]]
    driver: "ComposedDriver"
    conductor: str
    volume_targets: list[dict[str, Any]] = field(default_factory=list)
    volume_connectors: list[dict[str, Any]] = field(default_factory=list)
    # Set by the conductor: merges keys into driver_internal_info (and refreshes
    # ``node``), so interfaces can keep step bookkeeping without SQL.
    merge_internal_info: Callable[..., Awaitable[dict[str, Any]]] | None = None
    # Set by the conductor: the config drive as an ISO behind a temp URL (virtual media).
    publish_configdrive: Callable[["Task"], Awaitable[str]] | None = None
    # Set by the conductor: writes node fields while this task holds the lock.
    update_fields: Callable[[str, Mapping[str, Any]], Awaitable[dict[str, Any]]] | None = None

    async def save_fields(self, changes: Mapping[str, Any]) -> None:
        """Record node fields an interface changed in hardware (power_state after a power action)."""
        if self.update_fields is None:
            self.node = {**self.node, **changes}
            return
        self.node = await self.update_fields(self.node["uuid"], changes)

    async def save_internal_info(self, values: Mapping[str, Any], *, remove: tuple[str, ...] = ()) -> None:
        """Persist driver_internal_info keys for this node (a no-op outside a conductor)."""
        if self.merge_internal_info is None:
            info = {k: v for k, v in self.node["driver_internal_info"].items() if k not in remove}
            self.node = {**self.node, "driver_internal_info": {**info, **values}}
            return
        self.node = await self.merge_internal_info(self.node["uuid"], values, remove=remove)


class BaseInterface(abc.ABC):
    """Common surface of every hardware interface implementation."""

    kind: ClassVar[str] = ""
    name: ClassVar[str] = ""
    capabilities: ClassVar[frozenset[str]] = frozenset()

    def __init__(self, options: Mapping[str, Any] | None = None) -> None:
        self.options = dict(options or {})

    def get_properties(self) -> dict[str, str]:
        """driver_info keys this implementation reads, with a description each."""
        return {}

    async def validate(self, task: Task) -> None:
        """Raise errors.InvalidParameterValue when the node cannot work; no side effects."""

    async def take_over(self, task: Task) -> None:
        """Adopt an active node from a dead conductor (nothing to do by default)."""

    async def close(self) -> None:
        """Release what the implementation holds across nodes (BMC sessions) at conductor stop."""


class PowerInterface(BaseInterface):
    kind = "power"

    @abc.abstractmethod
    async def get_power_state(self, task: Task) -> str: ...

    @abc.abstractmethod
    async def set_power_state(self, task: Task, state: str, timeout: int | None = None) -> None: ...

    @abc.abstractmethod
    async def reboot(self, task: Task, timeout: int | None = None) -> None: ...

    def get_supported_power_states(self) -> list[str]:
        return ["power on", "power off", "rebooting"]


class ManagementInterface(BaseInterface):
    kind = "management"

    @abc.abstractmethod
    def get_supported_boot_devices(self, task: Task) -> list[str]: ...

    @abc.abstractmethod
    async def set_boot_device(self, task: Task, device: str, persistent: bool = False) -> None: ...

    @abc.abstractmethod
    async def get_boot_device(self, task: Task) -> dict[str, Any]: ...


class BootInterface(BaseInterface):
    kind = "boot"

    async def prepare_ramdisk(self, task: Task, ramdisk_params: Mapping[str, Any]) -> None:
        """Make the next boot load the deploy ramdisk."""

    async def clean_up_ramdisk(self, task: Task) -> None:
        """Undo prepare_ramdisk (eject media, delete uploaded images)."""

    async def prepare_instance(self, task: Task) -> None:
        """Make the next boot start the deployed instance."""

    async def clean_up_instance(self, task: Task) -> None:
        """Undo prepare_instance on tear down."""


class DeployInterface(BaseInterface):
    kind = "deploy"

    @abc.abstractmethod
    async def deploy(self, task: Task) -> str | None:
        """Start or do the deployment. Returns ``wait call-back`` when the
        ramdisk must call back, or None when the node is already deployed."""

    async def tear_down(self, task: Task) -> str:
        return "deleted"

    async def prepare(self, task: Task) -> None:
        pass

    async def clean_up(self, task: Task) -> None:
        pass

    async def heartbeat(self, task: Task, callback_url: str, agent_version: str) -> str | None:
        """A ramdisk called back; returns the new provision event or None."""
        return None


class StorageInterface(BaseInterface):
    kind = "storage"

    async def attach_volumes(self, task: Task) -> None:
        pass

    async def detach_volumes(self, task: Task) -> None:
        pass

    def should_write_image(self, task: Task) -> bool:
        return True


class NetworkInterface(BaseInterface):
    kind = "network"


class VendorInterface(BaseInterface):
    kind = "vendor"


class InspectInterface(BaseInterface):
    kind = "inspect"

    async def inspect_hardware(self, task: Task) -> str:
        """Returns the provision state to move to (``manageable`` when done)."""
        raise NotImplementedError


@dataclass(frozen=True)
class ComposedDriver:
    """The implementations chosen for one node, by interface kind."""

    hardware_type: str
    power: PowerInterface
    management: ManagementInterface
    boot: BootInterface
    deploy: DeployInterface
    storage: StorageInterface
    network: NetworkInterface
    vendor: VendorInterface
    inspect: InspectInterface

    def interfaces(self) -> dict[str, BaseInterface]:
        return {kind: getattr(self, kind) for kind in INTERFACE_KINDS}
