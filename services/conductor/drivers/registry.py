"""Loading enabled implementations by entry point and composing node drivers.

Implementations register under the entry-point group
``ferrum.hardware.interfaces.<kind>`` and hardware types under
``ferrum.hardware.types``; operators enable them by name in the conductor
config. Unknown names fail the conductor at start with a clear message.
"""

from __future__ import annotations

from collections.abc import Mapping
from importlib.metadata import entry_points
from typing import Any

from services.common import errors
from services.common.config import ConductorConfig
from services.conductor.drivers import base
from services.conductor.drivers.hardware import HardwareType

INTERFACE_GROUP = "ferrum.hardware.interfaces."
TYPE_GROUP = "ferrum.hardware.types"


def _load_group(group: str) -> dict[str, Any]:
    return {ep.name: ep for ep in entry_points(group=group)}


class DriverRegistry:
    """The hardware types and interface implementations this conductor runs."""

    def __init__(self, config: ConductorConfig) -> None:
        options = dict(vars(config))
        type_eps = _load_group(TYPE_GROUP)
        self.hardware_types: dict[str, type[HardwareType]] = {}
        for name in config.enabled_hardware_types:
            if name not in type_eps:
                raise errors.InvalidParameterValue(
                    f"enabled hardware type {name!r} is not installed (known: {', '.join(sorted(type_eps))})"
                )
            self.hardware_types[name] = type_eps[name].load()
        self.enabled: dict[str, dict[str, base.BaseInterface]] = {}
        for kind in base.INTERFACE_KINDS:
            eps = _load_group(INTERFACE_GROUP + kind)
            chosen: dict[str, base.BaseInterface] = {}
            for name in getattr(config, f"enabled_{kind}_interfaces"):
                if name not in eps:
                    raise errors.InvalidParameterValue(
                        f"enabled {kind} interface {name!r} is not installed (known: {', '.join(sorted(eps))})"
                    )
                chosen[name] = eps[name].load()(options)
            self.enabled[kind] = chosen

    def supported(self, hardware_type: str, kind: str) -> list[str]:
        """Enabled implementations of ``kind`` usable with the type, default first."""
        hw = self._type(hardware_type)
        enabled = list(self.enabled[kind])
        declared = [n for n in hw.supported.get(kind, ()) if n in self.enabled[kind]]
        if hw.accepts_any_enabled:
            return declared + [n for n in enabled if n not in declared]
        return declared

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
                        f"Could not find the following interface in the 'ferrum.hardware.interfaces.{kind}' "
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
