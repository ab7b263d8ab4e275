"""A node's management interface over REST: the boot device (1.1),
indicators (1.63) and boot mode / secure boot changes (1.76).

``GET|PUT /v1/nodes/{ident}/management/boot_device`` and
``GET .../boot_device/supported`` read or set the next boot device through
the owning conductor (204 once set).
``GET /v1/nodes/{ident}/management/indicators`` lists the indicators the
management interface reports; ``GET|PUT .../indicators/{name}@{component}``
(Ironic's unique indicator name, e.g. ``led@system``) read or set one.
``PUT /v1/nodes/{ident}/states/boot_mode`` (``{"target": "uefi"|"bios"}``)
and ``PUT .../states/secure_boot`` (``{"target": true|false}``) answer 202;
the conductor changes the hardware under the node lock and then records
``boot_mode``/``secure_boot``. Below their versions these endpoints do not
exist (404, the routes table gates them), as Ironic answers.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from ferrum.v1 import conductor_pb2 as cpb
from services.api import views
from services.api.context import ApiContext
from services.api.node_states import accepted
from services.common import errors

INDICATORS_SINCE = (1, 63)
BOOT_MODE_SINCE = (1, 76)


def split_indicator(name: str) -> tuple[str, str]:
    """``led@system`` -> (component ``system``, indicator ``led``)."""
    indicator, sep, component = name.rpartition("@")
    if not sep or not indicator or not component:
        raise errors.InvalidParameterValue(f'Malformed indicator name "{name}"')
    return component, indicator


class NodeManagementApi:
    def __init__(self, ctx: ApiContext) -> None:
        self.ctx = ctx

    async def get_boot_device(self, request: web.Request) -> web.Response:
        node = await self.ctx.node_by_ident(request)
        reply = await self.ctx.rpc(node, "GetBootDevice", cpb.NodeRef(node_uuid=node["uuid"]))
        return web.json_response({"boot_device": reply.boot_device or None, "persistent": reply.persistent})

    async def set_boot_device(self, request: web.Request) -> web.Response:
        node = await self.ctx.node_by_ident(request)
        body = await self.ctx.body(request)
        if not isinstance(body, dict) or not isinstance(body.get("boot_device"), str):
            raise errors.InvalidParameterValue("boot_device is required")
        persistent = body.get("persistent", False)
        if not isinstance(persistent, bool):
            raise errors.InvalidParameterValue("persistent must be a boolean")
        await self.ctx.rpc(
            node,
            "SetBootDevice",
            cpb.BootDeviceRequest(node_uuid=node["uuid"], boot_device=body["boot_device"], persistent=persistent),
        )
        return web.Response(status=204)

    async def supported_boot_devices(self, request: web.Request) -> web.Response:
        node = await self.ctx.node_by_ident(request)
        reply = await self.ctx.rpc(node, "GetSupportedBootDevices", cpb.NodeRef(node_uuid=node["uuid"]))
        return web.json_response({"supported_boot_devices": list(reply.boot_devices)})

    async def list_indicators(self, request: web.Request) -> web.Response:
        node = await self.ctx.node_by_ident(request)
        reply = await self.ctx.rpc(node, "GetSupportedIndicators", cpb.NodeRef(node_uuid=node["uuid"]))
        base = self.ctx.base(request)
        docs: list[dict[str, Any]] = []
        for indicator in reply.indicators:
            unique = f"{indicator.name}@{indicator.component}"
            docs.append(
                {
                    "name": unique,
                    "component": indicator.component,
                    "readonly": indicator.readonly,
                    "states": list(indicator.states),
                    "links": views.links(base, f"nodes/{node['uuid']}/management/indicators", unique),
                }
            )
        return web.json_response({"indicators": docs})

    async def get_indicator(self, request: web.Request) -> web.Response:
        node = await self.ctx.node_by_ident(request)
        component, indicator = split_indicator(request.match_info["indicator"])
        reply = await self.ctx.rpc(
            node,
            "GetIndicatorState",
            cpb.IndicatorRequest(node_uuid=node["uuid"], component=component, indicator=indicator),
        )
        return web.json_response({"state": reply.state})

    async def set_indicator(self, request: web.Request) -> web.Response:
        node = await self.ctx.node_by_ident(request)
        component, indicator = split_indicator(request.match_info["indicator"])
        state = request.query.get("state")
        if request.can_read_body:
            body = await self.ctx.body(request)
            if not isinstance(body, dict) or set(body) - {"state"}:
                raise errors.InvalidParameterValue('The body must be {"state": "<indicator state>"}')
            state = body.get("state", state)
        if not isinstance(state, str) or not state:
            raise errors.InvalidParameterValue("An indicator 'state' string is required")
        await self.ctx.rpc(
            node,
            "SetIndicatorState",
            cpb.IndicatorRequest(node_uuid=node["uuid"], component=component, indicator=indicator, state=state),
        )
        return web.Response(status=204)

    async def _target(self, request: web.Request) -> Any:
        body = await self.ctx.body(request)
        if not isinstance(body, dict) or set(body) != {"target"}:
            raise errors.InvalidParameterValue('The body must be {"target": ...}')
        return body["target"]

    async def set_boot_mode(self, request: web.Request) -> web.Response:
        node = await self.ctx.node_by_ident(request)
        target = await self._target(request)
        if target not in ("uefi", "bios"):
            raise errors.InvalidParameterValue(f"Invalid boot mode {target!r}: must be one of bios, uefi")
        await self.ctx.rpc(node, "SetBootMode", cpb.BootModeRequest(node_uuid=node["uuid"], target=target))
        return accepted(self.ctx.base(request), node)

    async def set_secure_boot(self, request: web.Request) -> web.Response:
        node = await self.ctx.node_by_ident(request)
        target = await self._target(request)
        if not isinstance(target, bool):
            raise errors.InvalidParameterValue(f"Invalid secure boot target {target!r}: must be true or false")
        await self.ctx.rpc(node, "SetSecureBootState", cpb.SecureBootRequest(node_uuid=node["uuid"], target=target))
        return accepted(self.ctx.base(request), node)
