"""Driver composition checks itself (issue 15, part 5): names a hardware type
gives that nothing installs stop the load, every optional kind has a no-op
default that refuses its verbs, and capability rules refuse combinations
that cannot work. Registries are built from explicit classes through the
same loader the conductor uses for entry points; nothing is patched."""

from __future__ import annotations

import abc
import dataclasses
import inspect
from typing import Any, ClassVar

import pytest

from services.common import errors
from services.common.config import ConductorConfig
from services.common.db.nodes import INTERFACE_FIELDS
from services.common.db.records import NodeVolumeTarget
from services.conductor.drivers import base, capabilities, fake, noop
from services.conductor.drivers.hardware import HardwareType, RedfishHardware
from services.conductor.drivers.installed import Installed
from services.conductor.drivers.ipxe import IpxeBoot
from services.conductor.drivers.registry import DriverRegistry
from tests.support.node_records import node_record

CONFIG = ConductorConfig()


class Typo(HardwareType):
    name = "typo"
    supported: ClassVar[dict[str, tuple[str, ...]]] = {
        "power": ("fake",),
        "management": ("fake",),
        "boot": ("ipxee",),  # the typo: no entry point provides "ipxee"
        "deploy": ("fake",),
    }


class Minimal(HardwareType):
    """Names only the core kinds: every optional kind must fall back to its no-op."""

    name = "minimal"
    supported: ClassVar[dict[str, tuple[str, ...]]] = {
        "power": ("fake",),
        "management": ("fake",),
        "boot": ("fake",),
        "deploy": ("fake",),
    }


def registry_with(hw: type[HardwareType], **config: Any) -> DriverRegistry:
    cfg = dataclasses.replace(CONFIG, enabled_hardware_types=(hw.name,), **config)
    return DriverRegistry.from_classes(cfg, hardware_types={hw.name: hw}, interfaces={})


def test_a_misspelled_implementation_stops_the_load_naming_type_kind_and_name() -> None:
    with pytest.raises(errors.DriverLoadError) as caught:
        registry_with(Typo)
    message = caught.value.message
    assert "hardware type 'typo'" in message and "boot interface 'ipxee'" in message
    assert "'ferrum.hardware.interfaces.boot'" in message and "ipxe" in message  # what is installed
    assert "\n" not in message  # the CLI prints the first line only


def test_an_unknown_kind_and_a_missing_core_kind_stop_the_load() -> None:
    class WrongKind(Minimal):
        name = "wrong-kind"
        supported: ClassVar[dict[str, tuple[str, ...]]] = {**Minimal.supported, "mangement": ("fake",)}

    with pytest.raises(errors.DriverLoadError, match=r"'wrong-kind'.*unknown interface kind\(s\) 'mangement'"):
        registry_with(WrongKind)

    class NoDeploy(Minimal):
        name = "no-deploy"
        supported: ClassVar[dict[str, tuple[str, ...]]] = {k: v for k, v in Minimal.supported.items() if k != "deploy"}

    with pytest.raises(errors.DriverLoadError, match=r"'no-deploy'.*names no deploy interface"):
        registry_with(NoDeploy)


def test_a_kind_without_an_enabled_implementation_stops_the_load() -> None:
    with pytest.raises(
        errors.DriverLoadError,
        match=r"'redfish' has no enabled boot interface.*\['ipxe', 'redfish-virtual-media', 'fake'\]",
    ):
        DriverRegistry(dataclasses.replace(CONFIG, enabled_hardware_types=("redfish",), enabled_boot_interfaces=()))
    with pytest.raises(errors.DriverLoadError, match=r"'minimal' has no enabled console interface"):
        registry_with(Minimal, enabled_console_interfaces=())


def test_enabled_names_that_nothing_installs_are_refused() -> None:
    with pytest.raises(errors.DriverLoadError, match=r"enabled hardware type 'idrac' is not installed"):
        DriverRegistry(dataclasses.replace(CONFIG, enabled_hardware_types=("idrac",)))
    with pytest.raises(errors.DriverLoadError, match=r"enabled raid interface 'idrac' is not installed.*no-raid"):
        DriverRegistry(dataclasses.replace(CONFIG, enabled_raid_interfaces=("no-raid", "idrac")))


def test_an_enabled_implementation_no_type_offers_is_fine() -> None:
    """``fake`` rescue is enabled, but the only enabled type does not offer it."""
    registry = DriverRegistry(dataclasses.replace(CONFIG, enabled_hardware_types=("redfish",)))
    assert "fake" in registry.enabled["rescue"]
    assert registry.supported("redfish", "rescue") == ["no-rescue", "agent"]  # agent rescue, never fake


def test_entry_points_must_load_the_right_kind_under_its_own_name() -> None:
    wrong_base = Installed.from_classes({}, {"boot": {"fake": fake.FakePower}})
    with pytest.raises(
        errors.DriverLoadError, match=r"'fake' in 'ferrum.hardware.interfaces.boot'.*not a BootInterface"
    ):
        DriverRegistry(CONFIG, Installed.from_entry_points().merged(wrong_base))
    wrong_name = Installed.from_classes({}, {"boot": {"pxe": IpxeBoot}})
    with pytest.raises(errors.DriverLoadError, match=r"'pxe'.*loads IpxeBoot, whose name is 'ipxe'"):
        DriverRegistry(
            dataclasses.replace(CONFIG, enabled_boot_interfaces=("fake", "ipxe", "pxe")),
            Installed.from_entry_points().merged(wrong_name),
        )
    with pytest.raises(errors.DriverLoadError, match="not a HardwareType subclass"):
        DriverRegistry(CONFIG, Installed.from_entry_points().merged(Installed.from_classes({"redfish": int}, {})))  # type: ignore[dict-item]


def test_every_optional_kind_defaults_to_its_noop() -> None:
    registry = registry_with(Minimal)
    resolved = registry.resolve_interfaces("minimal", {})
    assert {kind: resolved[f"{kind}_interface"] for kind in base.OPTIONAL_KIND_DEFAULTS} == dict(
        base.OPTIONAL_KIND_DEFAULTS
    )
    assert set(base.OPTIONAL_KIND_DEFAULTS) == {
        "console",
        "raid",
        "bios",
        "rescue",
        "inspect",
        "vendor",
        "firmware",
        "storage",
        "network",
    }
    driver = registry.compose({"driver": "minimal"})
    assert isinstance(driver.rescue, noop.NoRescue) and isinstance(driver.console, noop.NoConsole)
    # A type that declares a kind keeps its default, and can still be switched to the no-op.
    assert RedfishHardware.supported_names("vendor") == ("no-vendor",)
    assert RedfishHardware.supported_names("storage") == ("noop", "external", "cinder", "fake")
    assert RedfishHardware.supported_names("raid") == ("no-raid", "agent")
    assert RedfishHardware.supported_names("power") == ("redfish",)  # core kinds get nothing added
    assert registry.resolve_interfaces("minimal", {"rescue_interface": "no-rescue"})["rescue_interface"] == "no-rescue"
    with pytest.raises(errors.InvalidParameterValue, match=r"ferrum\.hardware\.interfaces\.rescue"):
        registry.resolve_interfaces("minimal", {"rescue_interface": "fake"})


def test_every_kind_is_a_node_field_and_has_its_noop_installed() -> None:
    assert set(INTERFACE_FIELDS) == {f"{k}_interface" for k in base.INTERFACE_KINDS}
    assert set(base.KIND_BASES) == set(base.INTERFACE_KINDS)
    installed = Installed.from_entry_points()
    for kind, name in base.OPTIONAL_KIND_DEFAULTS.items():
        assert name in installed.names(kind), f"pyproject.toml has no {name!r} entry point for {kind}"


def _abstract_verbs(kind: str) -> set[str]:
    cls = base.KIND_BASES[kind]
    return {name for name, member in inspect.getmembers(cls) if getattr(member, "__isabstractmethod__", False)}


REFUSING = [
    cls
    for cls in vars(noop).values()
    if isinstance(cls, type) and issubclass(cls, noop._Refusing) and cls is not noop._Refusing
]


@pytest.mark.parametrize("cls", REFUSING, ids=lambda c: c.name)
async def test_no_implementations_refuse_validation_and_every_verb(cls: type[base.BaseInterface]) -> None:
    assert not inspect.isabstract(cls)
    impl = cls({})
    task = base.Task(node=node_record(uuid="n-1", driver="redfish"), ports=[], driver=None, conductor="c")  # type: ignore[arg-type]
    own = {name for name, member in vars(cls).items() if inspect.iscoroutinefunction(member)}
    verbs = {"validate"} | _abstract_verbs(cls.kind) | own
    if cls.kind == "vendor":
        verbs |= {"call_method", "call_driver_method"}
    assert len(verbs) > 1
    for verb in sorted(verbs):
        method = getattr(impl, verb)
        positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
        arity = sum(p.kind in positional for p in inspect.signature(method).parameters.values())
        args = [None] * arity if verb == "call_driver_method" else [task, *[None] * (arity - 1)]
        with pytest.raises(errors.UnsupportedDriverExtension) as caught:
            await method(*args)
        assert f"the {cls.kind} interface {cls.name!r}" in caught.value.message, verb
        assert caught.value.http_status == 400


async def test_noop_storage_and_network_work_rather_than_refuse() -> None:
    """Ironic names them ``noop``: local disk and a flat network are real, trivial behaviour."""
    assert {c.kind for c in REFUSING} == set(base.OPTIONAL_KIND_DEFAULTS) - {"storage", "network"}
    task = base.Task(node=node_record(uuid="n-1", driver="redfish"), ports=[], driver=None, conductor="c")  # type: ignore[arg-type]
    storage, network = noop.NoopStorage({}), noop.NoopNetwork({})
    await storage.validate(task)
    await network.validate(task)
    await storage.attach_volumes(task)
    assert storage.should_write_image(task) and storage.name == network.name == "noop"


def test_check_capability_is_false_without_a_definition() -> None:
    class Bare:
        pass

    assert capabilities.check_capability(IpxeBoot({}), "iscsi_volume_boot")
    assert not capabilities.check_capability(fake.FakeBoot({}), "iscsi_volume_boot")
    assert not capabilities.check_capability(Bare(), "iscsi_volume_boot")  # type: ignore[arg-type]
    assert not capabilities.check_capability(None, "iscsi_volume_boot")


def test_ipxe_declares_what_the_renderer_boots() -> None:
    """services/ipxe/plan.py SAN-boots iSCSI and Fibre Channel targets and NFS roots."""
    assert {"iscsi_volume_boot", "fibre_channel_volume_boot", "nfs_volume_boot"} <= IpxeBoot.capabilities


def _task(registry: DriverRegistry, boot: str, targets: list[NodeVolumeTarget]) -> base.Task:
    node = node_record(uuid="n-2", driver="fake-hardware", boot_interface=boot)
    return base.Task(node=node, ports=[], driver=registry.compose(node), conductor="c", volume_targets=targets)


def test_a_boot_volume_needs_the_boot_interface_to_boot_its_type() -> None:
    registry = DriverRegistry(CONFIG)
    boot_volume = NodeVolumeTarget(
        uuid="t-0", volume_type="iscsi", boot_index=0, volume_id="v-0", properties={}, extra={}
    )
    data_volume = NodeVolumeTarget(
        uuid="t-1", volume_type="rbd", boot_index=1, volume_id="v-1", properties={}, extra={}
    )

    def alternatives(kind: str, capability: str) -> list[str]:
        return registry.offering("fake-hardware", kind, capability)

    missing = capabilities.unmet(_task(registry, "fake", [boot_volume, data_volume]))
    assert [(m.need.kind, m.need.capability, m.interface.name) for m in missing] == [
        ("boot", "iscsi_volume_boot", "fake")
    ]
    with pytest.raises(errors.InvalidParameterValue) as caught:
        capabilities.check(_task(registry, "fake", [boot_volume]), alternatives=alternatives)
    assert caught.value.message == (
        "The boot interface 'fake' of node n-2 lacks the capability 'iscsi_volume_boot', which the node needs: "
        "its boot volume (volume target t-0) is of type 'iscsi'. "
        "Boot interfaces of hardware type fake-hardware that have it: ipxe."
    )
    for volume_type in ("iscsi", "fibre_channel", "nfs"):
        capabilities.check(_task(registry, "ipxe", [{**boot_volume, "volume_type": volume_type}, data_volume]))
    # Data volumes alone need nothing of the boot interface; a type the renderer cannot boot is refused.
    capabilities.check(_task(registry, "fake", [data_volume]))
    with pytest.raises(errors.InvalidParameterValue, match=r"'rbd_volume_boot'.*No enabled boot interface"):
        capabilities.check(_task(registry, "ipxe", [{**boot_volume, "volume_type": "rbd"}]), alternatives=alternatives)
    # Only the kinds asked about are checked.
    assert capabilities.unmet(_task(registry, "fake", [boot_volume]), kinds=("deploy",)) == []


def test_rules_are_plain_functions() -> None:
    """The mechanism is general: the next feature adds a rule, not a new check."""

    def ramdisk_deploy_needs(task: base.Task) -> list[capabilities.Need]:
        return [capabilities.Need("boot", "ramdisk_boot", "it deploys a ramdisk")]

    registry = DriverRegistry(CONFIG)
    assert capabilities.unmet(_task(registry, "ipxe", []), rules=[ramdisk_deploy_needs]) == []
    (missing,) = capabilities.unmet(_task(registry, "fake", []), rules=[ramdisk_deploy_needs])
    assert missing.need.capability == "ramdisk_boot" and missing.interface.name == "fake"


def test_every_kind_contract_is_abstract() -> None:
    """A new kind must name its verbs, so its no-op has something to refuse."""
    for kind in ("console", "raid", "bios", "rescue", "firmware", "inspect"):
        assert _abstract_verbs(kind), kind
        assert isinstance(base.KIND_BASES[kind], abc.ABCMeta)
