"""Ports: ``/v1/ports`` (list, detail, create), ``/v1/ports/{ident}`` (get,
patch, delete) and a node's ports, ``/v1/nodes/{ident}/ports[/detail]``.

Ports are records, so the api writes them itself through the repository; a
port joins a port group of its own node through ``portgroup_uuid``. The
value checks are shared with gRPC (:mod:`services.api.port_values`).
"""

from __future__ import annotations

import json
import uuid as uuidlib
from typing import Any, cast

from aiohttp import web

from services.api import params, views
from services.api.collection import next_link
from services.api.context import ApiContext
from services.api.json_patch import apply_patch
from services.api.port_values import PORT_CREATE_KEYS, validate_port_values
from services.api.validators import is_valid_name, normalize_mac
from services.common import errors
from services.common.db.nodes import is_uuid
from services.common.db.portgroups import PortgroupRepository
from services.common.db.ports import PortRepository
from services.common.db.records import NodeRecord, PortRecord
from services.common.jsonutil import dumps

PORTGROUP_FILTER_SINCE = (1, 24)
NODE_IDENT_SINCE = (1, 94)  # POST /v1/ports with node_ident: the node's name or UUID
SHARD_FILTER_SINCE = (1, 82)
CONDUCTOR_GROUPS_FILTER_SINCE = (1, 99)
PORTGROUP_PHYSNET_SINCE = (1, 102)
READONLY = {"uuid", "created_at", "updated_at", "links", "internal_info"}


class PortView(PortRecord):
    """A port as the api renders it: its record and its group's UUID."""

    portgroup_uuid: str | None


async def with_portgroup_uuids(portgroups: PortgroupRepository, rows: list[PortRecord]) -> list[PortView]:
    """The port rows themselves, with ``portgroup_uuid`` filled in (one query for the page)."""
    uuids = await portgroups.uuids_by_id([r["portgroup_id"] for r in rows])
    shown = cast(list[PortView], rows)  # filled in place just below: no copy of the page
    for row in shown:
        row["portgroup_uuid"] = uuids.get(row["portgroup_id"])
    return shown


def conductor_groups_filter(request: web.Request) -> list[str] | None:
    """``?conductor_groups=a,b`` (1.99, ports and port groups): the records of nodes in any of
    these conductor groups (case-insensitive, as conductor groups are); 406 below 1.99."""
    raw = request.query.get("conductor_groups")
    if raw is None:
        return None
    params.require_minimal_version(request, CONDUCTOR_GROUPS_FILTER_SINCE)
    return [g.strip() for g in raw.split(",") if g.strip()] or None


class PortsApi:
    def __init__(self, ctx: ApiContext) -> None:
        self.ctx = ctx
        self.ports = PortRepository(ctx.pool)
        self.portgroups = PortgroupRepository(ctx.pool)

    async def _with_groups(self, rows: list[PortRecord]) -> list[PortView]:
        return await with_portgroup_uuids(self.portgroups, rows)

    async def node_ports(self, request: web.Request) -> web.Response:
        node = await self.ctx.node_by_ident(request)
        return await self._list_ports(request, node_id=node["id"], detail=False)

    async def node_ports_detail(self, request: web.Request) -> web.Response:
        node = await self.ctx.node_by_ident(request)
        return await self._list_ports(request, node_id=node["id"], detail=True)

    async def list_ports(self, request: web.Request) -> web.Response:
        return await self._list_ports(request, detail=False)

    async def list_ports_detail(self, request: web.Request) -> web.Response:
        return await self._list_ports(request, detail=True)

    async def _list_ports(self, request: web.Request, *, detail: bool, node_id: int | None = None) -> web.Response:
        q = request.query
        fields = params.requested_fields(request, views.PORT_FIELD_VERSIONS)
        node_ident = q.get("node") or q.get("node_uuid")
        if node_ident and node_id is None:
            node_id = (await self.ctx.nodes.get_by_ident(node_ident))["id"]
        address = normalize_mac(q["address"]) if "address" in q else None
        shards = None
        if "shard" in q:  # 1.82: the ports of the nodes in these shards
            params.require_minimal_version(request, SHARD_FILTER_SINCE)
            shards = [s.strip() for s in q["shard"].split(",") if s.strip()] or None
            if shards and (node_id is not None or q.get("portgroup")):
                raise errors.Forbidden("Operation not permitted.")  # Ironic: one of node, portgroup, shard
        groups = conductor_groups_filter(request)
        if groups is not None and (node_id is not None or q.get("portgroup") or address is not None):
            raise errors.InvalidParameterValue(
                "Filtering by conductor_groups cannot be combined with node_ident, portgroup_ident, "
                "or node address filters."
            )
        limit = params.page_limit(request, self.ctx.config.max_limit)
        if q.get("portgroup"):  # 1.24: the ports of one group (UUID or name)
            params.require_version(request, PORTGROUP_FILTER_SINCE, "The portgroup filter")
            if node_id is not None or address is not None:
                raise errors.InvalidParameterValue("The portgroup filter cannot be combined with node or address")
            group = await self.portgroups.get(q["portgroup"])
            rows = await self._with_groups(
                await self.portgroups.ports(
                    group["id"],
                    limit=limit,
                    **params.page_order(request),
                )
            )
        else:
            rows = await self._with_groups(
                await self.ports.list(
                    node_id=node_id,
                    address=address,
                    node_shards=None if address is not None else shards,  # Ironic: an address wins
                    conductor_groups=groups,
                    limit=limit,
                    **params.page_order(request),
                )
            )
        base, version = self.ctx.base(request), request["version"]
        if detail:
            docs = [views.port_document(r, base=base, version=version) for r in rows]
        else:
            docs = [
                views.port_document(r, base=base, version=version, fields=fields or views.PORT_LIST_FIELDS)
                for r in rows
            ]
        body: dict[str, Any] = {"ports": docs}
        following = next_link(request, rows, base=base, limit=limit)
        if following:
            body["next"] = following
        return web.json_response(body, dumps=dumps)

    async def get_port(self, request: web.Request) -> web.Response:
        fields = params.requested_fields(request, views.PORT_FIELD_VERSIONS)
        port = (await self._with_groups([await self._by_path(request)]))[0]
        return web.json_response(
            views.port_document(port, base=self.ctx.base(request), version=request["version"], fields=fields),
            dumps=dumps,
        )

    async def create_port(self, request: web.Request) -> web.Response:
        body = await self.ctx.create_body(
            request,
            "port",
            PORT_CREATE_KEYS | {"node_ident"},
            {**views.PORT_FIELD_VERSIONS, "node_ident": NODE_IDENT_SINCE},
        )
        if "address" not in body or ("node_uuid" in body) == ("node_ident" in body):
            raise errors.InvalidParameterValue(
                "A port needs 'address' and one of 'node_uuid' or 'node_ident' (1.94)"
                if request["version"] >= NODE_IDENT_SINCE
                else "A port needs 'address' and 'node_uuid'"
            )
        if "node_ident" in body:
            node: NodeRecord | None = await self._node_of_port_ident(body.pop("node_ident"))
        else:
            if not isinstance(body["node_uuid"], str) or not is_uuid(body["node_uuid"]):
                raise errors.InvalidParameterValue(f"Expected a UUID for node_uuid but received {body['node_uuid']}.")
            # Without a port group nothing else needs the node: the INSERT finds it (one round trip less).
            node = await self._node_of_port(body["node_uuid"]) if body.get("portgroup_uuid") is not None else None
        values = validate_port_values(body, request["version"])
        node_uuid = values.pop("node_uuid", None)
        values.setdefault("uuid", str(uuidlib.uuid4()))
        if node is None:
            try:
                port = await self.ports.create(values, node_uuid=node_uuid)
            except errors.NodeNotFound:
                raise errors.InvalidParameterValue(f"Node {node_uuid} could not be found.") from None
            doc = views.port_document(
                (await self._with_groups([port]))[0], base=self.ctx.base(request), version=request["version"]
            )
            return web.json_response(doc, status=201, dumps=dumps, headers={"Location": doc["links"][0]["href"]})
        values["node_id"] = node["id"]
        group_id = await self.portgroups.resolve_for_port(values.pop("portgroup_uuid", None), node["id"])
        if group_id is not None:
            await self._check_group_physnet(group_id, values.get("physical_network"), None)
        port = await self.ports.create(values)
        if group_id is not None:
            await self.portgroups.set_port_group(port["uuid"], group_id)
            port["portgroup_id"] = group_id
        port = (await self._with_groups([port]))[0]
        doc = views.port_document(port, base=self.ctx.base(request), version=request["version"])
        return web.json_response(doc, status=201, dumps=dumps, headers={"Location": doc["links"][0]["href"]})

    async def patch_port(self, request: web.Request) -> web.Response:
        port: PortRecord = (await self._with_groups([await self._by_path(request)]))[0]
        patch = await self.ctx.body(request)
        current = json.loads(dumps({k: port.get(k) for k in views.PORT_FIELD_VERSIONS if k in port}))
        changes = apply_patch(current, patch, READONLY, views.PORT_FIELD_VERSIONS, request["version"])
        if "extra" in changes and changes["extra"] is None:  # Ironic: removing /extra resets it to {}
            changes["extra"] = {}
        values = validate_port_values(changes, request["version"])
        if "node_uuid" in values:
            values["node_id"] = (await self._node_of_port(values.pop("node_uuid")))["id"]
        node_id = values.get("node_id", port["node_id"])
        group_changed = "portgroup_uuid" in values
        group_id = await self.portgroups.resolve_for_port(values.pop("portgroup_uuid", None), node_id)
        if not group_changed and port.get("portgroup_id") is not None and node_id != port["node_id"]:
            raise errors.InvalidParameterValue(
                "A port in a port group cannot move to another node; remove it from the group first"
            )
        member_of = group_id if group_changed else port.get("portgroup_id")
        if (
            request["version"] >= PORTGROUP_PHYSNET_SINCE
            and "physical_network" in values
            and port.get("portgroup_id") is not None
            and not group_changed
        ):
            # Ironic 1.102: a member's network follows its group's (PATCH the group instead).
            raise errors.Invalid("physical_network cannot be changed while the port belongs to a portgroup.")
        if member_of is not None and (group_changed or "physical_network" in values):
            physnet = values.get("physical_network", port.get("physical_network"))
            await self._check_group_physnet(member_of, physnet, port["uuid"])
        if values:
            port = await self.ports.update(port["uuid"], values)
        if group_changed:
            await self.portgroups.set_port_group(port["uuid"], group_id)
            port["portgroup_id"] = group_id
        port = (await self._with_groups([port]))[0]
        return web.json_response(
            views.port_document(port, base=self.ctx.base(request), version=request["version"]), dumps=dumps
        )

    async def _check_group_physnet(self, group_id: int, physnet: str | None, port_uuid: str | None) -> None:
        """Ironic's validate_port_physnet: every port of a group is on one physical network
        (which may be none); a port that would differ from the others is a 409."""
        others = await self.portgroups.member_physical_networks(group_id, except_port=port_uuid)
        if others and physnet not in others:
            group = (await self.portgroups.uuids_by_id([group_id]))[group_id]
            theirs = ", ".join(sorted(str(p) for p in others))
            raise errors.Conflict(
                f"Port with physical network {physnet} cannot become a member of port group {group} "
                f"which has ports in physical network {theirs}."
            )

    async def _by_path(self, request: web.Request) -> PortRecord:
        """The port the path names by UUID or name; anything that can be neither (a MAC
        address, ``malformed:uuid``) is a 400, as Ironic's ``args.uuid_or_name`` answers."""
        ident = request.match_info["ident"]
        if not is_uuid(ident) and not is_valid_name(ident):
            raise errors.InvalidParameterValue(f"Expected a logical name or UUID but received {ident}.")
        return await self.ports.get(ident)

    async def _node_of_port(self, node_uuid: str) -> NodeRecord:
        """A port's node; one that does not exist is a 400 (the request is about the port), as in Ironic."""
        try:
            return await self.ctx.nodes.get(node_uuid)
        except errors.NotFound:
            raise errors.InvalidParameterValue(f"Node {node_uuid} could not be found.") from None

    async def _node_of_port_ident(self, ident: Any) -> NodeRecord:
        """``node_ident`` (1.94): the node by name or UUID; one that does not exist is a 400."""
        if not isinstance(ident, str) or not (is_uuid(ident) or is_valid_name(ident)):
            raise errors.InvalidParameterValue(f"Expected a logical name or UUID for node_ident but received {ident}.")
        try:
            return await self.ctx.nodes.get_by_ident(ident)
        except errors.NotFound:
            raise errors.InvalidParameterValue(f"Node {ident} could not be found.") from None

    async def delete_port(self, request: web.Request) -> web.Response:
        port = await self._by_path(request)
        await self.ports.delete(port["uuid"])
        return web.Response(status=204)
