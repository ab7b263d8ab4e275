"""Explicit no-op and "not supported" implementations for optional interfaces,
so a composed driver never has a hole where an interface should be."""

from __future__ import annotations

from services.conductor.drivers import base


class NoopStorage(base.StorageInterface):
    """No volumes: the image is always written to the local disk."""

    name = "noop"


class NoopNetwork(base.NetworkInterface):
    """Flat network; VIFs are bookkeeping only (what Nova needs)."""

    name = "noop"


class NoVendor(base.VendorInterface):
    name = "no-vendor"


class NoInspect(base.InspectInterface):
    name = "no-inspect"

    async def inspect_hardware(self, task: base.Task) -> str:
        from services.common import errors

        raise errors.InvalidParameterValue("inspection is not supported by interface no-inspect")
