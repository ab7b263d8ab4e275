"""Loading enabled implementations and composing node drivers.

Operators enable hardware types and implementations by name in the conductor
config; what is installed comes from entry points (``installed.py``). The
composition is checked once, when the conductor starts, so a mistake stops
the start with a message naming it instead of surfacing later as a node that
silently lacks an interface:

- an enabled name that nothing installs;
- a hardware type that declares an unknown kind, or an implementation that
  no entry point provides (a typo in ``supported``);
- a hardware type left with no enabled implementation of some kind, so its
  nodes could get no default.

An implementation enabled in the config that no enabled hardware type offers
is fine: it is loaded and simply unused.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from services.common import errors
from services.common.config import ConductorConfig
from services.conductor.drivers import base
from services.conductor.drivers.hardware import HardwareType
from services.conductor.drivers.installed import Installed, interface_group


class DriverRegistry:
    """The hardware types and interface implementations this conductor runs."""

    def __init__(self, config: ConductorConfig, installed: Installed | None = None) -> None:
        installed = installed if installed is not None else Installed.from_entry_points()
        options = dict(vars(config))
        self.hardware_types: dict[str, type[HardwareType]] = {
            name: installed.load_hardware_type(name) for name in config.enabled_hardware_types
        }
        for name, hw in self.hardware_types.items():
            _check_declarations(name, hw, installed)
        self.enabled: dict[str, dict[str, base.BaseInterface]] = {
            kind: {
                name: installed.load_interface(kind, name)(options)
                for name in getattr(config, f"enabled_{kind}_interfaces")
            }
            for kind in base.INTERFACE_KINDS
        }
        for name, hw in self.hardware_types.items():
            for kind in base.INTERFACE_KINDS:
                if not self.supported(name, kind):
                    raise errors.DriverLoadError(
                        f"hardware type {name!r} has no enabled {kind} interface: it supports "
                        f"{list(hw.supported_names(kind))}, enabled_{kind}_interfaces is {list(self.enabled[kind])}"
                    )

    @classmethod
    def from_classes(
        cls,
        config: ConductorConfig,
        *,
        hardware_types: Mapping[str, type[HardwareType]],
        interfaces: Mapping[str, Mapping[str, type[base.BaseInterface]]],
        with_entry_points: bool = True,
    ) -> DriverRegistry:
        """A registry that also knows the given classes under the given names,
        exactly as if they were installed as entry points."""
        explicit = Installed.from_classes(hardware_types, interfaces)
        installed = Installed.from_entry_points().merged(explicit) if with_entry_points else explicit
        return cls(config, installed)

    def supported(self, hardware_type: str, kind: str) -> list[str]:
        """Enabled implementations of ``kind`` usable with the type, default first."""
        hw = self._type(hardware_type)
        enabled = self.enabled[kind]
        declared = [n for n in hw.supported_names(kind) if n in enabled]
        if hw.accepts_any_enabled:
            return declared + [n for n in enabled if n not in declared]
        return declared

    def offering(self, hardware_type: str, kind: str, capability: str) -> list[str]:
        """The usable implementations of ``kind`` that have ``capability``."""
        return [n for n in self.supported(hardware_type, kind) if capability in self.enabled[kind][n].capabilities]

    def _type(self, hardware_type: str) -> type[HardwareType]:
        try:
            return self.hardware_types[hardware_type]
        except KeyError:
            raise errors.DriverNotFound(
                f"No valid host was found. Reason: No conductor service registered which supports "
                f'driver {hardware_type} for conductor group "".'
            ) from None

    def resolve_interfaces(self, hardware_type: str, requested: Mapping[str, str | None]) -> dict[str, str]:
        """Fill unset ``<kind>_interface`` fields with defaults and check the set ones."""
        resolved: dict[str, str] = {}
        for kind in base.INTERFACE_KINDS:
            field = f"{kind}_interface"
            wanted = requested.get(field)
            options = self.supported(hardware_type, kind)
            if wanted:
                if wanted not in options:
                    raise errors.InvalidParameterValue(
                        f"Could not find the following interface in the '{interface_group(kind)}' "
                        f"entrypoint: {wanted}. Valid interfaces are {options}."
                    )
                resolved[field] = wanted
            elif options:
                resolved[field] = options[0]
            else:
                raise errors.InvalidParameterValue(
                    f"No default value found for {kind} interface of hardware type {hardware_type}"
                )
        return resolved

    def compose(self, node: Mapping[str, Any]) -> base.ComposedDriver:
        resolved = self.resolve_interfaces(node["driver"], node)
        parts = {kind: self.enabled[kind][resolved[f"{kind}_interface"]] for kind in base.INTERFACE_KINDS}
        return base.ComposedDriver(hardware_type=node["driver"], **parts)  # type: ignore[arg-type]

    def describe(self) -> dict[str, Any]:
        """What gets published in the conductors table for the api's driver views."""
        return {hw: {kind: self.supported(hw, kind) for kind in base.INTERFACE_KINDS} for hw in self.hardware_types}

    def properties(self, hardware_type: str) -> dict[str, str]:
        props: dict[str, str] = {}
        for kind in base.INTERFACE_KINDS:
            for name in self.supported(hardware_type, kind)[:1]:
                props.update(self.enabled[kind][name].get_properties())
        return props


def _check_declarations(name: str, hw: type[HardwareType], installed: Installed) -> None:
    """Every kind and implementation a hardware type names must exist."""
    unknown_kinds = sorted(set(hw.supported) - set(base.INTERFACE_KINDS))
    if unknown_kinds:
        raise errors.DriverLoadError(
            f"hardware type {name!r} ({hw.__qualname__}) declares unknown interface kind(s) "
            f"{', '.join(map(repr, unknown_kinds))}; the kinds are {', '.join(base.INTERFACE_KINDS)}"
        )
    for kind in base.CORE_KINDS:
        if not hw.supported.get(kind):
            raise errors.DriverLoadError(
                f"hardware type {name!r} ({hw.__qualname__}) names no {kind} interface; "
                f"every hardware type must name its {', '.join(base.CORE_KINDS)} implementations"
            )
    for kind in base.INTERFACE_KINDS:
        for impl in hw.supported_names(kind):
            if impl not in installed.interfaces.get(kind, {}):
                raise errors.DriverLoadError(
                    f"hardware type {name!r} ({hw.__qualname__}) supports {kind} interface {impl!r}, but no "
                    f"entry point in {interface_group(kind)!r} provides it "
                    f"(installed: {', '.join(installed.names(kind)) or 'none'})"
                )
