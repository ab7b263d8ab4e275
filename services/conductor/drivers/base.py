"""Hardware interface contracts (Ironic's driver composition, asyncio).

A node has one implementation of each kind in ``INTERFACE_KINDS``, Ironic's
thirteen. Every interface has a fast, side-effect-free ``validate``,
``get_properties`` (the driver_info keys it reads), ``capabilities`` (seed
004: what neighbouring interfaces may rely on, e.g. ``iscsi_volume_boot``;
see capabilities.py) and ``take_over`` (called when another conductor adopts
an active node). Methods take the ``task`` first: it carries the node, its
ports and volumes, and the composed driver, so signatures stay stable as
features grow. docs/drivers.md describes the model and how to extend it.
"""

from __future__ import annotations

import abc
from collections.abc import Awaitable, Callable, Mapping
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, ClassVar

from services.common.db.records import NodeRecord, node_with

if TYPE_CHECKING:
    from services.common.db.records import BiosSettingRecord, NodeVolumeConnector, NodeVolumeTarget, PortRecord
    from services.conductor.console_proxy import ConsoleProxies
    from services.conductor.drivers.media import MediaImages
    from services.conductor.image_cache import ImageCache

# Every node has one implementation of each kind, as in Ironic. The core kinds
# have no sensible "nothing" and a hardware type must name them; each optional
# kind has an implementation that does nothing (storage, network: ``noop``) or
# refuses every verb (``no-<kind>``), the default when a hardware type is silent.
CORE_KINDS = ("power", "management", "boot", "deploy")
OPTIONAL_KIND_DEFAULTS: Mapping[str, str] = MappingProxyType(
    {
        "storage": "noop",
        "network": "noop",
        "vendor": "no-vendor",
        "inspect": "no-inspect",
        "console": "no-console",
        "raid": "no-raid",
        "bios": "no-bios",
        "rescue": "no-rescue",
        "firmware": "no-firmware",
    }
)
INTERFACE_KINDS = (*CORE_KINDS, *OPTIONAL_KIND_DEFAULTS)


@dataclass
class Task:
    """What one locked operation works on. ``node`` is refreshed as it changes."""

    node: NodeRecord
    ports: list[PortRecord]
    driver: ComposedDriver
    conductor: str
    volume_targets: list[NodeVolumeTarget] = field(default_factory=list)
    volume_connectors: list[NodeVolumeConnector] = field(default_factory=list)
    # Set by the conductor: merges keys into driver_internal_info (and refreshes
    # ``node``), so interfaces can keep step bookkeeping without SQL.
    merge_internal_info: Callable[..., Awaitable[NodeRecord]] | None = None
    # Set by the conductor: the config drive as an ISO behind a temp URL (virtual media).
    publish_configdrive: Callable[[Task], Awaitable[str]] | None = None
    # Set by the conductor: the config drive as ISO bytes, for a conductor that writes it (iSCSI deploy).
    read_configdrive: Callable[[Task], Awaitable[bytes | None]] | None = None
    # Set by the deploy verb: the image of the inline config drive it decoded (checked before
    # the verb was accepted), so the deploy stores it without decoding the same string again.
    configdrive_image: bytes | None = None
    # Set by the conductor: floppies and boot ISOs behind temp URLs (virtual-media boot, media.py).
    media: MediaImages | None = None
    # Set by the conductor: instance images by content hash, on the conductor's disk (iSCSI deploy).
    image_cache: ImageCache | None = None
    # Set by the conductor: stores a volume target's properties (the connection data a
    # storage interface got when it attached the volume, which the renderer reads).
    save_volume_target_properties: Callable[[str, Mapping[str, Any]], Awaitable[None]] | None = None
    # Set by the conductor: the node's cached BIOS settings (REST 1.40), read and replaced by a
    # BIOS interface: ``save_bios_settings(settings, registry)`` as BiosRepository.replace.
    read_bios_settings: Callable[[], Awaitable[list[BiosSettingRecord]]] | None = None
    save_bios_settings: Callable[[Mapping[str, Any], Mapping[str, Mapping[str, Any]]], Awaitable[None]] | None = None
    # Set by the conductor: its console proxies (services/conductor/console_proxy.py), which a
    # console interface hands the source of a node's console to.
    consoles: ConsoleProxies | None = None
    # Set by the conductor: writes node fields while this task holds the lock.
    update_fields: Callable[[str, Mapping[str, Any]], Awaitable[NodeRecord]] | None = None
    # What the lock was taken for (logs, history); empty for shared (unlocked) access.
    purpose: str = ""
    # Set by the task manager on a locked task: runs work in the background and
    # hands the lock over to it (Ironic's ``task.spawn_after``).
    spawner: Callable[[Task, Callable[[Task], Awaitable[None]], str], None] | None = None
    handed_over: bool = False
    # Set by the task manager while the node's lock is still to be taken, by the operation's
    # first write (TaskManager.acquire_at_first_write): the row version read and the lease.
    # NodeStates.transition takes the lock with it and clears it.
    claim: tuple[int, float] | None = None
    # Set when the operation's last write also cleared the lock in the database
    # (NodeStates.transition's ``release``): the task manager then only forgets the node.
    lock_released: bool = False
    # Set by the task manager on a locked task, for steps run on child nodes (REST 1.83
    # ``execute_on_child_nodes``, services/conductor/child_steps.py): the UUIDs of this
    # node's children, and another node locked for ``purpose`` (NodeLocked if it is taken);
    # ``peek_node`` reads another node's row without its lock (services/conductor/related_nodes.py).
    child_nodes: Callable[[], Awaitable[list[str]]] | None = None
    acquire_node: Callable[[str, str], AbstractAsyncContextManager[Task]] | None = None
    peek_node: Callable[[str], Awaitable[NodeRecord]] | None = None

    def spawn(self, work: Callable[[Task], Awaitable[None]], *, name: str = "") -> None:
        """Continue ``work`` in the background under this task's lock; the lock is
        released when the work ends, not when the ``acquire`` block does."""
        if self.spawner is None:
            raise RuntimeError("only a locked task can spawn background work")
        if self.handed_over:
            raise RuntimeError(f"the lock of node {self.node['uuid']} was already handed to background work")
        self.handed_over = True
        self.spawner(self, work, name or self.purpose)

    async def save_fields(self, changes: Mapping[str, Any]) -> None:
        """Record node fields an interface changed in hardware (power_state after a power action)."""
        if self.update_fields is None:
            self.node = node_with(self.node, changes)
            return
        self.node = await self.update_fields(self.node["uuid"], changes)

    async def save_internal_info(self, values: Mapping[str, Any], *, remove: tuple[str, ...] = ()) -> None:
        """Persist driver_internal_info keys for this node (a no-op outside a conductor)."""
        if self.merge_internal_info is None:
            info = {k: v for k, v in self.node["driver_internal_info"].items() if k not in remove}
            self.node = node_with(self.node, {"driver_internal_info": {**info, **values}})
            return
        self.node = await self.merge_internal_info(self.node["uuid"], values, remove=remove)


class BaseInterface(abc.ABC):  # noqa: B024 - the kinds below declare the abstract verbs
    """Common surface of every hardware interface implementation."""

    kind: ClassVar[str] = ""
    name: ClassVar[str] = ""
    capabilities: ClassVar[frozenset[str]] = frozenset()

    def __init__(self, options: Mapping[str, Any] | None = None) -> None:
        self.options = dict(options or {})

    def get_properties(self) -> dict[str, str]:
        """driver_info keys this implementation reads, with a description each."""
        return {}

    async def validate(self, task: Task) -> None:  # noqa: B027 - optional hook
        """Raise errors.InvalidParameterValue when the node cannot work; no side effects."""

    async def take_over(self, task: Task) -> None:  # noqa: B027 - optional hook
        """Adopt an active node from a dead conductor (nothing to do by default)."""

    async def close(self) -> None:  # noqa: B027 - optional hook
        """Release what the implementation holds across nodes (BMC sessions) at conductor stop."""

    # Clean steps (cleaning) and service steps (servicing an active node), as
    # Ironic's ``@clean_step``/``@service_step``: each step is ``{"interface",
    # "step", "priority", "abortable", "argsinfo", "requires_ramdisk"}``;
    # services/conductor/step_plan.py plans them. ``argsinfo`` maps each
    # argument to ``{"description", "required"}`` and optionally a JSON
    # ``"type"`` that is checked before the step is accepted.
    def get_clean_steps(self, task: Task) -> list[dict[str, Any]]:
        """The clean steps this implementation offers (none by default)."""
        return []

    async def execute_clean_step(self, task: Task, step: Mapping[str, Any]) -> str | None:
        """Run one of this implementation's clean steps: None when it is done,
        ``clean wait`` when it finishes later (an agent step; the agent's
        heartbeats bring the result)."""
        raise unsupported(self, f"the clean step {step.get('step')!r}")

    def get_service_steps(self, task: Task) -> list[dict[str, Any]]:
        """The service steps this implementation offers (none by default)."""
        return []

    async def execute_service_step(self, task: Task, step: Mapping[str, Any]) -> str | None:
        """Run one service step on an active node; None when done, ``service wait`` when later."""
        raise unsupported(self, f"the service step {step.get('step')!r}")

    async def step_argument_problems(self, task: Task, step: Mapping[str, Any]) -> list[str]:
        """What is wrong with a requested step's arguments beyond what ``argsinfo``
        says (their JSON types): checked when the step is requested, so a bad
        request is a 400 that changes nothing. From what the conductor already
        knows (cached data), never the hardware; [] by default."""
        return []


class PowerInterface(BaseInterface):
    kind = "power"

    @abc.abstractmethod
    async def get_power_state(self, task: Task) -> str: ...

    @abc.abstractmethod
    async def set_power_state(self, task: Task, state: str, timeout: float | None = None) -> None: ...

    @abc.abstractmethod
    async def reboot(self, task: Task, timeout: float | None = None) -> None: ...

    def get_supported_power_states(self) -> list[str]:
        return ["power on", "power off", "rebooting"]


def unsupported(interface: BaseInterface, what: str) -> Exception:
    """Ironic's UnsupportedDriverExtension: a 400 naming the interface and the feature."""
    from services.common import errors

    return errors.UnsupportedDriverExtension(
        f"Unsupported: the {interface.kind} interface {interface.name!r} does not support {what} "
        "(disabled or not implemented)."
    )


class ManagementInterface(BaseInterface):
    kind = "management"

    # Indicators (API 1.63): {component: {indicator: {"readonly": bool, "states": [...]}}}.
    async def get_supported_indicators(self, task: Task, component: str | None = None) -> dict[str, Any]:
        raise unsupported(self, "indicators")

    async def get_indicator_state(self, task: Task, component: str, indicator: str) -> str:
        raise unsupported(self, "indicators")

    async def set_indicator_state(self, task: Task, component: str, indicator: str, state: str) -> None:
        raise unsupported(self, "setting indicators")

    # Boot mode and secure boot (API 1.75/1.76).
    def get_supported_boot_modes(self, task: Task) -> list[str]:
        return []

    async def get_boot_mode(self, task: Task) -> str | None:
        return task.node.get("boot_mode")

    async def set_boot_mode(self, task: Task, mode: str) -> None:
        raise unsupported(self, "setting the boot mode")

    async def get_secure_boot_state(self, task: Task) -> bool | None:
        return task.node.get("secure_boot")

    async def set_secure_boot_state(self, task: Task, state: bool) -> None:
        raise unsupported(self, "secure boot")

    async def get_node_health(self, task: Task) -> str | None:
        """The machine's health as its BMC reports it (REST 1.109: ``OK``,
        ``Warning``, ``Critical``), read at each power sync; None where the
        interface cannot tell, which leaves the node's ``health`` null."""
        return None

    # Virtual media on request (API 1.89/1.93): device types are Ironic's
    # VMEDIA_DEVICES ("cdrom", "floppy", "disk"), the image an http(s) URL.
    async def attach_virtual_media(self, task: Task, device_type: str, image_url: str) -> None:
        raise unsupported(self, "attaching virtual media")

    async def detach_virtual_media(self, task: Task, device_types: list[str] | None = None) -> None:
        raise unsupported(self, "detaching virtual media")

    async def get_virtual_media(self, task: Task) -> list[dict[str, Any]]:
        """Every virtual media slot: ``{"id"?, "media_types", "image", "inserted"}``,
        the shape conductor.proto's ``VirtualMediaSlot`` carries to the api (other keys are not sent)."""
        raise unsupported(self, "reading virtual media")

    async def get_console_tail(self, task: Task, lines: int = 20) -> list[str]:
        """The last ``lines`` lines the machine's console showed, oldest first.

        Best effort, for diagnostics (a call-back timeout names the last line):
        [] when the BMC keeps no console log or cannot be asked."""
        return []

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

    async def before_power_on(self, task: Task) -> None:
        """Called before a power on or reboot the conductor was asked for: attach again what the
        next boot needs (a netbooting instance's boot ISO, as Ironic's ``IloPower.reboot`` does)."""


class DeployInterface(BaseInterface):
    kind = "deploy"
    # True when ``deploy`` itself prepares the instance's boot before powering it on
    # (the ramdisk deploy); otherwise the deploy flow calls boot.prepare_instance.
    prepares_instance_boot: ClassVar[bool] = False

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

    def get_deploy_steps(self, task: Task) -> list[dict[str, Any]]:
        """The deploy steps this interface offers (Ironic: interface, step,
        priority, argsinfo). ``deploy.deploy`` is the core step every deploy
        interface has; user deploy_steps (1.69) must name one of these."""
        return [{"interface": "deploy", "step": "deploy", "priority": 100, "argsinfo": None}]

    async def execute_deploy_step(self, task: Task, step: Mapping[str, Any]) -> None:
        """Run one deploy step other than ``deploy.deploy`` (which the conductor
        runs through :meth:`deploy`). The default has nothing to do."""

    async def prepare_cleaning(self, task: Task, *, resume: bool = False) -> str | None:
        """Make the node ready for clean steps that run in its ramdisk: ``clean
        wait`` when the ramdisk must boot and call back first, None when
        nothing is needed (the default: no in-band steps). ``resume``: a boot
        requested before a take-over is completed, never repeated."""
        return None

    async def tear_down_cleaning(self, task: Task) -> None:
        """Undo prepare_cleaning once the steps are done, failed or aborted."""

    async def clean_step_status(self, task: Task) -> str | None:
        """After a heartbeat in ``clean wait``: ``"done"`` when the running
        in-band step finished, None while it runs; raises when it failed."""
        return "done"

    async def refresh_clean_steps(self, task: Task) -> None:
        """Ask the freshly booted ramdisk which clean steps it offers (nothing to ask by default)."""

    async def adopt_clean_step(self, task: Task, step: Mapping[str, Any], *, ordinal: int) -> bool:
        """After a take-over: whether the ramdisk already got ``step`` (the
        ``ordinal``-th in-band step of the plan) from the dead conductor; if
        so it is now recorded as the command to poll."""
        return False


class StorageInterface(BaseInterface):
    """Seed 004's storage driver API: the volumes a node boots from or uses."""

    kind = "storage"

    async def attach_volumes(self, task: Task) -> None:
        """Make the node's volumes reachable by it (a no-op where the operator manages storage)."""

    async def detach_volumes(self, task: Task) -> None:
        """Undo ``attach_volumes``; safe to repeat."""

    def should_write_image(self, task: Task) -> bool:
        """Whether the deploy writes an image (False: the node boots a volume that already holds its OS)."""
        return True

    def power_toggles_attachments(self, task: Task) -> bool:
        """Whether powering this active node off detaches its volumes and powering
        it on attaches them (services/conductor/flows/power.py)."""
        return False


class NetworkInterface(BaseInterface):
    kind = "network"


@dataclass(frozen=True)
class VendorMethod:
    """How one passthru method is exposed (Ironic's ``@passthru`` metadata)."""

    http_methods: tuple[str, ...]
    is_async: bool = True
    description: str = ""
    attach: bool = False
    require_exclusive_lock: bool = True

    def describe(self) -> dict[str, Any]:
        return {
            "http_methods": list(self.http_methods),
            "async": self.is_async,
            "description": self.description,
            "attach": self.attach,
            "require_exclusive_lock": self.require_exclusive_lock,
        }


class VendorInterface(BaseInterface):
    """Vendor passthru: node methods (``methods``) and hardware-type methods
    (``driver_methods``), each called by name with the request body as data."""

    kind = "vendor"
    methods: ClassVar[Mapping[str, VendorMethod]] = {}
    driver_methods: ClassVar[Mapping[str, VendorMethod]] = {}

    async def validate_passthru(self, task: Task | None, method: str, data: Mapping[str, Any]) -> None:
        """Check the arguments of a call before it is accepted (400 when wrong)."""

    async def call_method(self, task: Task, method: str, http_method: str, data: Mapping[str, Any]) -> Any:
        raise unsupported(self, f"vendor passthru method {method!r}")

    async def call_driver_method(self, method: str, http_method: str, data: Mapping[str, Any]) -> Any:
        raise unsupported(self, f"driver vendor passthru method {method!r}")


class InspectInterface(BaseInterface):
    kind = "inspect"

    @abc.abstractmethod
    async def inspect_hardware(self, task: Task) -> str:
        """Returns the provision state to move to: ``manageable`` when done,
        ``inspect wait`` when a ramdisk posts the inventory later."""

    async def tear_down_inspection(self, task: Task) -> None:
        """Undo what inspect_hardware started (power off the ramdisk); nothing by default."""


class ConsoleInterface(BaseInterface):
    """A serial console for the node (Ironic's console interface). The conductor calls
    ``start_console``/``stop_console`` under the node lock (docs/console.md); both must be
    safe to repeat (a conductor that takes a node over starts its console again)."""

    kind = "console"

    @abc.abstractmethod
    async def start_console(self, task: Task) -> None: ...

    @abc.abstractmethod
    async def stop_console(self, task: Task) -> None: ...

    @abc.abstractmethod
    async def get_console(self, task: Task) -> dict[str, Any]:
        """``{"type": ..., "url": ...}`` of the running console."""


class RAIDInterface(BaseInterface):
    """RAID (API 1.12): ``target_raid_config`` is what the operator wants,
    checked by ``validate_raid_config`` when it is set (``PUT .../states/raid``);
    the clean steps ``create_configuration`` and ``delete_configuration`` build
    it or remove it, and ``raid_config`` records what the machine has."""

    kind = "raid"

    async def validate(self, task: Task) -> None:
        """A target RAID config already on the node must still be one this interface accepts."""
        target = task.node.get("target_raid_config")
        if target:
            await self.validate_raid_config(task, target)

    async def validate_raid_config(self, task: Task, raid_config: Mapping[str, Any]) -> None:
        """Raise errors.InvalidParameterValue when the target RAID config cannot be built
        (Ironic's RAID schema by default, services/common/raid_config.py)."""
        from services.common import raid_config as schema

        schema.validate(raid_config)

    @abc.abstractmethod
    async def create_configuration(
        self, task: Task, *, create_root_volume: bool = True, create_nonroot_volumes: bool = True
    ) -> str | None: ...

    @abc.abstractmethod
    async def delete_configuration(self, task: Task) -> str | None: ...

    async def execute_clean_step(self, task: Task, step: Mapping[str, Any]) -> str | None:
        args = step.get("args") or {}
        if step.get("step") == "create_configuration":
            return await self.create_configuration(
                task,
                create_root_volume=bool(args.get("create_root_volume", True)),
                create_nonroot_volumes=bool(args.get("create_nonroot_volumes", True)),
            )
        if step.get("step") == "delete_configuration":
            return await self.delete_configuration(task)
        raise unsupported(self, f"the clean step {step.get('step')!r}")


class BIOSInterface(BaseInterface):
    """BIOS settings (Ironic's bios interface): ``apply_configuration`` and
    ``factory_reset``, offered as clean and service steps by implementations
    that can do them (services/conductor/drivers/bios_steps.py), and
    ``cache_bios_settings``, what ``GET /v1/nodes/{id}/bios`` shows."""

    kind = "bios"

    @abc.abstractmethod
    async def apply_configuration(self, task: Task, settings: list[dict[str, Any]]) -> str | None: ...

    @abc.abstractmethod
    async def factory_reset(self, task: Task) -> str | None: ...

    async def cache_bios_settings(self, task: Task) -> None:
        """Refresh the node's cached BIOS settings (nothing to cache by default)."""

    async def execute_clean_step(self, task: Task, step: Mapping[str, Any]) -> str | None:
        return await self._run_step(task, step, "clean")

    async def execute_service_step(self, task: Task, step: Mapping[str, Any]) -> str | None:
        return await self._run_step(task, step, "service")

    async def _run_step(self, task: Task, step: Mapping[str, Any], kind: str) -> str | None:
        args = step.get("args") or {}
        if step.get("step") == "apply_configuration":
            return await self.apply_configuration(task, list(args.get("settings") or []))
        if step.get("step") == "factory_reset":
            return await self.factory_reset(task)
        raise unsupported(self, f"the {kind} step {step.get('step')!r}")


class RescueInterface(BaseInterface):
    kind = "rescue"

    @abc.abstractmethod
    async def rescue(self, task: Task) -> str:
        """Boot the rescue ramdisk; returns the provision state to move to."""

    @abc.abstractmethod
    async def unrescue(self, task: Task) -> str:
        """Boot the instance again; returns the provision state to move to."""

    async def finalize_rescue(self, task: Task) -> None:
        """The rescue ramdisk called back: hand it the password hash so it lets the tenant in."""
        raise unsupported(self, "finishing a rescue from a ramdisk")

    async def clean_up(self, task: Task) -> None:
        """Undo what a failed or aborted rescue left behind."""


class FirmwareInterface(BaseInterface):
    kind = "firmware"

    @abc.abstractmethod
    async def update(self, task: Task, settings: list[dict[str, Any]]) -> str | None: ...

    async def read_components(self, task: Task) -> list[dict[str, Any]]:
        """The machine's firmware components as the BMC reports them now (API 1.86):
        ``{"component", "current_version", "vendor", "model", "serial_number"}``
        each; the conductor caches them (services/conductor/firmware_cache.py)."""
        raise unsupported(self, "reading firmware components")


# The contract each kind's implementations must fulfil (checked when they load).
KIND_BASES: Mapping[str, type[BaseInterface]] = MappingProxyType(
    {
        "power": PowerInterface,
        "management": ManagementInterface,
        "boot": BootInterface,
        "deploy": DeployInterface,
        "storage": StorageInterface,
        "network": NetworkInterface,
        "vendor": VendorInterface,
        "inspect": InspectInterface,
        "console": ConsoleInterface,
        "raid": RAIDInterface,
        "bios": BIOSInterface,
        "rescue": RescueInterface,
        "firmware": FirmwareInterface,
    }
)


@dataclass(frozen=True)
class ComposedDriver:
    """The implementations chosen for one node, one per interface kind."""

    hardware_type: str
    power: PowerInterface
    management: ManagementInterface
    boot: BootInterface
    deploy: DeployInterface
    storage: StorageInterface
    network: NetworkInterface
    vendor: VendorInterface
    inspect: InspectInterface
    console: ConsoleInterface
    raid: RAIDInterface
    bios: BIOSInterface
    rescue: RescueInterface
    firmware: FirmwareInterface

    def interfaces(self) -> dict[str, BaseInterface]:
        return {kind: getattr(self, kind) for kind in INTERFACE_KINDS}
