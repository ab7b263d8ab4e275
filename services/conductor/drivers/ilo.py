"""The ``ilo`` interfaces: HPE iLO 5+ BMCs driven over Redfish, with iLO's fields and layout.

Ironic's ``ilo`` hardware type spoke proliantutils; iLO 5 and later speak
Redfish, which is what these interfaces use (through the ``redfish`` ones),
reading Ironic's ``ilo_*`` driver_info fields. What differs from plain
Redfish is the virtual media layout: the media live only under the Manager,
as two members, ``1`` (Floppy, USBStick) and ``2`` (CD, DVD), and a one-time
boot from the CD is the CD member's ``Oem.Hpe.BootOnNextServerReset``
(a PATCH), which ``ilo-virtual-media`` sets (seed 002: "boot once from the CD").
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from services.common import errors
from services.common.db.records import NodeRecord
from services.conductor.drivers import base
from services.conductor.drivers.capabilities import check_capability
from services.conductor.drivers.redfish import RedfishManagement, RedfishPower, _media_for
from services.conductor.drivers.redfish_client import RedfishInfo, parse_driver_info
from services.conductor.drivers.vmedia_boot import VirtualMediaBoot

PROLIANT_SYSTEM = "/redfish/v1/Systems/1"  # proliantutils' PROLIANT_SYSTEM_ID
ILO_PROPERTIES = {
    "ilo_address": "IP address or host name of the iLO (https, or the scheme given). Required.",
    "ilo_username": "User name for the iLO. Required.",
    "ilo_password": "Password for the iLO. Required.",
    "ilo_verify_ca": "true/false, or the path of a CA bundle file or directory. Default true.",
    "client_port": "Port of the iLO's HTTPS service. Default 443.",
    "ilo_system_id": "Path of the ComputerSystem. Default /redfish/v1/Systems/1 (Ferrum's addition, for "
    "BMCs that serve several systems such as its simulator).",
}
# The redfish field each iLO field becomes, so a message names the field the operator set.
_FIELD_NAMES = {
    "redfish_address": "ilo_address",
    "redfish_username": "ilo_username",
    "redfish_password": "ilo_password",
    "redfish_verify_ca": "ilo_verify_ca",
    "redfish_system_id": "ilo_system_id",
}


def parse_ilo_driver_info(node: Mapping[str, Any]) -> RedfishInfo:
    """The node's iLO settings as Redfish settings (Ironic's ``update_redfish_properties``); no network."""
    uuid = node.get("uuid", "?")
    info = node.get("driver_info") or {}
    missing = [k for k in ("ilo_address", "ilo_username", "ilo_password") if not info.get(k)]
    if missing:
        raise errors.MissingParameter(f"Node {uuid} is missing driver_info: {', '.join(missing)}")
    address = str(info["ilo_address"]).strip()
    port = info.get("client_port")
    if port not in (None, "") and (not str(port).isdigit() or not 0 < int(port) < 65536):
        raise errors.InvalidParameterValue(f"Node {uuid}: driver_info client_port must be a port number")
    if "://" not in address:
        host = f"[{address}]" if ":" in address and not address.startswith("[") else address
        address = f"https://{host}" + (f":{int(port)}" if port not in (None, "", 443, "443") else "")
    mapped = {
        "redfish_address": address,
        "redfish_username": info.get("ilo_username"),
        "redfish_password": info.get("ilo_password"),
        "redfish_verify_ca": info.get("ilo_verify_ca", True),
        "redfish_system_id": info.get("ilo_system_id") or PROLIANT_SYSTEM,
    }
    try:
        return parse_driver_info({"uuid": uuid, "driver_info": mapped})
    except errors.FerrumError as exc:
        message = exc.message
        for redfish, ilo in _FIELD_NAMES.items():
            message = message.replace(redfish, ilo)
        raise type(exc)(message) from None


class IloPower(RedfishPower):
    name = "ilo"

    def get_properties(self) -> dict[str, str]:
        return dict(ILO_PROPERTIES)

    def redfish_info(self, node: NodeRecord) -> RedfishInfo:
        return parse_ilo_driver_info(node)


class IloManagement(RedfishManagement):
    name = "ilo"
    capabilities = frozenset({"virtual_media", "boot_on_next_server_reset"})

    def get_properties(self) -> dict[str, str]:
        return dict(ILO_PROPERTIES)

    def redfish_info(self, node: NodeRecord) -> RedfishInfo:
        return parse_ilo_driver_info(node)

    async def set_boot_on_next_server_reset(self, task: base.Task) -> None:
        """Boot once from the virtual CD at the next reset: ``PATCH`` of the CD member's
        ``Oem.Hpe.BootOnNextServerReset`` (what proliantutils' ``set_vm_status(BOOT_ONCE)`` sends)."""

        def patch(system: Any) -> None:
            drives = _media_for(system, "cdrom")
            if not drives:
                raise errors.BMCError(f"iLO system {system.identity} has no virtual CD")
            drive = drives[0]
            drive._conn.patch(drive.path, data={"Oem": {"Hpe": {"BootOnNextServerReset": True}}})

        await self._call(task, "set the virtual CD to boot on the next server reset", patch)


class IloVirtualMediaBoot(VirtualMediaBoot):
    """The seed's iLO virtual-media boot: the parameters on a floppy, the deploy ISO in the CD,
    boot once from the CD through ``BootOnNextServerReset``; ``ilo_*`` field names accepted."""

    name = "ilo-virtual-media"
    aliases: ClassVar[Mapping[str, str]] = {
        "deploy_iso": "ilo_deploy_iso",
        "rescue_iso": "ilo_rescue_iso",
        "bootloader": "ilo_bootloader",
        "config_via_removable": "config_via_floppy",
    }

    async def boot_once_from_cd(self, task: base.Task) -> None:
        management: Any = task.driver.management
        if check_capability(management, "boot_on_next_server_reset"):
            await management.set_boot_on_next_server_reset(task)
        else:  # an iLO reached through the plain redfish interface: the standard one-time override
            await super().boot_once_from_cd(task)
