"""Hardware types: declarations of which implementations a kind of machine
supports per interface, the first enabled one being the default."""

from __future__ import annotations

from typing import ClassVar


class HardwareType:
    name: ClassVar[str] = ""
    supported: ClassVar[dict[str, tuple[str, ...]]] = {}
    # fake-hardware accepts any enabled implementation of any interface, so real
    # boot/deploy logic can run against fake power (CONTRACT.md section 8).
    accepts_any_enabled: ClassVar[bool] = False


class FakeHardware(HardwareType):
    name = "fake-hardware"
    accepts_any_enabled = True
    supported: ClassVar[dict[str, tuple[str, ...]]] = {
        "power": ("fake",),
        "management": ("fake",),
        "boot": ("fake", "ipxe"),
        "deploy": ("fake", "direct"),
        "storage": ("fake", "noop"),
        "network": ("noop",),
        "vendor": ("fake", "no-vendor"),
        "inspect": ("fake", "no-inspect"),
    }


class RedfishHardware(HardwareType):
    """Servers with a Redfish BMC (and Ferrum's simulator)."""

    name = "redfish"
    supported: ClassVar[dict[str, tuple[str, ...]]] = {
        "power": ("redfish",),
        "management": ("redfish",),
        "boot": ("ipxe", "fake"),
        "deploy": ("direct", "fake"),
        "storage": ("noop", "fake"),
        "network": ("noop",),
        "vendor": ("no-vendor",),
        "inspect": ("no-inspect",),
    }
