"""The simulator BMC's BIOS resources (services/simulator/bios.py holds the model):

- ``Systems/{id}/Bios``: current ``Attributes``, the ``AttributeRegistry`` they
  follow, ``@Redfish.Settings`` (the SettingsObject, ``SupportedApplyTimes``
  OnReset, and the ``Time`` and ``Messages`` of the last apply), and the
  ``#Bios.ResetBios`` action;
- ``Systems/{id}/Bios/Settings``: the pending attributes (only those staged,
  as Dell's iDRAC shows them); PATCH ``{"Attributes": {...}}`` stages values,
  refusing the whole request with 400 and one ExtendedInfo per problem;
- ``Registries``: one MessageRegistryFile whose location is the BIOS
  attribute registry, which is how sushy's ``get_attribute_registry`` finds it.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from aiohttp import web

from services.simulator.bios import REGISTRY, REGISTRY_ID, REGISTRY_LANGUAGE, Problem

if TYPE_CHECKING:
    from services.simulator.redfish import Handler, RedfishService

V1 = "/redfish/v1"
REGISTRIES = V1 + "/Registries"
REGISTRY_FILE = f"{REGISTRIES}/{REGISTRY_ID}"
REGISTRY_DOCUMENT = f"{REGISTRY_FILE}/BiosRegistry"
APPLY_TIMES = ("OnReset",)


def refusal(problems: list[Problem]) -> web.Response:
    """One Redfish error carrying every problem (clients show each message)."""
    first = problems[0]
    body = {
        "error": {
            "code": first.message_id,
            "message": " ".join(p.message for p in problems),
            "@Message.ExtendedInfo": [p.extended_info() for p in problems],
        }
    }
    return web.json_response(body, status=400)


async def bios(service: RedfishService, request: web.Request, match: re.Match[str]) -> web.Response:
    m = service.machine(match)
    path = m.system_path + "/Bios"
    settings: dict[str, Any] = {
        "@odata.type": "#Settings.v1_3_5.Settings",
        "SettingsObject": {"@odata.id": path + "/Settings"},
        "SupportedApplyTimes": list(APPLY_TIMES),
    }
    if m.bios.applied_at is not None:
        settings["Time"] = m.bios.applied_at
        settings["Messages"] = list(m.bios.messages)
    return web.json_response(
        {
            "@odata.type": "#Bios.v1_2_0.Bios",
            "@odata.id": path,
            "Id": "Bios",
            "Name": "BIOS Configuration Current Settings",
            "AttributeRegistry": REGISTRY_ID,
            "Attributes": dict(m.bios.current),
            "@Redfish.Settings": settings,
            "Actions": {"#Bios.ResetBios": {"target": path + "/Actions/Bios.ResetBios"}},
        }
    )


async def pending(service: RedfishService, request: web.Request, match: re.Match[str]) -> web.Response:
    m = service.machine(match)
    return web.json_response(
        {
            "@odata.type": "#Bios.v1_2_0.Bios",
            "@odata.id": m.system_path + "/Bios/Settings",
            "Id": "Settings",
            "Name": "BIOS Configuration Pending Settings",
            "AttributeRegistry": REGISTRY_ID,
            "Attributes": dict(m.bios.pending),
        }
    )


async def stage(service: RedfishService, request: web.Request, match: re.Match[str]) -> web.Response:
    m = service.machine(match)
    data = await service.body(request)
    unknown = sorted(set(data) - {"Attributes", "@Redfish.SettingsApplyTime"})
    if unknown:
        return refusal([Problem("Base.1.0.PropertyUnknown", f"The properties {', '.join(unknown)} are not settable.")])
    attributes = data.get("Attributes")
    if not isinstance(attributes, dict) or not attributes:
        return refusal(
            [Problem("Base.1.0.PropertyValueTypeError", "Attributes must be an object naming at least one attribute.")]
        )
    apply_time = (data.get("@Redfish.SettingsApplyTime") or {}).get("ApplyTime", "OnReset")
    if apply_time not in APPLY_TIMES:
        return refusal(
            [
                Problem(
                    "Base.1.0.PropertyValueNotInList",
                    f"The value {apply_time!r} for ApplyTime is not supported (supported: {', '.join(APPLY_TIMES)}).",
                )
            ]
        )
    problems = m.bios.stage(attributes)
    if problems:
        m.record("bios_settings_refused", problems=[p.message for p in problems])
        return refusal(problems)
    m.record("bios_settings_staged", names=sorted(attributes))
    return web.Response(status=204)


async def reset_bios(service: RedfishService, request: web.Request, match: re.Match[str]) -> web.Response:
    m = service.machine(match)
    if request.can_read_body:
        await service.body(request)  # sushy may send {}; any JSON object is fine
    m.bios.request_reset()
    m.record("bios_reset_requested")
    return web.Response(status=204)


async def registries(service: RedfishService, request: web.Request, match: re.Match[str]) -> web.Response:
    return web.json_response(
        {
            "@odata.type": "#MessageRegistryFileCollection.MessageRegistryFileCollection",
            "@odata.id": REGISTRIES,
            "Name": "Registry File Collection",
            "Members@odata.count": 1,
            "Members": [{"@odata.id": REGISTRY_FILE}],
        }
    )


async def registry_file(service: RedfishService, request: web.Request, match: re.Match[str]) -> web.Response:
    return web.json_response(
        {
            "@odata.type": "#MessageRegistryFile.v1_1_0.MessageRegistryFile",
            "@odata.id": REGISTRY_FILE,
            "Id": REGISTRY_ID,
            "Name": "Ferrum simulated BIOS attribute registry file",
            "Languages": [REGISTRY_LANGUAGE],
            "Registry": REGISTRY_ID,
            "Location": [{"Language": REGISTRY_LANGUAGE, "Uri": REGISTRY_DOCUMENT}],
        }
    )


async def registry_document(service: RedfishService, request: web.Request, match: re.Match[str]) -> web.Response:
    return web.json_response(
        {
            "@odata.type": "#AttributeRegistry.v1_3_0.AttributeRegistry",
            "@odata.id": REGISTRY_DOCUMENT,
            "Id": REGISTRY_ID,
            "Name": "Ferrum simulated BIOS attribute registry",
            "Language": REGISTRY_LANGUAGE,
            "OwningEntity": "Ferrum",
            "RegistryVersion": "1.0.0",
            "SupportedSystems": [{"ProductName": "Ferrum simulated machine", "SystemId": "ferrum-sim"}],
            "RegistryEntries": {"Attributes": [a.registry_entry() for a in REGISTRY]},
        }
    )


SYSTEM = V1 + r"/Systems/(?P<sys>[^/]+)"
ROUTES: tuple[tuple[str, str, Handler], ...] = (
    ("GET", SYSTEM + r"/Bios", bios),
    ("GET", SYSTEM + r"/Bios/Settings", pending),
    ("PATCH", SYSTEM + r"/Bios/Settings", stage),
    ("POST", SYSTEM + r"/Bios/Actions/Bios\.ResetBios", reset_bios),
    ("GET", V1 + r"/Registries", registries),
    ("GET", re.escape(REGISTRY_FILE), registry_file),
    ("GET", re.escape(REGISTRY_DOCUMENT), registry_document),
)
