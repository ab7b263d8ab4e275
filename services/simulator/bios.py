"""A simulated machine's BIOS settings, as a Redfish BMC keeps them.

The attributes and their rules come from one attribute registry (``REGISTRY``,
served as a DMTF AttributeRegistry; the names and values are those of common
server BIOSes). A client changes nothing directly: it stages values in the
pending settings (the ``@Redfish.Settings`` SettingsObject), which the
firmware applies at the next power on or reset, as real machines do during
POST. Two kinds of refusal, like real BMCs:

- when staging (PATCH): an unknown name, a read-only attribute, a value of the
  wrong JSON type, outside the allowed values, bounds or length. Nothing of a
  refused request is staged.
- when applying (power on): a value whose dependency does not hold on the
  machine as it would be (``SecureBoot`` Enabled needs ``BootMode`` Uefi). The
  other pending values are applied; that one is not, and the result says why
  in ``messages`` (the SettingsObject's ``Messages``).

``ResetBios`` asks for factory defaults at the next power on; values staged
after it are applied on top of the defaults.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

REGISTRY_ID = "FerrumBiosRegistry.1.0.0"
REGISTRY_LANGUAGE = "en"


@dataclass(frozen=True)
class Attribute:
    """One registry entry: its type, default and constraints."""

    name: str
    kind: str  # Enumeration, Integer, String, Boolean (the registry's Type)
    default: Any
    display: str
    values: tuple[str, ...] = ()
    lower: int | None = None
    upper: int | None = None
    min_length: int | None = None
    max_length: int | None = None
    read_only: bool = False
    unique: bool = False

    def registry_entry(self) -> dict[str, Any]:
        """The entry as a DMTF AttributeRegistry lists it."""
        entry: dict[str, Any] = {
            "AttributeName": self.name,
            "DisplayName": self.display,
            "Type": self.kind,
            "ReadOnly": self.read_only,
            "ResetRequired": True,
            "IsSystemUniqueProperty": self.unique,
            "Immutable": self.read_only,
        }
        if not self.unique:
            entry["DefaultValue"] = self.default
        if self.values:
            entry["Value"] = [{"ValueName": v, "ValueDisplayName": v} for v in self.values]
        for key, value in (
            ("LowerBound", self.lower),
            ("UpperBound", self.upper),
            ("MinLength", self.min_length),
            ("MaxLength", self.max_length),
        ):
            if value is not None:
                entry[key] = value
        return entry


ON_OFF = ("Enabled", "Disabled")
REGISTRY: tuple[Attribute, ...] = (
    Attribute("BootMode", "Enumeration", "Uefi", "Boot Mode", values=("Uefi", "Bios")),
    Attribute("SecureBoot", "Enumeration", "Disabled", "Secure Boot (needs UEFI boot mode)", values=ON_OFF),
    Attribute("ProcTurboMode", "Enumeration", "Enabled", "Turbo Boost", values=ON_OFF),
    Attribute("ProcVirtualization", "Enumeration", "Enabled", "Virtualization Technology", values=ON_OFF),
    Attribute("LogicalProc", "Enumeration", "Enabled", "Logical Processor (Hyper-Threading)", values=ON_OFF),
    Attribute("SriovGlobalEnable", "Enumeration", "Disabled", "SR-IOV Global Enable", values=ON_OFF),
    Attribute(
        "SysProfile",
        "Enumeration",
        "PerfPerWattOptimizedDapc",
        "System Profile",
        values=("PerfPerWattOptimizedDapc", "PerfOptimized", "Custom"),
    ),
    Attribute("PxeDev1EnDis", "Enumeration", "Enabled", "PXE Device 1", values=ON_OFF),
    Attribute("AcPwrRcvryUserDelay", "Integer", 60, "AC Power Recovery Delay (s)", lower=60, upper=240),
    Attribute("AssetTag", "String", "", "Asset Tag", min_length=0, max_length=63),
    Attribute("QuietBoot", "Boolean", True, "Quiet Boot"),
    Attribute("SerialNumber", "String", "", "System Serial Number", read_only=True, unique=True),
)
BY_NAME: Mapping[str, Attribute] = {a.name: a for a in REGISTRY}


@dataclass(frozen=True)
class Problem:
    """Why the BMC refuses or did not apply a value: a Base registry MessageId and its text."""

    message_id: str
    message: str

    def extended_info(self, severity: str = "Warning") -> dict[str, Any]:
        return {"MessageId": self.message_id, "Message": self.message, "Severity": severity}


def staging_problems(values: Mapping[str, Any]) -> list[Problem]:
    """Every reason the BMC refuses to stage ``values`` (Base registry messages)."""
    problems = []
    for name, value in values.items():
        attribute = BY_NAME.get(name)
        if attribute is None:
            problems.append(
                Problem(
                    "Base.1.0.PropertyUnknown",
                    f"The property {name} is not in the list of valid properties for the resource.",
                )
            )
            continue
        if attribute.read_only:
            problems.append(
                Problem(
                    "Base.1.0.PropertyNotWritable",
                    f"The property {name} is a read only property and cannot be assigned a value.",
                )
            )
            continue
        problem = _value_problem(attribute, value)
        if problem is not None:
            problems.append(problem)
    return problems


def _value_problem(attribute: Attribute, value: Any) -> Problem | None:
    name, shown = attribute.name, repr(value)
    wrong_type = Problem(
        "Base.1.0.PropertyValueTypeError",
        f"The value {shown} for the property {name} is of a different type than the property can accept "
        f"({attribute.kind}).",
    )
    if attribute.kind == "Enumeration":
        if not isinstance(value, str):
            return wrong_type
        if value not in attribute.values:
            return Problem(
                "Base.1.0.PropertyValueNotInList",
                f"The value {shown} for the property {name} is not in the list of acceptable values "
                f"({', '.join(attribute.values)}).",
            )
    elif attribute.kind == "Integer":
        if not isinstance(value, int) or isinstance(value, bool):
            return wrong_type
        if (attribute.lower is not None and value < attribute.lower) or (
            attribute.upper is not None and value > attribute.upper
        ):
            return Problem(
                "Base.1.0.PropertyValueOutOfRange",
                f"The value {shown} for the property {name} is not in the supported range "
                f"{attribute.lower}-{attribute.upper}.",
            )
    elif attribute.kind == "Boolean":
        if not isinstance(value, bool):
            return wrong_type
    elif attribute.kind == "String":
        if not isinstance(value, str):
            return wrong_type
        if (attribute.min_length is not None and len(value) < attribute.min_length) or (
            attribute.max_length is not None and len(value) > attribute.max_length
        ):
            return Problem(
                "Base.1.0.PropertyValueFormatError",
                f"The value {shown} for the property {name} must be {attribute.min_length} to "
                f"{attribute.max_length} characters long.",
            )
    return None


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


class MachineBios:
    """Current and pending attributes of one machine, and the result of the last apply."""

    def __init__(self, *, serial_number: str) -> None:
        self.unique = {"SerialNumber": serial_number}
        self.current: dict[str, Any] = self.defaults()
        self.pending: dict[str, Any] = {}
        self.reset_requested = False
        self.applied_at: str | None = None
        self.messages: list[dict[str, Any]] = []

    def defaults(self) -> dict[str, Any]:
        """Factory values; the machine's own for the unique read-only ones."""
        return {a.name: self.unique.get(a.name, a.default) for a in REGISTRY}

    def stage(self, values: Mapping[str, Any]) -> list[Problem]:
        """Stage ``values`` for the next power on, all or none; the problems otherwise."""
        problems = staging_problems(values)
        if not problems:
            self.pending.update(values)
        return problems

    def request_reset(self) -> None:
        """ResetBios: factory defaults at the next power on (staged values go on top)."""
        self.reset_requested = True

    def apply_pending(self) -> dict[str, Any] | None:
        """Power on: what the firmware does with the staged values during POST.
        Returns what happened (for the machine's record), None when nothing was staged."""
        if not self.pending and not self.reset_requested:
            return None
        before = dict(self.current)
        result = self.defaults() if self.reset_requested else dict(self.current)
        result.update(self.pending)
        refused: dict[str, Problem] = {}
        if result["SecureBoot"] == "Enabled" and result["BootMode"] != "Uefi":
            # The dependency fails: the value that was staged does not take effect.
            culprit = "SecureBoot" if "SecureBoot" in self.pending else "BootMode"
            result[culprit] = before[culprit]
            refused[culprit] = Problem(
                "Base.1.0.PropertyValueConflict",
                f"The value {self.pending[culprit]!r} for the property {culprit} was not applied: "
                "SecureBoot can be Enabled only while BootMode is Uefi.",
            )
        self.current = result
        self.messages = [p.extended_info() for p in refused.values()] or [
            {"MessageId": "Base.1.0.Success", "Message": "Successfully Completed Request", "Severity": "OK"}
        ]
        self.applied_at = _now()
        summary = {
            "applied": sorted(set(self.pending) - set(refused)),
            "reset": self.reset_requested,
            "refused": [p.message for p in refused.values()],
        }
        self.pending, self.reset_requested = {}, False
        return summary
