"""The simulator's BMC: one Redfish service for all its machines (aiohttp).

Enough of DMTF Redfish for sushy (and so Ironic-style drivers): the service
root, Systems with PowerState, Boot override (with allowable values), UUID,
EthernetInterfaces and the ComputerSystem.Reset action; a Bios resource with
pending settings applied at power on, ResetBios and its attribute registry
(redfish_bios.py); one Manager per
machine with Cd/Floppy VirtualMedia (InsertMedia checks the URL answers, then
records it; EjectMedia), or with ``bmc_profile="ilo"`` iLO 5's layout (members
1 = Floppy and 2 = CD under the Manager only, Oem.Hpe actions, one-time boot
by PATCHing Oem.Hpe.BootOnNextServerReset); a ``Console`` LogService per
system whose entries are the last lines of the machine's console (its serial
port, for a QEMU machine); SessionService sessions and HTTP basic auth. Plus a
JSON view of every machine at ``/simulator/machines`` for tests and demos.
Paths match with or without a trailing slash. A machine that cannot power on
(its VM does not start) gets a Redfish error, never a hang.
"""

from __future__ import annotations

import asyncio
import base64
import hmac
import json
import re
import secrets
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from aiohttp import web

from services.simulator import redfish_bios
from services.simulator.firmware import url_exists
from services.simulator.machine import MachineStartError

if TYPE_CHECKING:
    from services.simulator.machine import Machine
    from services.simulator.service import Simulator

V1 = "/redfish/v1"
RESET_TYPES = (
    "On",
    "ForceOff",
    "GracefulShutdown",
    "GracefulRestart",
    "ForceRestart",
    "Nmi",
    "ForceOn",
    "PushPowerButton",
)
BOOT_TARGETS = ("None", "Pxe", "Hdd", "Cd", "BiosSetup", "Floppy", "Usb")
BOOT_ENABLED = ("Disabled", "Once", "Continuous")
BOOT_MODES = ("UEFI", "Legacy")
MEDIA_TYPES = {"Cd": ["CD", "DVD"], "Floppy": ["Floppy", "USBStick"]}
# iLO 5's virtual media members (Managers/<m>/VirtualMedia/<n>) and the device each is.
ILO_MEMBERS = {"1": "Floppy", "2": "Cd"}
ILO_MEMBER_OF = {device: member for member, device in ILO_MEMBERS.items()}
MISSING = "Base.1.0.ResourceMissingAtURI"
MAX_SESSIONS = 1024
CONSOLE_ENTRIES = 100  # lines of console a log service read returns
PUBLIC = {
    ("GET", "/redfish"),
    ("GET", V1),
    ("GET", V1 + "/odata"),
    ("GET", V1 + "/$metadata"),
    ("POST", V1 + "/SessionService/Sessions"),
}

Handler = Callable[["RedfishService", web.Request, re.Match[str]], Awaitable[web.StreamResponse]]


def error(status: int, message: str, code: str = "Base.1.0.GeneralError") -> web.Response:
    body = {
        "error": {"code": code, "message": message, "@Message.ExtendedInfo": [{"MessageId": code, "Message": message}]}
    }
    return web.json_response(body, status=status)


def http_error(cls: type[web.HTTPException], message: str, code: str) -> web.HTTPException:
    """The same Redfish error body, as an exception a helper can raise."""
    body = {
        "error": {"code": code, "message": message, "@Message.ExtendedInfo": [{"MessageId": code, "Message": message}]}
    }
    return cls(text=json.dumps(body), content_type="application/json")


def odata(path: str) -> dict[str, str]:
    return {"@odata.id": path}


def collection(path: str, kind: str, members: list[str]) -> dict[str, Any]:
    return {
        "@odata.type": f"#{kind}Collection.{kind}Collection",
        "@odata.id": path,
        "Name": f"{kind} Collection",
        "Members@odata.count": len(members),
        "Members": [odata(m) for m in members],
    }


class RedfishService:
    """Routes and views; all state lives in the Simulator and its machines."""

    def __init__(self, simulator: Simulator) -> None:
        self.sim = simulator
        self.sessions: OrderedDict[str, dict[str, Any]] = OrderedDict()  # token -> session
        self.routes: list[tuple[str, re.Pattern[str], Handler]] = []
        for method, pattern, handler in (
            ("GET", r"/redfish", RedfishService.versions),
            ("GET", V1, RedfishService.root),
            ("GET", V1 + r"/Systems", RedfishService.systems),
            ("GET", V1 + r"/Systems/(?P<sys>[^/]+)", RedfishService.system),
            ("PATCH", V1 + r"/Systems/(?P<sys>[^/]+)", RedfishService.patch_system),
            ("POST", V1 + r"/Systems/(?P<sys>[^/]+)/Actions/ComputerSystem\.Reset", RedfishService.reset),
            ("GET", V1 + r"/Systems/(?P<sys>[^/]+)/EthernetInterfaces", RedfishService.nics),
            ("GET", V1 + r"/Systems/(?P<sys>[^/]+)/EthernetInterfaces/(?P<nic>[^/]+)", RedfishService.nic),
            ("GET", V1 + r"/Systems/(?P<sys>[^/]+)/VirtualMedia", RedfishService.media_collection),
            ("GET", V1 + r"/Systems/(?P<sys>[^/]+)/VirtualMedia/(?P<dev>[^/]+)", RedfishService.media),
            ("GET", V1 + r"/Systems/(?P<sys>[^/]+)/LogServices", RedfishService.log_services),
            ("GET", V1 + r"/Systems/(?P<sys>[^/]+)/LogServices/Console", RedfishService.console_service),
            ("GET", V1 + r"/Systems/(?P<sys>[^/]+)/LogServices/Console/Entries", RedfishService.console_entries),
            ("GET", V1 + r"/Managers", RedfishService.managers),
            ("GET", V1 + r"/Managers/(?P<sys>[^/]+)", RedfishService.manager),
            ("GET", V1 + r"/Managers/(?P<sys>[^/]+)/VirtualMedia", RedfishService.media_collection),
            ("GET", V1 + r"/Managers/(?P<sys>[^/]+)/VirtualMedia/(?P<dev>[^/]+)", RedfishService.media),
            ("PATCH", V1 + r"/Managers/(?P<sys>[^/]+)/VirtualMedia/(?P<dev>[^/]+)", RedfishService.patch_media),
            (
                "POST",
                V1 + r"/Managers/(?P<sys>[^/]+)/VirtualMedia/(?P<dev>[^/]+)/Actions/VirtualMedia\.InsertMedia",
                RedfishService.insert_media,
            ),
            (
                "POST",
                V1 + r"/Managers/(?P<sys>[^/]+)/VirtualMedia/(?P<dev>[^/]+)/Actions/VirtualMedia\.EjectMedia",
                RedfishService.eject_media,
            ),
            (
                "POST",
                V1 + r"/Managers/(?P<sys>[^/]+)/VirtualMedia/(?P<dev>[^/]+)/Actions/Oem/Hpe/"
                r"HpeiLOVirtualMedia\.InsertVirtualMedia",
                RedfishService.hpe_insert_media,
            ),
            (
                "POST",
                V1 + r"/Managers/(?P<sys>[^/]+)/VirtualMedia/(?P<dev>[^/]+)/Actions/Oem/Hpe/"
                r"HpeiLOVirtualMedia\.EjectVirtualMedia",
                RedfishService.hpe_eject_media,
            ),
            ("GET", V1 + r"/UpdateService", RedfishService.update_service),
            ("GET", V1 + r"/UpdateService/FirmwareInventory", RedfishService.firmware_inventory),
            ("GET", V1 + r"/UpdateService/FirmwareInventory/(?P<fw>[^/]+)", RedfishService.firmware_item),
            ("GET", V1 + r"/SessionService", RedfishService.session_service),
            ("GET", V1 + r"/SessionService/Sessions", RedfishService.session_list),
            ("POST", V1 + r"/SessionService/Sessions", RedfishService.session_create),
            ("GET", V1 + r"/SessionService/Sessions/(?P<sid>[^/]+)", RedfishService.session_get),
            ("DELETE", V1 + r"/SessionService/Sessions/(?P<sid>[^/]+)", RedfishService.session_delete),
            *redfish_bios.ROUTES,
        ):
            self.routes.append((method, re.compile(pattern + r"\Z"), handler))

    def build_app(self) -> web.Application:
        app = web.Application(client_max_size=1024 * 1024)
        app.router.add_route("*", "/redfish{tail:.*}", self.dispatch)
        app.router.add_get("/simulator/machines", self.status_all)
        app.router.add_get("/simulator/machines/{ident}", self.status_one)
        return app

    # ---- plumbing ---------------------------------------------------------------------

    async def dispatch(self, request: web.Request) -> web.StreamResponse:
        path = request.path.rstrip("/") or "/"
        allowed = []
        for method, pattern, handler in self.routes:
            match = pattern.match(path)
            if match is None:
                continue
            allowed.append(method)
            if method == request.method:
                if (method, path) not in PUBLIC and not self.authorized(request):
                    response = error(401, "Authentication required or credentials invalid", "Base.1.0.NoValidSession")
                    response.headers["WWW-Authenticate"] = 'Basic realm="Ferrum simulator"'
                    return response
                return await handler(self, request, match)
        if allowed:
            return error(405, f"{request.method} is not allowed on {path}", "Base.1.0.OperationNotAllowed")
        return error(404, f"No resource at {path}", "Base.1.0.ResourceMissingAtURI")

    def authorized(self, request: web.Request) -> bool:
        opts = self.sim.options
        if not opts.username:
            return True
        token = request.headers.get("X-Auth-Token")
        if token:
            return token in self.sessions
        header = request.headers.get("Authorization", "")
        if header.lower().startswith("basic "):
            try:
                user, _, password = base64.b64decode(header[6:].strip()).decode().partition(":")
            except (ValueError, UnicodeDecodeError):
                return False
            return self.credentials_ok(user, password)
        return False

    def credentials_ok(self, user: Any, password: Any) -> bool:
        opts = self.sim.options
        if not isinstance(user, str) or not isinstance(password, str):
            return False
        return hmac.compare_digest(user.encode(), opts.username.encode()) & hmac.compare_digest(
            password.encode(), opts.password.encode()
        )

    def machine(self, match: re.Match[str]) -> Machine:
        found = self.sim.find(match["sys"])
        if found is None:
            raise http_error(web.HTTPNotFound, f"no system {match['sys']}", "Base.1.0.ResourceMissingAtURI")
        return found

    @staticmethod
    async def body(request: web.Request) -> dict[str, Any]:
        try:
            data = await request.json()
        except ValueError:
            raise http_error(
                web.HTTPBadRequest, "the request body is not valid JSON", "Base.1.0.MalformedJSON"
            ) from None
        if not isinstance(data, dict):
            raise http_error(web.HTTPBadRequest, "the request body must be a JSON object", "Base.1.0.MalformedJSON")
        return data

    # ---- service root and systems ---------------------------------------------------

    async def versions(self, request: web.Request, match: re.Match[str]) -> web.Response:
        return web.json_response({"v1": V1 + "/"})

    async def root(self, request: web.Request, match: re.Match[str]) -> web.Response:
        return web.json_response(
            {
                "@odata.type": "#ServiceRoot.v1_5_0.ServiceRoot",
                "@odata.id": V1 + "/",
                "Id": "RootService",
                "Name": "Ferrum simulator",
                "RedfishVersion": "1.11.0",
                "UUID": self.sim.service_uuid,
                "Product": "Ferrum machine simulator",
                "Vendor": "Ferrum",
                "Systems": odata(V1 + "/Systems"),
                "Managers": odata(V1 + "/Managers"),
                "SessionService": odata(V1 + "/SessionService"),
                "Registries": odata(V1 + "/Registries"),
                "UpdateService": odata(V1 + "/UpdateService"),
                "Links": {"Sessions": odata(V1 + "/SessionService/Sessions")},
            }
        )

    async def systems(self, request: web.Request, match: re.Match[str]) -> web.Response:
        return web.json_response(
            collection(V1 + "/Systems", "ComputerSystem", [m.system_path for m in self.sim.machines])
        )

    async def system(self, request: web.Request, match: re.Match[str]) -> web.Response:
        m = self.machine(match)
        path = m.system_path
        return web.json_response(
            {
                "@odata.type": "#ComputerSystem.v1_13_0.ComputerSystem",
                "@odata.id": path,
                "Id": m.uuid,
                "Name": m.name,
                "UUID": m.uuid,
                "Manufacturer": "Ferrum",
                "Model": "Simulated machine",
                "SerialNumber": m.disk_serial,
                "SystemType": "Physical",
                "HostName": m.name,
                "BiosVersion": "ferrum-sim-1",
                "Status": {"State": "Enabled", "Health": m.health},
                "PowerState": m.power_state,
                "Boot": {
                    "BootSourceOverrideEnabled": m.boot_enabled,
                    "BootSourceOverrideTarget": m.boot_target,
                    "BootSourceOverrideTarget@Redfish.AllowableValues": list(BOOT_TARGETS),
                    "BootSourceOverrideMode": m.boot_mode,
                    "BootSourceOverrideMode@Redfish.AllowableValues": list(BOOT_MODES),
                },
                "ProcessorSummary": {"Count": 2, "Model": "Simulated CPU", "Status": {"State": "Enabled"}},
                "MemorySummary": {"TotalSystemMemoryGiB": 4, "Status": {"State": "Enabled"}},
                "EthernetInterfaces": odata(path + "/EthernetInterfaces"),
                **({} if self.ilo else {"VirtualMedia": odata(path + "/VirtualMedia")}),
                "LogServices": odata(path + "/LogServices"),
                **({"GraphicalConsole": graphical} if (graphical := m.graphical_console()) else {}),
                "Bios": odata(path + "/Bios"),
                "Links": {"ManagedBy": [odata(f"{V1}/Managers/{m.name}")]},
                "Actions": {
                    "#ComputerSystem.Reset": {
                        "target": path + "/Actions/ComputerSystem.Reset",
                        "ResetType@Redfish.AllowableValues": list(RESET_TYPES),
                    }
                },
            }
        )

    async def patch_system(self, request: web.Request, match: re.Match[str]) -> web.Response:
        m = self.machine(match)
        data = await self.body(request)
        unknown = set(data) - {"Boot"}
        if unknown:
            return error(400, f"Properties {sorted(unknown)} cannot be changed", "Base.1.0.PropertyNotWritable")
        boot = data.get("Boot")
        if not isinstance(boot, dict) or not boot:
            return error(400, "Boot must be a non-empty object", "Base.1.0.PropertyValueTypeError")
        checks = {
            "BootSourceOverrideTarget": BOOT_TARGETS,
            "BootSourceOverrideEnabled": BOOT_ENABLED,
            "BootSourceOverrideMode": BOOT_MODES,
        }
        for key, value in boot.items():
            if key not in checks:
                return error(400, f"Boot property {key} is not supported", "Base.1.0.PropertyUnknown")
            if value not in checks[key]:
                return error(
                    400,
                    f"{value!r} is not an allowed value of {key} (allowed: {', '.join(checks[key])})",
                    "Base.1.0.PropertyValueNotInList",
                )
        # Validated as a whole before anything changes.
        m.boot_target = boot.get("BootSourceOverrideTarget", m.boot_target)
        m.boot_enabled = boot.get("BootSourceOverrideEnabled", m.boot_enabled)
        m.boot_mode = boot.get("BootSourceOverrideMode", m.boot_mode)
        m.record("boot_override", target=m.boot_target, enabled=m.boot_enabled, mode=m.boot_mode)
        return web.Response(status=204)

    async def reset(self, request: web.Request, match: re.Match[str]) -> web.Response:
        m = self.machine(match)
        reset_type = (await self.body(request)).get("ResetType")
        if reset_type not in RESET_TYPES:
            return error(
                400,
                f"ResetType {reset_type!r} is not one of {', '.join(RESET_TYPES)}",
                "Base.1.0.ActionParameterNotSupported",
            )
        if reset_type == "Nmi":
            m.record("nmi")
            return web.Response(status=204)
        if reset_type == "PushPowerButton":
            reset_type = "ForceOff" if m.power_state == "On" else "On"
        delay = self.sim.power_delay()
        if delay > 0:
            # Like real BMCs (and sushy-tools), accept now and act later: clients must poll.
            m.record("power_pending", reset_type=reset_type, delay=round(delay, 2))
            m.schedule_power(reset_type, delay)
        else:
            try:
                await m.apply_power(reset_type)
            except MachineStartError as exc:
                return error(500, str(exc), "Base.1.0.GeneralError")
        return web.Response(status=204)

    async def nics(self, request: web.Request, match: re.Match[str]) -> web.Response:
        m = self.machine(match)
        path = m.system_path + "/EthernetInterfaces"
        return web.json_response(collection(path, "EthernetInterface", [f"{path}/nic{i}" for i in range(len(m.macs))]))

    async def nic(self, request: web.Request, match: re.Match[str]) -> web.Response:
        m = self.machine(match)
        ident = match["nic"]
        index = int(ident[3:]) if re.fullmatch(r"nic\d+", ident) else -1
        if not 0 <= index < len(m.macs):
            return error(404, f"No EthernetInterface {ident}", "Base.1.0.ResourceMissingAtURI")
        return web.json_response(
            {
                "@odata.type": "#EthernetInterface.v1_4_0.EthernetInterface",
                "@odata.id": f"{m.system_path}/EthernetInterfaces/{ident}",
                "Id": ident,
                "Name": f"NIC {index}",
                "Status": {"State": "Enabled", "Health": "OK"},
                "MACAddress": m.macs[index],
                "PermanentMACAddress": m.macs[index],
                "SpeedMbps": 10000,
                "LinkStatus": "LinkUp",
            }
        )

    # ---- managers and virtual media ---------------------------------------------------

    async def managers(self, request: web.Request, match: re.Match[str]) -> web.Response:
        return web.json_response(
            collection(V1 + "/Managers", "Manager", [f"{V1}/Managers/{m.name}" for m in self.sim.machines])
        )

    async def manager(self, request: web.Request, match: re.Match[str]) -> web.Response:
        m = self.machine(match)
        path = f"{V1}/Managers/{m.name}"
        return web.json_response(
            {
                "@odata.type": "#Manager.v1_10_0.Manager",
                "@odata.id": path,
                "Id": m.name,
                "Name": f"BMC of {m.name}",
                "ManagerType": "BMC",
                "UUID": m.uuid,
                "Model": "Ferrum simulated BMC",
                "FirmwareVersion": "1.0",
                "Status": {"State": "Enabled", "Health": "OK"},
                "VirtualMedia": odata(path + "/VirtualMedia"),
                "Links": {"ManagerForServers": [odata(m.system_path)]},
            }
        )

    @property
    def ilo(self) -> bool:
        return self.sim.options.bmc_profile == "ilo"

    def media_id(self, device: str) -> str:
        """The member id a device has on this BMC (iLO numbers them)."""
        return ILO_MEMBER_OF[device] if self.ilo else device

    async def media_collection(self, request: web.Request, match: re.Match[str]) -> web.Response:
        m = self.machine(match)
        if self.ilo and request.path.startswith(V1 + "/Systems/"):
            raise http_error(web.HTTPNotFound, "iLO has virtual media under its Manager only", MISSING)
        base = f"{V1}/Managers/{m.name}/VirtualMedia"
        own = request.path.rstrip("/")
        members = [f"{base}/{self.media_id(dev)}" for dev in m.virtual_media]
        return web.json_response(collection(own, "VirtualMedia", sorted(members)))

    def media_document(self, m: Machine, device: str) -> dict[str, Any]:
        slot = m.virtual_media[device]
        member = self.media_id(device)
        path = f"{V1}/Managers/{m.name}/VirtualMedia/{member}"
        document: dict[str, Any] = {
            "@odata.type": "#VirtualMedia.v1_4_0.VirtualMedia",
            "@odata.id": path,
            "Id": member,
            "Name": f"Virtual {device}" if not self.ilo else "VirtualMedia",
            "MediaTypes": MEDIA_TYPES[device],
            "ConnectedVia": "URI" if slot.inserted else "NotConnected",
            "Image": slot.image,
            "ImageName": slot.image.rsplit("/", 1)[-1].split("?")[0] if slot.image else None,
            "Inserted": slot.inserted,
            "WriteProtected": slot.write_protected,
            "Actions": {
                "#VirtualMedia.InsertMedia": {"target": path + "/Actions/VirtualMedia.InsertMedia"},
                "#VirtualMedia.EjectMedia": {"target": path + "/Actions/VirtualMedia.EjectMedia"},
            },
        }
        if self.ilo:
            oem = path + "/Actions/Oem/Hpe/HpeiLOVirtualMedia"
            document["Oem"] = {
                "Hpe": {
                    "@odata.type": "#HpeiLOVirtualMedia.v2_2_0.HpeiLOVirtualMedia",
                    "Actions": {
                        "#HpeiLOVirtualMedia.EjectVirtualMedia": {"target": oem + ".EjectVirtualMedia"},
                        "#HpeiLOVirtualMedia.InsertVirtualMedia": {"target": oem + ".InsertVirtualMedia"},
                    },
                    "BootOnNextServerReset": slot.boot_on_next_reset,
                }
            }
        return document

    def device(self, match: re.Match[str]) -> tuple[Machine, str]:
        m = self.machine(match)
        if self.ilo and match.re.pattern.startswith(V1 + r"/Systems/"):
            raise http_error(web.HTTPNotFound, "iLO has virtual media under its Manager only", MISSING)
        device = ILO_MEMBERS.get(match["dev"], "") if self.ilo else match["dev"]
        if device not in m.virtual_media:
            raise http_error(web.HTTPNotFound, f"no virtual media device {match['dev']}", MISSING)
        return m, device

    async def media(self, request: web.Request, match: re.Match[str]) -> web.Response:
        m, dev = self.device(match)
        return web.json_response(self.media_document(m, dev))

    async def _insert(self, m: Machine, dev: str, data: dict[str, Any]) -> web.Response:
        image = data.get("Image")
        if not isinstance(image, str) or not re.match(r"^https?://", image):
            return error(400, "Image must be an http(s) URL", "Base.1.0.ActionParameterValueFormatError")
        inserted = data.get("Inserted", True)
        protected = data.get("WriteProtected", True)
        if not isinstance(inserted, bool) or not isinstance(protected, bool):
            return error(400, "Inserted and WriteProtected must be booleans", "Base.1.0.PropertyValueTypeError")
        if m.virtual_media[dev].inserted and inserted:
            return error(
                409, f"{dev} already holds {m.virtual_media[dev].image}; eject it first", "Base.1.0.ResourceInUse"
            )
        problem = await url_exists(self.sim.session, m.media_source(image), self.sim.options.http_timeout)
        if problem is not None:
            m.record("virtual_media_unreachable", device=dev, image=image, error=problem)
            return error(400, f"cannot fetch {image}: {problem}", "Base.1.0.ResourceCannotBeCreated")
        slot = m.virtual_media[dev]
        slot.image, slot.inserted, slot.write_protected = image, inserted, protected
        if inserted:
            try:
                await m.attach_media(dev)
            except MachineStartError as exc:
                slot.image, slot.inserted, slot.write_protected = None, False, True
                m.record("virtual_media_error", device=dev, image=image, error=str(exc))
                return error(400, str(exc), "Base.1.0.ResourceCannotBeCreated")
        m.record("virtual_media_inserted", device=dev, image=image)
        return web.Response(status=204)

    async def insert_media(self, request: web.Request, match: re.Match[str]) -> web.Response:
        m, dev = self.device(match)
        return await self._insert(m, dev, await self.body(request))

    async def eject_media(self, request: web.Request, match: re.Match[str]) -> web.Response:
        m, dev = self.device(match)
        slot = m.virtual_media[dev]
        if slot.image is not None:
            m.record("virtual_media_ejected", device=dev, image=slot.image)
        if slot.inserted:
            await m.detach_media(dev)
        slot.image, slot.inserted, slot.write_protected = None, False, True
        return web.Response(status=204)

    async def patch_media(self, request: web.Request, match: re.Match[str]) -> web.Response:
        """Some BMCs (and sushy for them) insert by PATCHing Image/Inserted; iLO also takes
        ``Oem.Hpe.BootOnNextServerReset`` here: boot once from this medium at the next reset."""
        m, dev = self.device(match)
        data = await self.body(request)
        if "Oem" in data:
            return self._patch_hpe(m, dev, data)
        if data.get("Image") in (None, "") and data.get("Inserted") is False:
            return await self.eject_media(request, match)
        return await self._insert(m, dev, data)

    def _patch_hpe(self, m: Machine, dev: str, data: dict[str, Any]) -> web.Response:
        hpe = (data.get("Oem") or {}).get("Hpe") if isinstance(data.get("Oem"), dict) else None
        if not self.ilo or not isinstance(hpe, dict) or set(hpe) != {"BootOnNextServerReset"} or len(data) != 1:
            return error(400, "the only Oem property here is Oem.Hpe.BootOnNextServerReset", "Base.1.0.PropertyUnknown")
        value = hpe["BootOnNextServerReset"]
        if not isinstance(value, bool):
            return error(400, "BootOnNextServerReset must be a boolean", "Base.1.0.PropertyValueTypeError")
        slot = m.virtual_media[dev]
        if value and (dev != "Cd" or not slot.inserted):
            return error(
                400, "boot on next server reset needs an inserted CD", "iLO.2.16.InvalidOperationForSystemState"
            )
        slot.boot_on_next_reset = value
        m.record("virtual_media_boot_on_next_reset", device=dev, value=value)
        return web.Response(status=204)

    async def hpe_insert_media(self, request: web.Request, match: re.Match[str]) -> web.Response:
        """iLO's own insert (proliantutils falls back to it): ``{"Image": url}``."""
        m, dev = self.device(match)
        if not self.ilo:
            raise http_error(web.HTTPNotFound, "no such action", MISSING)
        return await self._insert(m, dev, await self.body(request))

    async def hpe_eject_media(self, request: web.Request, match: re.Match[str]) -> web.Response:
        if not self.ilo:
            raise http_error(web.HTTPNotFound, "no such action", MISSING)
        return await self.eject_media(request, match)

    # ---- console log ----------------------------------------------------------------

    # ---- update service: the NICs' firmware inventory ---------------------------------

    async def update_service(self, request: web.Request, match: re.Match[str]) -> web.Response:
        return web.json_response(
            {
                "@odata.type": "#UpdateService.v1_8_0.UpdateService",
                "@odata.id": V1 + "/UpdateService",
                "Id": "UpdateService",
                "Name": "Update service",
                "ServiceEnabled": True,
                "FirmwareInventory": odata(V1 + "/UpdateService/FirmwareInventory"),
                "Actions": {},  # no SimpleUpdate: the simulator's firmware cannot be flashed
            }
        )

    async def firmware_inventory(self, request: web.Request, match: re.Match[str]) -> web.Response:
        """One entry per NIC of every machine (the service root is shared, so each
        entry's RelatedItem names the EthernetInterface it belongs to)."""
        path = V1 + "/UpdateService/FirmwareInventory"
        members = [f"{path}/{m.name}-nic{i}" for m in self.sim.machines for i in range(len(m.macs))]
        return web.json_response(collection(path, "SoftwareInventory", members))

    async def firmware_item(self, request: web.Request, match: re.Match[str]) -> web.Response:
        ident = match["fw"]
        name, _, nic = ident.rpartition("-nic")
        m = next((m for m in self.sim.machines if m.name == name), None)
        if m is None or not nic.isdigit() or not 0 <= int(nic) < len(m.macs):
            return error(404, f"No SoftwareInventory {ident}", "Base.1.0.ResourceMissingAtURI")
        index = int(nic)
        return web.json_response(
            {
                "@odata.type": "#SoftwareInventory.v1_2_0.SoftwareInventory",
                "@odata.id": f"{V1}/UpdateService/FirmwareInventory/{ident}",
                "Id": ident,
                "Name": f"NIC {index} firmware",
                "Manufacturer": "Ferrum",
                "SoftwareId": "Simulated 10GbE NIC",
                "Version": f"22.5.{index}",
                "Updateable": False,
                "Status": {"State": "Enabled", "Health": "OK"},
                "RelatedItem": [odata(f"{m.system_path}/EthernetInterfaces/nic{index}")],
                "Oem": {"Ferrum": {"SerialNumber": f"SIM{m.uuid[:8].upper()}N{index}"}},
            }
        )

    async def log_services(self, request: web.Request, match: re.Match[str]) -> web.Response:
        m = self.machine(match)
        path = m.system_path + "/LogServices"
        return web.json_response(collection(path, "LogService", [path + "/Console"]))

    async def console_service(self, request: web.Request, match: re.Match[str]) -> web.Response:
        m = self.machine(match)
        path = m.system_path + "/LogServices/Console"
        return web.json_response(
            {
                "@odata.type": "#LogService.v1_3_0.LogService",
                "@odata.id": path,
                "Id": "Console",
                "Name": "Serial console",
                "Description": f"The last {CONSOLE_ENTRIES} lines of the machine's console, oldest first",
                "MaxNumberOfRecords": CONSOLE_ENTRIES,
                "OverWritePolicy": "WrapsWhenFull",
                "ServiceEnabled": True,
                "Entries": odata(path + "/Entries"),
            }
        )

    async def console_entries(self, request: web.Request, match: re.Match[str]) -> web.Response:
        """Console lines as LogEntry members (expanded, so one GET reads them all). Each Id is a
        number that only grows with the log (a sequence number, or a QEMU serial log's offset),
        so a console that polls the log (the conductor's ``simulator`` console) sends only new lines."""
        m = self.machine(match)
        path = m.system_path + "/LogServices/Console/Entries"
        entries = await asyncio.to_thread(m.console_entries, CONSOLE_ENTRIES)
        members = [
            {
                "@odata.type": "#LogEntry.v1_4_0.LogEntry",
                "@odata.id": f"{path}/{number}",
                "Id": str(number),
                "Name": "Console line",
                "EntryType": "Oem",
                "OemRecordFormat": "Ferrum console line",
                "Severity": "OK",
                "Message": line,
            }
            for number, line in entries
        ]
        return web.json_response(
            {
                "@odata.type": "#LogEntryCollection.LogEntryCollection",
                "@odata.id": path,
                "Name": "Console lines",
                "Members@odata.count": len(members),
                "Members": members,
            }
        )

    # ---- sessions ---------------------------------------------------------------------

    async def session_service(self, request: web.Request, match: re.Match[str]) -> web.Response:
        return web.json_response(
            {
                "@odata.type": "#SessionService.v1_1_8.SessionService",
                "@odata.id": V1 + "/SessionService",
                "Id": "SessionService",
                "Name": "Session Service",
                "ServiceEnabled": True,
                "SessionTimeout": 3600,
                "Sessions": odata(V1 + "/SessionService/Sessions"),
            }
        )

    def session_document(self, session: dict[str, Any]) -> dict[str, Any]:
        return {
            "@odata.type": "#Session.v1_3_0.Session",
            "@odata.id": session["path"],
            "Id": session["id"],
            "Name": "User Session",
            "UserName": session["user"],
        }

    async def session_list(self, request: web.Request, match: re.Match[str]) -> web.Response:
        return web.json_response(
            collection(V1 + "/SessionService/Sessions", "Session", [s["path"] for s in self.sessions.values()])
        )

    async def session_create(self, request: web.Request, match: re.Match[str]) -> web.Response:
        data = await self.body(request)
        user, password = data.get("UserName"), data.get("Password")
        if self.sim.options.username and not self.credentials_ok(user, password):
            return error(401, "Invalid user name or password", "Base.1.0.NoValidSession")
        token = secrets.token_urlsafe(24)
        sid = secrets.token_hex(8)
        session: dict[str, Any] = {
            "id": sid,
            "user": user if isinstance(user, str) else "",
            "created": time.time(),
            "path": f"{V1}/SessionService/Sessions/{sid}",
        }
        self.sessions[token] = session
        while len(self.sessions) > MAX_SESSIONS:
            self.sessions.popitem(last=False)
        response = web.json_response(self.session_document(session), status=201)
        response.headers["X-Auth-Token"] = token
        response.headers["Location"] = session["path"]
        return response

    def _session(self, sid: str) -> tuple[str, dict[str, Any]] | None:
        for token, session in self.sessions.items():
            if session["id"] == sid:
                return token, session
        return None

    async def session_get(self, request: web.Request, match: re.Match[str]) -> web.Response:
        found = self._session(match["sid"])
        if found is None:
            return error(404, "No such session", "Base.1.0.ResourceMissingAtURI")
        return web.json_response(self.session_document(found[1]))

    async def session_delete(self, request: web.Request, match: re.Match[str]) -> web.Response:
        found = self._session(match["sid"])
        if found is None:
            return error(404, "No such session", "Base.1.0.ResourceMissingAtURI")
        del self.sessions[found[0]]
        return web.Response(status=204)

    # ---- simulator status (not Redfish; open) ------------------------------------------

    async def status_all(self, request: web.Request) -> web.Response:
        return web.json_response(
            {
                "redfish_url": self.sim.redfish_url,
                "machines": [{**m.summary(), **self.sim.ipmi_summary(m)} for m in self.sim.machines],
            }
        )

    async def status_one(self, request: web.Request) -> web.Response:
        m = self.sim.find(request.match_info["ident"])
        if m is None:
            return web.json_response({"error": f"no machine {request.match_info['ident']}"}, status=404)
        return web.json_response(m.describe())
