"""Drivers (hardware types): ``GET /v1/drivers``, ``GET /v1/drivers/{name}``,
``GET /v1/drivers/{name}/properties`` and
``GET /v1/drivers/{name}/raid/logical_disk_properties`` (1.12).

What a driver is and which conductors run it come from the live hash ring
(conductors register their hardware types and interfaces), so nothing here
reads the database. Only dynamic drivers exist, as in current Ironic.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from services.api import params, views
from services.api.context import ApiContext
from services.common import errors, raid_config

FIELDS_SINCE = (1, 77)
DETAIL_SINCE = (1, 30)
DRIVER_INTERFACE_KINDS = (
    "bios",
    "boot",
    "console",
    "deploy",
    "inspect",
    "management",
    "network",
    "power",
    "raid",
    "rescue",
    "storage",
    "vendor",
    "firmware",
)
FIRMWARE_SINCE = (1, 86)  # default_firmware_interface and enabled_firmware_interfaces
DRIVER_FIELDS = frozenset(
    (
        "name",
        "hosts",
        "type",
        "links",
        "properties",
        *(f"default_{k}_interface" for k in DRIVER_INTERFACE_KINDS),
        *(f"enabled_{k}_interfaces" for k in DRIVER_INTERFACE_KINDS),
    )
)


class DriversApi:
    def __init__(self, ctx: ApiContext) -> None:
        self.ctx = ctx

    def _driver_doc(self, request: web.Request, name: str, hosts: list[str]) -> dict[str, Any]:
        base = self.ctx.base(request)
        doc: dict[str, Any] = {
            "name": name,
            "hosts": sorted(hosts),
            "type": "dynamic",
            "links": views.links(base, "drivers", name),
            "properties": views.links(base, "drivers", name + "/properties"),
        }
        return doc

    def _driver_fields(self, request: web.Request) -> list[str] | None:
        """``?fields=`` on drivers (1.77): 406 below it, 400 for an unknown name."""
        raw = request.query.get("fields")
        if raw is None:
            return None
        params.require_version(request, FIELDS_SINCE, "The fields parameter on drivers")
        wanted = [f.strip() for f in raw.split(",") if f.strip()]
        for name in wanted:
            if name not in DRIVER_FIELDS:
                raise errors.InvalidParameterValue(f'Field(s) "{name}" are not valid')
            if "_firmware_interface" in name and request["version"] < FIRMWARE_SINCE:
                version = request["version"]
                raise errors.NotAcceptable(f"Field {name} is not supported at API version {version[0]}.{version[1]}")
        return wanted or None

    def _driver_interfaces(self, request: web.Request, doc: dict[str, Any], name: str, hosts: list[str]) -> None:
        conductor = self.ctx.router.rings.conductors[hosts[0]]
        for kind, names in conductor["interfaces"].get(name, {}).items():
            if kind not in DRIVER_INTERFACE_KINDS or (kind == "firmware" and request["version"] < FIRMWARE_SINCE):
                continue
            doc[f"default_{kind}_interface"] = names[0] if names else None
            doc[f"enabled_{kind}_interfaces"] = names

    async def list_drivers(self, request: web.Request) -> web.Response:
        fields = self._driver_fields(request)
        if fields is not None and request.query.get("detail") is not None:
            raise errors.InvalidParameterValue("Can not specify ?detail=True and fields in the same request.")
        detail = params.optional_bool(request, "detail")
        if detail is not None:
            params.require_version(request, DETAIL_SINCE, "The detail parameter on drivers")
        drivers = self.ctx.router.hardware_types()
        driver_type = request.query.get("type")
        if driver_type == "classic":
            drivers = {}
        docs = []
        for name, hosts in sorted(drivers.items()):
            doc = self._driver_doc(request, name, hosts)
            if fields is not None or detail:
                # Ironic's detail view: every default_*/enabled_* interface field.
                self._driver_interfaces(request, doc, name, hosts)
            if fields is not None:
                doc = {k: v for k, v in doc.items() if k in fields}
            docs.append(doc)
        return web.json_response({"drivers": docs})

    async def get_driver(self, request: web.Request) -> web.Response:
        fields = self._driver_fields(request)
        name = request.match_info["name"]
        drivers = self.ctx.router.hardware_types()
        if name not in drivers:
            raise errors.NotFound(f"Driver {name} could not be found.")
        doc = self._driver_doc(request, name, drivers[name])
        self._driver_interfaces(request, doc, name, drivers[name])
        if fields is not None:
            doc = {k: v for k, v in doc.items() if k in fields}
        return web.json_response(doc)

    async def raid_logical_disk_properties(self, request: web.Request) -> web.Response:
        """What a logical disk of a target RAID config may say (1.12), with a description each.

        Every raid interface Ferrum ships, ``no-raid`` included, reads Ironic's RAID
        schema (services/common/raid_config.py), so the driver's default raid
        interface would answer the same: the schema's properties, for any driver a
        conductor runs. An unknown driver is a 404."""
        name = request.match_info["driver"]
        if name not in self.ctx.router.hardware_types():
            raise errors.NotFound(f"Driver {name} could not be found.")
        return web.json_response(raid_config.logical_disk_properties())

    async def driver_properties(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        if name not in self.ctx.router.hardware_types():
            raise errors.NotFound(f"Driver {name} could not be found.")
        return web.json_response({})
