"""Hardware types: declarations of which implementations a kind of machine
supports per interface kind, the first enabled one being the default.

A type must name its core kinds (power, management, boot, deploy). An
optional kind it does not name gets the kind's ``noop``/``no-*``
implementation, and that implementation is always among the supported ones,
so an operator can switch any node's optional interface off. The names are
checked against what is installed when the conductor loads them
(``DriverRegistry``).
"""

from __future__ import annotations

from typing import ClassVar

from services.conductor.drivers.base import OPTIONAL_KIND_DEFAULTS


class HardwareType:
    name: ClassVar[str] = ""
    supported: ClassVar[dict[str, tuple[str, ...]]] = {}
    # fake-hardware accepts any enabled implementation of any interface, so real
    # boot/deploy logic can run against fake power (CONTRACT.md section 8).
    accepts_any_enabled: ClassVar[bool] = False

    @classmethod
    def supported_names(cls, kind: str) -> tuple[str, ...]:
        """What this type supports for ``kind``, default first; the kind's
        no-op implementation last when the kind is optional."""
        declared = tuple(cls.supported.get(kind, ()))
        noop = OPTIONAL_KIND_DEFAULTS.get(kind)
        if noop is None or noop in declared:
            return declared
        return (*declared, noop)


class FakeHardware(HardwareType):
    name = "fake-hardware"
    accepts_any_enabled = True
    supported: ClassVar[dict[str, tuple[str, ...]]] = {
        "power": ("fake",),
        "management": ("fake",),
        "boot": ("fake", "ipxe"),
        "deploy": ("fake", "direct", "iscsi"),
        "storage": ("fake", "noop", "external", "cinder"),
        "network": ("noop",),
        "vendor": ("fake", "no-vendor"),
        "inspect": ("fake", "agent", "no-inspect"),
        "rescue": ("fake", "agent", "no-rescue"),
        "bios": ("fake", "no-bios"),
        "firmware": ("no-firmware", "fake"),
        # Ironic's order: fake, then no-raid before agent (fake is enabled per deployment).
        "raid": ("fake", "no-raid", "agent"),
    }


class RedfishHardware(HardwareType):
    """Servers with a Redfish BMC (and Ferrum's simulator)."""

    name = "redfish"
    supported: ClassVar[dict[str, tuple[str, ...]]] = {
        "power": ("redfish",),
        "management": ("redfish",),
        "boot": ("ipxe", "redfish-virtual-media", "fake"),
        "deploy": ("direct", "iscsi", "ramdisk", "fake"),
        "storage": ("noop", "external", "cinder", "fake"),
        "network": ("noop",),
        "vendor": ("no-vendor",),
        "inspect": ("no-inspect", "agent"),
        "rescue": ("no-rescue", "agent"),
        # no-console first: a real BMC's console is chosen per node (docs/console.md);
        # simulator reads the console log Ferrum's simulator keeps, ipmitool-socat the SOL
        # of a BMC that also speaks IPMI (with the node's ipmi_* driver_info),
        # redfish-graphical relays the VNC console a BMC's GraphicalConsole advertises.
        "console": ("no-console", "ipmitool-socat", "simulator", "redfish-graphical"),
        # BIOS settings through the System's Bios resource (drivers/redfish_bios.py), as Ironic.
        "bios": ("redfish", "no-bios"),
        # no-firmware first: reading the firmware inventory is asked for per node (API 1.86).
        "firmware": ("no-firmware", "redfish"),
        # Software RAID by the ramdisk's agent where it offers it (drivers/agent_raid.py).
        "raid": ("no-raid", "agent"),
    }


class IpmiHardware(HardwareType):
    """Servers with an IPMI 2.0 BMC (Ironic's ``ipmi`` type), driven through pyghmi."""

    name = "ipmi"
    supported: ClassVar[dict[str, tuple[str, ...]]] = {
        "power": ("ipmitool",),
        "management": ("ipmitool",),
        "boot": ("ipxe", "fake"),
        "deploy": ("direct", "iscsi", "ramdisk", "fake"),
        "storage": ("noop", "external", "cinder", "fake"),
        "network": ("noop",),
        "vendor": ("no-vendor",),
        "inspect": ("no-inspect", "agent"),
        "rescue": ("no-rescue", "agent"),
        # Serial-over-LAN (Ironic's order); nodes get no-console until an operator enables it.
        "console": ("ipmitool-socat", "no-console"),
        "raid": ("no-raid", "agent"),
    }


class IloHardware(HardwareType):
    """HPE ProLiant servers with iLO 5 or later, driven over Redfish with iLO's fields and
    virtual media layout (drivers/ilo.py); Ironic removed its own ilo type in 2026."""

    name = "ilo"
    supported: ClassVar[dict[str, tuple[str, ...]]] = {
        "power": ("ilo",),
        "management": ("ilo",),
        "boot": ("ilo-virtual-media", "ipxe"),
        "deploy": ("direct", "iscsi", "ramdisk"),
        "storage": ("noop", "external"),
        "network": ("noop",),
        "vendor": ("no-vendor",),
        "inspect": ("no-inspect",),
        "console": ("no-console", "ipmitool-socat"),
    }
