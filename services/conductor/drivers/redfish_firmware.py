"""Redfish firmware interface (Ironic's ``redfish`` firmware, API 1.86): reads
a machine's firmware components through sushy for the node's firmware list.

As Ironic: ``bios`` from the ComputerSystem's BiosVersion, ``bmc`` from its
Manager's FirmwareVersion (with the Manager's Model as ``model``, 1.114).
NICs come from the UpdateService's FirmwareInventory: every entry whose
RelatedItem is one of the system's EthernetInterfaces becomes
``nic:<serial or id>`` with its Version, its Manufacturer as ``vendor``, its
SoftwareId as ``model`` and the serial number the entry carries (Ironic reads
NICs from the Chassis NetworkAdapters instead; Ferrum's simulator has no
Chassis, and a FirmwareInventory is what every Redfish update service offers).
A BMC without an UpdateService still gives bios and bmc.

Updating firmware (Redfish SimpleUpdate) is not implemented: the ``update``
step is not offered, so asking for it is the usual 400 naming what is.
"""

from __future__ import annotations

import logging
from typing import Any

from sushy import exceptions as sushy_exc

from services.conductor.drivers import base
from services.conductor.drivers.redfish import _RedfishBase

LOG = logging.getLogger(__name__)


class RedfishFirmware(_RedfishBase, base.FirmwareInterface):
    name = "redfish"

    def __init__(self, options: Any = None) -> None:
        super().__init__(options)
        self._setup()

    async def update(self, task: base.Task, settings: list[dict[str, Any]]) -> str | None:
        raise base.unsupported(self, "firmware updates")

    async def read_components(self, task: base.Task) -> list[dict[str, Any]]:
        info = self.redfish_info(task.node)
        root = self.connections.root  # a cached, logged-in sushy root per BMC

        def read(system: Any) -> list[dict[str, Any]]:
            return _components(root(info), system)

        return list(await self._info_call(info, "read the firmware components", read))


def _components(root: Any, system: Any) -> list[dict[str, Any]]:
    """Blocking: bios, bmc and the NICs' entries of the firmware inventory."""
    found: list[dict[str, Any]] = []
    if system.bios_version:
        found.append(_component("bios", system.bios_version))
    for manager in system.managers[:1]:
        if manager.firmware_version:
            found.append(_component("bmc", manager.firmware_version, model=manager.model))
    nics = f"{system.path.rstrip('/')}/EthernetInterfaces/"
    try:
        inventory = root.get_update_service().firmware_inventory.get_members()
    except (sushy_exc.MissingAttributeError, sushy_exc.ResourceNotFoundError, sushy_exc.BadRequestError) as exc:
        LOG.debug("no firmware inventory system=%s: %s", system.identity, exc)
        return found
    for item in inventory:
        related = [r.get("@odata.id", "") for r in (item.related_item or []) if isinstance(r, dict)]
        if not item.version or not any(r.startswith(nics) for r in related):
            continue
        serial = ((item.json.get("Oem") or {}).get("Ferrum") or {}).get("SerialNumber") or item.json.get("SerialNumber")
        found.append(
            _component(
                f"nic:{serial or item.identity}",
                item.version,
                vendor=item.manufacturer,
                model=item.software_id,
                serial_number=serial,
            )
        )
    return found


def _component(
    name: str, version: str, *, vendor: str | None = None, model: str | None = None, serial_number: str | None = None
) -> dict[str, Any]:
    return {
        "component": name,
        "current_version": str(version),
        "vendor": vendor,
        "model": model,
        "serial_number": serial_number,
    }
