"""Capabilities: what an implementation promises the interfaces around it.

Each implementation lists tags in ``capabilities`` (seed 004), for example
the ``ipxe`` boot interface's ``iscsi_volume_boot``: it can start a node from
an iSCSI volume. A node's own data can demand a tag of one of its interfaces;
the rules below say which. Checking the rules before a deploy refuses a
combination that cannot work (a 400 naming the interface and the tag) rather
than letting it fail half-way on the machine.

A rule is a plain function from the task to the needs it finds, so a new
feature adds a function to ``RULES`` and nothing else changes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from services.common import errors
from services.conductor.drivers import volumes
from services.conductor.drivers.base import BaseInterface, Task


def check_capability(interface: BaseInterface | None, capability: str) -> bool:
    """Whether ``interface`` declares ``capability``; False when it declares
    nothing (Ironic's ``check_interface_capability``)."""
    return capability in (getattr(interface, "capabilities", None) or ())


@dataclass(frozen=True)
class Need:
    """The node needs ``capability`` of its ``kind`` interface, ``because``..."""

    kind: str
    capability: str
    because: str


Rule = Callable[[Task], Iterable[Need]]


def volume_boot_needs(task: Task) -> Iterator[Need]:
    """A boot volume (the target with boot_index 0) that the network boot
    starts (seed 004 scenarios 1, 2, 5) needs the boot interface to say it can
    boot that volume type. Through an HBA (``hba_boot``, scenarios 3, 4) the
    firmware boots it as a disk, and other targets are data volumes the booted
    OS attaches: they need nothing of the boot interface (as in Ironic)."""
    boot = volumes.boot_volume(task)
    if boot is not None and volumes.netboots_volume(task):
        # Matched exactly, as the iPXE renderer matches it: "ISCSI" is no iSCSI volume there.
        volume_type = str(boot.get("volume_type") or "")
        yield Need(
            "boot",
            f"{volume_type}_volume_boot",
            f"its boot volume (volume target {boot.get('uuid')}) is of type {volume_type!r}",
        )


def volume_deploy_needs(task: Task) -> Iterator[Need]:
    """A node with a boot volume needs a deploy interface that knows it:
    ``boot_from_volume`` (it writes no image when the OS is on the volume), and
    ``<type>_volume_deploy`` when it writes the image onto the volume
    (``force_deployment``, scenario 4)."""
    boot = volumes.boot_volume(task)
    if boot is None:
        return
    yield Need(
        "deploy",
        "boot_from_volume",
        f"it boots from volume target {boot.get('uuid')}, and the deploy must not write an image elsewhere",
    )
    if volumes.force_deployment(task.node):
        volume_type = str(boot.get("volume_type") or "")
        yield Need(
            "deploy",
            f"{volume_type}_volume_deploy",
            f"instance_info force_deployment writes its image onto its {volume_type} boot volume",
        )


def ramdisk_deploy_needs(task: Task) -> Iterator[Need]:
    """A ramdisk deploy's instance is a kernel and ramdisk the boot interface starts on every boot."""
    if check_capability(task.driver.deploy, "ramdisk_deploy"):
        yield Need(
            "boot",
            "ramdisk_boot",
            f"its deploy interface {task.driver.deploy.name!r} boots the instance from a ramdisk",
        )


RULES: tuple[Rule, ...] = (volume_boot_needs, volume_deploy_needs, ramdisk_deploy_needs)


@dataclass(frozen=True)
class Unmet:
    need: Need
    interface: BaseInterface


def unmet(task: Task, *, kinds: Iterable[str] | None = None, rules: Iterable[Rule] = RULES) -> list[Unmet]:
    """The needs of the task's node its interfaces do not meet (only of ``kinds`` when given)."""
    wanted = None if kinds is None else set(kinds)
    found = []
    for rule in rules:
        for need in rule(task):
            if wanted is not None and need.kind not in wanted:
                continue
            interface = getattr(task.driver, need.kind)
            if not check_capability(interface, need.capability):
                found.append(Unmet(need, interface))
    return found


def describe(task: Task, missing: Unmet, *, alternatives: Iterable[str] = ()) -> str:
    """One sentence naming the interface, the capability and why it is needed."""
    need = missing.need
    text = (
        f"The {need.kind} interface {missing.interface.name!r} of node {task.node['uuid']} lacks the capability "
        f"{need.capability!r}, which the node needs: {need.because}."
    )
    others = list(alternatives)
    if others:
        text += f" {need.kind.capitalize()} interfaces of hardware type {task.node['driver']} that have it: {', '.join(others)}."
    else:
        text += f" No enabled {need.kind} interface of hardware type {task.node['driver']} has it."
    return text


def check(
    task: Task,
    *,
    kinds: Iterable[str] | None = None,
    rules: Iterable[Rule] = RULES,
    alternatives: Callable[[str, str], list[str]] | None = None,
) -> None:
    """Raise InvalidParameterValue (400) for the first unmet need.

    ``alternatives(kind, capability)`` names the implementations that would
    do, so the message says what to switch to."""
    for missing in unmet(task, kinds=kinds, rules=rules):
        others = alternatives(missing.need.kind, missing.need.capability) if alternatives else []
        raise errors.InvalidParameterValue(describe(task, missing, alternatives=others))
