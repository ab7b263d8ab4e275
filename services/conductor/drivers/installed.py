"""What hardware types and interface implementations are installed, by name.

Normally that is the entry points of the installed packages: hardware types
in ``ferrum.hardware.types`` and implementations of each kind in
``ferrum.hardware.interfaces.<kind>``. ``Installed.from_classes`` builds the
same thing from explicit classes, so tests (and the example in
docs/drivers.md) go through the very code the conductor runs without
installing a package or patching ``importlib.metadata``.

Loading is lazy: a class is imported only when the conductor enables it, so
an installed but disabled implementation costs nothing and cannot break the
start with its imports.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from importlib.metadata import EntryPoint, entry_points
from typing import Any

from services.common import errors
from services.conductor.drivers.base import INTERFACE_KINDS, KIND_BASES, BaseInterface
from services.conductor.drivers.hardware import HardwareType

TYPE_GROUP = "ferrum.hardware.types"
INTERFACE_GROUP = "ferrum.hardware.interfaces."

Loader = Callable[[], Any]


def interface_group(kind: str) -> str:
    return INTERFACE_GROUP + kind


@dataclass(frozen=True)
class Installed:
    """Loaders by name: ``hardware_types[name]`` and ``interfaces[kind][name]``."""

    hardware_types: Mapping[str, Loader]
    interfaces: Mapping[str, Mapping[str, Loader]] = field(default_factory=dict)

    @classmethod
    def from_entry_points(cls, extra: Iterable[EntryPoint] = ()) -> Installed:
        """The installed packages' entry points, plus ``extra`` ones (which win
        on a name both provide): a package's declarations, loaded as pip would."""
        found = [*entry_points(group=TYPE_GROUP)]
        for kind in INTERFACE_KINDS:
            found.extend(entry_points(group=interface_group(kind)))
        by_group: dict[str, dict[str, Loader]] = {}
        for ep in [*found, *extra]:
            by_group.setdefault(ep.group, {})[ep.name] = ep.load
        return cls(
            hardware_types=by_group.get(TYPE_GROUP, {}),
            interfaces={kind: by_group.get(interface_group(kind), {}) for kind in INTERFACE_KINDS},
        )

    @classmethod
    def from_classes(
        cls,
        hardware_types: Mapping[str, type[HardwareType]],
        interfaces: Mapping[str, Mapping[str, type[BaseInterface]]],
    ) -> Installed:
        """Explicit classes, registered exactly as entry points of those names would be."""
        return cls(
            hardware_types={name: _constant(c) for name, c in hardware_types.items()},
            interfaces={kind: {name: _constant(c) for name, c in named.items()} for kind, named in interfaces.items()},
        )

    def merged(self, other: Installed) -> Installed:
        """Both sets; ``other`` wins on a name both provide."""
        kinds = set(self.interfaces) | set(other.interfaces)
        return Installed(
            hardware_types={**self.hardware_types, **other.hardware_types},
            interfaces={k: {**self.interfaces.get(k, {}), **other.interfaces.get(k, {})} for k in kinds},
        )

    def names(self, kind: str) -> list[str]:
        """Installed implementation names of ``kind``, sorted."""
        return sorted(self.interfaces.get(kind, {}))

    def load_hardware_type(self, name: str) -> type[HardwareType]:
        if name not in self.hardware_types:
            raise errors.DriverLoadError(
                f"enabled hardware type {name!r} is not installed: no entry point {name!r} in "
                f"{TYPE_GROUP!r} (installed: {', '.join(sorted(self.hardware_types)) or 'none'})"
            )
        loaded = self.hardware_types[name]()
        if not (isinstance(loaded, type) and issubclass(loaded, HardwareType)):
            raise errors.DriverLoadError(
                f"entry point {name!r} in {TYPE_GROUP!r} is {loaded!r}, not a HardwareType subclass"
            )
        return loaded

    def load_interface(self, kind: str, name: str) -> type[BaseInterface]:
        group = interface_group(kind)
        if name not in self.interfaces.get(kind, {}):
            raise errors.DriverLoadError(
                f"enabled {kind} interface {name!r} is not installed: no entry point {name!r} in {group!r} "
                f"(installed: {', '.join(self.names(kind)) or 'none'})"
            )
        loaded = self.interfaces[kind][name]()
        expected = KIND_BASES[kind]
        if not (isinstance(loaded, type) and issubclass(loaded, expected)):
            raise errors.DriverLoadError(
                f"entry point {name!r} in {group!r} is {loaded!r}, not a {expected.__name__} subclass"
            )
        if loaded.name != name:
            # Nodes store the entry point's name and messages use the class's: they must agree.
            raise errors.DriverLoadError(
                f"entry point {name!r} in {group!r} loads {loaded.__qualname__}, whose name is {loaded.name!r}"
            )
        return loaded


def _constant(value: Any) -> Loader:
    return lambda: value
