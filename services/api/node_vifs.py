"""A node's VIFs (microversion 1.28): ``GET|POST /v1/nodes/{ident}/vifs`` and
``DELETE /v1/nodes/{ident}/vifs/{vif}``.

Ironic's flat network keeps a VIF on a port or port group
(``internal_info.tenant_vif_port_id``); the list reads them from there, and
attaching or detaching goes to the owning conductor, whose network interface
picks the port. Below 1.28 the routes are 404 (the routes table gates them).
"""

from __future__ import annotations

from aiohttp import web

from ferrum.v1 import conductor_pb2 as cpb
from services.api import params
from services.api.context import ApiContext
from services.common import errors
from services.common.db.nodes import is_uuid
from services.common.db.portgroups import PortgroupRepository
from services.common.db.ports import PortRepository

SINCE = (1, 28)
TARGET_SINCE = (1, 67)


class NodeVifsApi:
    def __init__(self, ctx: ApiContext) -> None:
        self.ctx = ctx
        self.ports = PortRepository(ctx.pool)
        self.portgroups = PortgroupRepository(ctx.pool)

    async def list_vifs(self, request: web.Request) -> web.Response:
        node = await self.ctx.node_by_ident(request)
        ports = await self.ports.list(node_id=node["id"], limit=self.ctx.config.max_limit)
        groups = await self.portgroups.list(node_id=node["id"], limit=self.ctx.config.max_limit)
        vifs = [
            {"id": p["internal_info"]["tenant_vif_port_id"]}
            for p in [*ports, *groups]
            if (p.get("internal_info") or {}).get("tenant_vif_port_id")
        ]
        return web.json_response({"vifs": vifs})

    async def attach_vif(self, request: web.Request) -> web.Response:
        node = await self.ctx.node_by_ident(request)
        body = await self.ctx.body(request)
        vif = body.get("id") if isinstance(body, dict) else None
        if not isinstance(vif, str) or not vif or len(vif) > 255:
            raise errors.InvalidParameterValue("A VIF attachment needs an 'id' string")
        target = {k: body[k] for k in ("port_uuid", "portgroup_uuid") if body.get(k) is not None}
        if target:  # 1.67: attach to this very port or port group
            params.require_version(request, TARGET_SINCE, "port_uuid and portgroup_uuid in a VIF attachment")
            if len(target) == 2:
                raise errors.InvalidParameterValue("Cannot specify both port_uuid and portgroup_uuid")
            for key, value in target.items():
                if not isinstance(value, str) or not is_uuid(value):
                    raise errors.InvalidParameterValue(f"Expected a UUID for {key} but received {value}.")
        await self.ctx.rpc(node, "VifAttach", cpb.VifRequest(node_uuid=node["uuid"], vif_id=vif, **target))
        return web.Response(status=204)

    async def detach_vif(self, request: web.Request) -> web.Response:
        node = await self.ctx.node_by_ident(request)
        await self.ctx.rpc(node, "VifDetach", cpb.VifRequest(node_uuid=node["uuid"], vif_id=request.match_info["vif"]))
        return web.Response(status=204)
