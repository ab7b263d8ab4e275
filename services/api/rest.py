"""Ironic-compatible REST v1 handlers: discovery, nodes, ports, drivers.

Handlers read through repositories and send every change that involves a
node's lifecycle or hardware to the owning conductor; they never build SQL
and never touch hardware.
"""

from __future__ import annotations

import asyncio
import json
import re
import uuid as uuidlib
from typing import Any

import asyncpg
import jsonpatch
from aiohttp import web

from ferrum.v1 import conductor_pb2 as cpb
from services.api import versions, views
from services.api.network_data import validate_network_data
from services.api.rest_base import read_json
from services.api.router import ConductorRouter
from services.common import errors, states
from services.common.config import ApiConfig
from services.common.db.allocations import AllocationRepository
from services.common.db.nodes import INTERFACE_FIELDS, NodeRepository, is_uuid
from services.common.db.portgroups import PortgroupRepository
from services.common.db.ports import PortRepository
from services.common.jsonutil import dumps, parse_datetimes

NAME_RE = re.compile(r"^[A-Za-z0-9\-._~]+$")
MAC_RE = re.compile(r"^([0-9a-f]{2}[:-]){5}[0-9a-f]{2}$")
NODE_CREATE_KEYS = {
    "uuid",
    "name",
    "driver",
    "driver_info",
    "properties",
    "instance_info",
    "extra",
    "chassis_uuid",
    "resource_class",
    "conductor_group",
    "owner",
    "lessee",
    "description",
    "automated_clean",
    "network_data",
    "protected",
    "protected_reason",
    "retired",
    "retired_reason",
    *INTERFACE_FIELDS,
}
NODE_DICT_FIELDS = ("driver_info", "properties", "instance_info", "extra", "network_data")
NODE_READONLY = {
    "uuid",
    "created_at",
    "updated_at",
    "links",
    "provision_state",
    "target_provision_state",
    "power_state",
    "target_power_state",
    "reservation",
    "provision_updated_at",
    "last_error",
    "driver_internal_info",
    "maintenance",
    "maintenance_reason",
    "console_enabled",
    "chassis_uuid",
    "inspection_started_at",
    "inspection_finished_at",
    "clean_step",
    "deploy_step",
    "raid_config",
    "target_raid_config",
    "traits",
    "fault",
    "conductor",
    "allocation_uuid",
    "ports",
    "states",
    "portgroups",
    "volume",
    "boot_mode",
    "secure_boot",
}
PORT_CREATE_KEYS = {
    "address",
    "node_uuid",
    "extra",
    "pxe_enabled",
    "local_link_connection",
    "physical_network",
    "uuid",
    "is_smartnic",
    "portgroup_uuid",
}
POWER_TARGETS = {states.POWER_ON, states.POWER_OFF, states.REBOOT, states.SOFT_REBOOT, states.SOFT_POWER_OFF}
_NODE_TIMESTAMPS = (
    "created_at",
    "updated_at",
    "provision_updated_at",
    "inspection_started_at",
    "inspection_finished_at",
    "reservation_expires_at",
)


def normalize_mac(value: Any) -> str:
    if not isinstance(value, str) or not MAC_RE.match(value.lower()):
        raise errors.InvalidParameterValue(f"Expected a MAC address but received {value}.")
    return value.lower().replace("-", ":")


def _require_version(request: web.Request, since: tuple[int, int], what: str) -> None:
    if request["version"] < since:
        raise errors.NotAcceptable(f"{what} requires API version {since[0]}.{since[1]} or newer")


def _endpoint_gone(request: web.Request, since: tuple[int, int]) -> None:
    if request["version"] < since:
        raise web.HTTPNotFound()


class RestApi:
    def __init__(self, pool: asyncpg.Pool, router: ConductorRouter, config: ApiConfig) -> None:
        self.pool = pool
        self.router = router
        self.config = config
        self.nodes = NodeRepository(pool)
        self.ports = PortRepository(pool)
        self.portgroups = PortgroupRepository(pool)
        self.allocations = AllocationRepository(pool)

    def routes(self, app: web.Application) -> None:
        r = app.router
        r.add_get("/", self.root)
        r.add_route("*", "/v1", self.v1_root)
        r.add_route("*", "/v1/", self.v1_root)
        r.add_get("/v1/nodes", self.list_nodes)
        r.add_post("/v1/nodes", self.create_node)
        r.add_get("/v1/nodes/detail", self.list_nodes_detail)
        r.add_get("/v1/nodes/{ident}", self.get_node)
        r.add_patch("/v1/nodes/{ident}", self.patch_node)
        r.add_delete("/v1/nodes/{ident}", self.delete_node)
        r.add_get("/v1/nodes/{ident}/validate", self.validate_node)
        r.add_get("/v1/nodes/{ident}/states", self.node_states)
        r.add_put("/v1/nodes/{ident}/states/power", self.set_power)
        r.add_put("/v1/nodes/{ident}/states/provision", self.set_provision)
        r.add_put("/v1/nodes/{ident}/maintenance", self.set_maintenance)
        r.add_delete("/v1/nodes/{ident}/maintenance", self.unset_maintenance)
        r.add_get("/v1/nodes/{ident}/management/boot_device", self.get_boot_device)
        r.add_put("/v1/nodes/{ident}/management/boot_device", self.set_boot_device)
        r.add_get("/v1/nodes/{ident}/management/boot_device/supported", self.supported_boot_devices)
        r.add_get("/v1/nodes/{ident}/traits", self.list_traits)
        r.add_put("/v1/nodes/{ident}/traits", self.set_traits)
        r.add_delete("/v1/nodes/{ident}/traits", self.clear_traits)
        r.add_put("/v1/nodes/{ident}/traits/{trait}", self.add_trait)
        r.add_delete("/v1/nodes/{ident}/traits/{trait}", self.remove_trait)
        r.add_get("/v1/nodes/{ident}/vifs", self.list_vifs)
        r.add_post("/v1/nodes/{ident}/vifs", self.attach_vif)
        r.add_delete("/v1/nodes/{ident}/vifs/{vif}", self.detach_vif)
        r.add_get("/v1/nodes/{ident}/ports", self.node_ports)
        r.add_get("/v1/nodes/{ident}/ports/detail", self.node_ports_detail)
        r.add_get("/v1/ports", self.list_ports)
        r.add_post("/v1/ports", self.create_port)
        r.add_get("/v1/ports/detail", self.list_ports_detail)
        r.add_get("/v1/ports/{ident}", self.get_port)
        r.add_patch("/v1/ports/{ident}", self.patch_port)
        r.add_delete("/v1/ports/{ident}", self.delete_port)
        r.add_get("/v1/drivers", self.list_drivers)
        r.add_get("/v1/drivers/{name}", self.get_driver)
        r.add_get("/v1/drivers/{name}/properties", self.driver_properties)
        from services.api.ramdisk import RamdiskEndpoints

        RamdiskEndpoints(self).routes(app)
        # Modules with their own routes import this one, so they are pulled in here.
        from services.api import (
            allocations,
            baremetal_events,
            bios,
            conductors,
            deploy_templates,
            history,
            management,
            openapi,
            portgroups,
            vendor,
        )

        allocations.AllocationsApi(self).routes(app)
        # Only paths ending in '/' match; no other route does but / and /v1/, registered first.
        r.add_route("*", "/{path:.+/}", self.trailing_slash)
        portgroups.PortgroupsApi(self).routes(app)
        bios.BiosApi(self).routes(app)
        history.HistoryApi(self).routes(app)
        conductors.ConductorsApi(self).routes(app)
        baremetal_events.EventsApi(self).routes(app)
        deploy_templates.DeployTemplatesApi(self).routes(app)
        vendor.VendorPassthruApi(self).routes(app)
        management.ManagementApi(self).routes(app)
        openapi.OpenApiDocument().routes(app)

    # -- helpers ---------------------------------------------------------------

    async def trailing_slash(self, request: web.Request) -> web.Response:
        """python-ironicclient lists with filters as ``/v1/ports/?node=..``; Ironic
        serves both spellings, so a path that exists without the slash gets a 308
        to it (method and body kept), anything else the usual 404."""
        path = request.path.rstrip("/")
        match = await request.app.router.resolve(request.clone(rel_url=path))
        if match.http_exception is not None or match.handler == self.trailing_slash:
            raise web.HTTPNotFound()
        query = f"?{request.query_string}" if request.query_string else ""
        raise web.HTTPPermanentRedirect(f"{self.base(request)}{path}{query}")

    def base(self, request: web.Request) -> str:
        return (self.config.public_endpoint or f"{request.scheme}://{request.host}").rstrip("/")

    async def body(self, request: web.Request, *, provision: bool = False) -> Any:
        limit = self.config.max_json_body_size_provision if provision else self.config.max_json_body_size
        return await read_json(request, limit=limit, depth=self.config.max_json_body_depth)

    def _fields(self, request: web.Request, known: dict[str, tuple[int, int]]) -> list[str] | None:
        raw = request.query.get("fields")
        if raw is None:
            return None
        _require_version(request, (1, 8), "The fields parameter")
        # An empty ?fields= asks for nothing in particular: the default view, not a links-only one.
        return views.check_fields([f.strip() for f in raw.split(",") if f.strip()], known, request["version"]) or None

    def _limit(self, request: web.Request) -> int:
        raw = request.query.get("limit")
        if raw is None:
            return self.config.max_limit
        try:
            limit = int(raw)
        except ValueError:
            raise errors.InvalidParameterValue(f"Invalid limit value: {raw}") from None
        if limit <= 0:
            raise errors.InvalidParameterValue("Limit must be positive")
        return min(limit, self.config.max_limit)

    def node_doc(
        self, request: web.Request, row: dict[str, Any], fields: list[str] | None = None, full: bool = True
    ) -> dict[str, Any]:
        owner = self.router.rings.owner(row["uuid"], row["driver"], row["conductor_group"])
        return views.node_document(
            row,
            base=self.base(request),
            version=request["version"],
            fields=fields,
            conductor=owner["hostname"] if owner else None,
            full=full,
        )

    async def rpc(self, node: dict[str, Any], method: str, message: Any) -> Any:
        return await self.router.call(node["uuid"], node["driver"], node["conductor_group"], method, message)

    async def node_by_ident(self, request: web.Request) -> dict[str, Any]:
        ident = request.match_info["ident"]
        if not is_uuid(ident) and request["version"] < (1, 5):
            raise errors.NodeNotFound(f"Node {ident} could not be found.")
        return await self.nodes.get_by_ident(ident)

    # -- discovery ---------------------------------------------------------------

    def _version_doc(self, base: str) -> dict[str, Any]:
        return {
            "id": "v1",
            "links": [{"href": f"{base}/v1/", "rel": "self"}],
            "status": "CURRENT",
            "min_version": versions.fmt(versions.MIN_VERSION),
            "version": versions.fmt(versions.MAX_VERSION),
        }

    async def root(self, request: web.Request) -> web.Response:
        doc = self._version_doc(self.base(request))
        return web.json_response(
            {
                "name": "OpenStack Ironic API",
                "description": "Ironic is an OpenStack project which aims to provision baremetal machines. "
                "This endpoint is served by Ferrum.",
                "default_version": doc,
                "versions": [doc],
            }
        )

    async def v1_root(self, request: web.Request) -> web.Response:
        if request.method not in ("GET", "HEAD"):
            raise web.HTTPMethodNotAllowed(request.method, ["GET", "HEAD"])
        base = self.base(request)
        doc: dict[str, Any] = {
            "id": "v1",
            "links": [
                {"href": f"{base}/v1/", "rel": "self"},
                {
                    "href": "https://docs.openstack.org//ironic/latest/contributor//webapi.html",
                    "rel": "describedby",
                    "type": "text/html",
                },
            ],
            "media_types": {"base": "application/json", "type": "application/vnd.openstack.ironic.v1+json"},
            "version": self._version_doc(base),
        }
        resources = ["chassis", "nodes", "ports", "drivers"]
        for name, since in (
            ("portgroups", (1, 23)),
            ("lookup", (1, 22)),
            ("heartbeat", (1, 22)),
            ("volume", (1, 32)),
            ("conductors", (1, 49)),
            ("allocations", (1, 52)),
            ("events", (1, 54)),
            ("deploy_templates", (1, 55)),
        ):
            if request["version"] >= since:
                resources.append(name)
        for name in resources:
            doc[name] = [{"href": f"{base}/v1/{name}/", "rel": "self"}, {"href": f"{base}/{name}/", "rel": "bookmark"}]
        return web.json_response(doc)

    # -- nodes -------------------------------------------------------------------

    async def list_nodes(self, request: web.Request) -> web.Response:
        detail = request.query.get("detail")
        if detail is not None:
            _require_version(request, (1, 43), "The detail parameter")
            if request.query.get("fields"):
                raise errors.InvalidParameterValue("Can not specify ?detail=True and fields in the same request.")
            return await self._list_nodes(request, detail=detail.lower() in ("true", "1"))
        return await self._list_nodes(request, detail=False)

    async def list_nodes_detail(self, request: web.Request) -> web.Response:
        if request.query.get("fields"):
            raise errors.InvalidParameterValue("Can not specify fields on /detail")
        return await self._list_nodes(request, detail=True, path="/v1/nodes/detail")

    async def _list_nodes(self, request: web.Request, *, detail: bool, path: str = "/v1/nodes") -> web.Response:
        q = request.query
        fields = self._fields(request, views.NODE_FIELD_VERSIONS)
        filters: dict[str, Any] = {}
        for name, since in (
            ("provision_state", (1, 9)),
            ("driver", (1, 16)),
            ("resource_class", (1, 21)),
            ("conductor_group", (1, 46)),
            ("owner", (1, 50)),
            ("instance_uuid", (1, 1)),
            ("fault", (1, 42)),
            ("lessee", (1, 65)),
            ("project", (1, 65)),
        ):
            if name in q:
                _require_version(request, since, f"The {name} filter")
                filters[name] = q[name]
        if "provision_state" in filters and filters["provision_state"] not in states.ALL_STATES:
            raise errors.InvalidParameterValue(f"Invalid provision state {filters['provision_state']}")
        if "instance_uuid" in filters and not is_uuid(filters["instance_uuid"]):
            raise errors.InvalidParameterValue(f"Expected a UUID but received {filters['instance_uuid']}.")
        for name in ("maintenance", "retired"):
            if name in q:
                if name == "retired":
                    _require_version(request, (1, 61), "The retired filter")
                filters[name] = _bool(q[name], name)
        associated = _bool(q["associated"], "associated") if "associated" in q else None
        limit = self._limit(request)
        rows = await self.with_allocations(
            await self.nodes.list(
                filters=filters,
                associated=associated,
                limit=limit,
                marker=q.get("marker"),
                sort_key=q.get("sort_key", "id"),
                sort_dir=q.get("sort_dir", "asc"),
            )
        )
        if detail:
            docs = [self.node_doc(request, r) for r in rows]
        else:
            docs = [self.node_doc(request, r, fields or list(views.NODE_LIST_FIELDS), full=False) for r in rows]
        body: dict[str, Any] = {"nodes": docs}
        if len(rows) == limit and rows and "instance_uuid" not in filters:
            carried = {k: v for k, v in q.items() if k not in ("limit", "marker")}
            carried.update(limit=str(limit), marker=rows[-1]["uuid"])
            body["next"] = f"{self.base(request)}{path}?" + "&".join(f"{k}={v}" for k, v in carried.items())
        return web.json_response(body, dumps=dumps)

    async def get_node(self, request: web.Request) -> web.Response:
        fields = self._fields(request, views.NODE_FIELD_VERSIONS)
        node = (await self.with_allocations([await self.node_by_ident(request)]))[0]
        return web.json_response(self.node_doc(request, node, fields), dumps=dumps)

    async def with_allocations(self, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Node rows with ``allocation_uuid`` (1.52). An allocation sets the node's
        instance_uuid, so only nodes with an instance can have one: no query otherwise."""
        uuids = await self.allocations.uuids_for_nodes([r["id"] for r in rows if r.get("instance_uuid") and "id" in r])
        for row in rows:
            row["allocation_uuid"] = uuids.get(row.get("id"))
        return rows

    async def create_body(
        self, request: web.Request, what: str, allowed: set[str], versions: dict[str, tuple[int, int]]
    ) -> dict[str, Any]:
        """A create request's JSON object: only known keys, none newer than the version."""
        body = await self.body(request)
        if not isinstance(body, dict):
            raise errors.Invalid(f"A {what} must be a JSON object")
        unknown = set(body) - allowed
        if unknown:
            raise errors.InvalidParameterValue(
                f"Additional properties are not allowed ({', '.join(sorted(map(repr, unknown)))} unexpected)"
            )
        for key in body:
            since = versions.get(key)
            if since and since > request["version"]:
                raise errors.NotAcceptable(f"Field {key} is not supported at this API version")
        return body

    async def create_node(self, request: web.Request) -> web.Response:
        body = await self.create_body(request, "node", NODE_CREATE_KEYS, views.NODE_FIELD_VERSIONS)
        values = _validate_node_values(body, create=True)
        if request["version"] < (1, 11):
            values["provision_state"] = states.AVAILABLE
        if values.get("uuid") is None:  # absent or null: generate one
            values["uuid"] = str(uuidlib.uuid4())
        values.pop("chassis_uuid", None)
        reply = await self.router.call(
            values["uuid"],
            values["driver"],
            values.get("conductor_group", ""),
            "CreateNode",
            cpb.ConductorCreateNodeRequest(node_json=dumps(values)),
        )
        node = parse_datetimes(json.loads(reply.node_json), _NODE_TIMESTAMPS)
        doc = self.node_doc(request, node)
        return web.json_response(doc, status=201, dumps=dumps, headers={"Location": doc["links"][0]["href"]})

    async def patch_node(self, request: web.Request) -> web.Response:
        node = await self.node_by_ident(request)
        patch = await self.body(request)
        reset = request.query.get("reset_interfaces")
        current = self.node_doc_for_patch(node)
        changes = apply_patch(current, patch, NODE_READONLY, views.NODE_FIELD_VERSIONS, request["version"])
        if reset is not None:
            _require_version(request, (1, 45), "reset_interfaces")
            if "driver" not in changes:
                raise errors.InvalidParameterValue(
                    "The reset_interfaces parameter can be provided only when changing the node's driver."
                )
        values = checked_node_changes(node, changes)
        if not values:
            return web.json_response(self.node_doc(request, node), dumps=dumps)
        if "driver" in values:
            await self.router.route(node["uuid"], values["driver"], node["conductor_group"])
        reply = await self.rpc(
            node,
            "UpdateNode",
            cpb.ConductorUpdateNodeRequest(
                node_uuid=node["uuid"],
                changes_json=dumps(values),
                reset_interfaces=_bool(reset or "false", "reset_interfaces"),
            ),
        )
        updated = (await self.with_allocations([parse_datetimes(json.loads(reply.node_json), _NODE_TIMESTAMPS)]))[0]
        return web.json_response(self.node_doc(request, updated), dumps=dumps)

    def node_doc_for_patch(self, node: dict[str, Any]) -> dict[str, Any]:
        doc = {k: node.get(k) for k in views.NODE_FIELD_VERSIONS if k in node}
        return json.loads(dumps(doc))

    async def delete_node(self, request: web.Request) -> web.Response:
        node = await self.node_by_ident(request)
        await self.rpc(node, "DestroyNode", cpb.NodeRef(node_uuid=node["uuid"]))
        return web.Response(status=204)

    async def validate_node(self, request: web.Request) -> web.Response:
        node = await self.node_by_ident(request)
        reply = await self.rpc(node, "ValidateDriverInterfaces", cpb.NodeRef(node_uuid=node["uuid"]))
        doc = {}
        for item in reply.interfaces:
            doc[item.interface] = {"result": item.result, **({"reason": item.reason} if not item.result else {})}
        return web.json_response(doc)

    async def node_states(self, request: web.Request) -> web.Response:
        node = await self.node_by_ident(request)
        return web.json_response(views.node_states_document(node, request["version"]), dumps=dumps)

    async def set_power(self, request: web.Request) -> web.Response:
        node = await self.node_by_ident(request)
        body = await self.body(request)
        target = body.get("target") if isinstance(body, dict) else None
        if target not in POWER_TARGETS:
            raise errors.InvalidParameterValue(f"Invalid state {target!r}: must be one of {sorted(POWER_TARGETS)}")
        timeout = body.get("timeout")
        if target in (states.SOFT_REBOOT, states.SOFT_POWER_OFF) or timeout is not None:
            _require_version(request, (1, 27), "Soft power actions and timeout")
        if timeout is not None and (
            not isinstance(timeout, int) or isinstance(timeout, bool) or not 1 <= timeout <= 2**31 - 1
        ):
            raise errors.InvalidParameterValue(
                f"Invalid timeout value {timeout}. The timeout must be a positive integer."
            )
        await self.rpc(
            node, "ChangePowerState", cpb.PowerStateRequest(node_uuid=node["uuid"], target=target, timeout=timeout or 0)
        )
        return web.Response(status=202, headers={"Location": f"{self.base(request)}/v1/nodes/{node['uuid']}/states"})

    async def set_provision(self, request: web.Request) -> web.Response:
        node = await self.node_by_ident(request)
        body = await self.body(request, provision=True)
        if not isinstance(body, dict) or not isinstance(body.get("target"), str):
            raise errors.InvalidParameterValue("The provision request needs a 'target' string")
        unknown = set(body) - {
            "target",
            "configdrive",
            "clean_steps",
            "rescue_password",
            "deploy_steps",
            "disable_ramdisk",
        }
        if unknown:
            raise errors.InvalidParameterValue(f"Unknown provision parameters: {', '.join(sorted(unknown))}")
        verb = body["target"]
        try:
            event = states.verb_to_event(verb)
            since = states.verb_min_version(verb)
        except states.UnknownVerb:
            raise errors.InvalidParameterValue(f'The requested action "{verb}" could not be understood.') from None
        if verb == "abort":
            since = max(since, states.abort_min_version(node["provision_state"]))
        _require_version(request, since, f"The provision verb {verb}")
        if event in ("deploy", "rebuild") and node["maintenance"]:
            raise errors.NodeInMaintenance(
                f"The {verb} action can not be performed on node {node['uuid']} while it is in maintenance mode."
            )
        if event not in states.allowed_events(node["provision_state"]):
            if node["reservation"]:
                raise errors.NodeLocked(
                    f"Node {node['uuid']} is locked by host {node['reservation']}, please retry after the current operation is completed."
                )
            raise errors.InvalidStateRequested(
                f'The requested action "{verb}" can not be performed on node "{node["uuid"]}" while it is in state "{node["provision_state"]}".'
            )
        configdrive = body.get("configdrive")
        check_configdrive(configdrive, verb, request["version"])
        await check_configdrive_payload(configdrive)
        clean_steps = body.get("clean_steps")
        if clean_steps is not None and verb != "clean":
            raise errors.InvalidParameterValue(
                '"clean_steps" is only valid when setting target provision state to clean'
            )
        if verb == "clean" and not isinstance(clean_steps, list):
            raise errors.InvalidParameterValue('"clean_steps" is required when setting target provision state to clean')
        for step in clean_steps or ():
            if (
                not isinstance(step, dict)
                or not isinstance(step.get("interface"), str)
                or not isinstance(step.get("step"), str)
                or not isinstance(step.get("args", {}), dict)
                or set(step) - {"interface", "step", "args", "order"}
            ):
                raise errors.InvalidParameterValue(
                    f'Invalid clean step {step!r}: expected {{"interface", "step", "args"?, "order"?}}'
                )
        if body.get("rescue_password") is not None and verb != "rescue":
            raise errors.InvalidParameterValue(
                '"rescue_password" is only valid when setting target provision state to rescue'
            )
        if verb == "rescue" and not (isinstance(body.get("rescue_password"), str) and body["rescue_password"].strip()):
            raise errors.InvalidParameterValue(
                'A non-empty "rescue_password" is required when setting target provision state to rescue'
            )
        deploy_steps = check_deploy_steps(body.get("deploy_steps"), verb, request["version"])
        disable_ramdisk = check_disable_ramdisk(body.get("disable_ramdisk"), verb, request["version"])
        await self.rpc(
            node,
            "DoProvisionAction",
            cpb.ProvisionActionRequest(
                node_uuid=node["uuid"],
                event=event,
                configdrive_json=json.dumps(configdrive) if configdrive else "",
                clean_steps_json=json.dumps(clean_steps) if clean_steps is not None else "",
                rescue_password=body.get("rescue_password") or "",
                deploy_steps_json=json.dumps(deploy_steps) if deploy_steps else "",
                disable_ramdisk=disable_ramdisk,
            ),
        )
        return web.Response(status=202, headers={"Location": f"{self.base(request)}/v1/nodes/{node['uuid']}/states"})

    async def set_maintenance(self, request: web.Request) -> web.Response:
        node = await self.node_by_ident(request)
        reason = None
        if request.can_read_body:
            body = await self.body(request)
            reason = body.get("reason") if isinstance(body, dict) else None
            if reason is not None and not isinstance(reason, str):
                raise errors.InvalidParameterValue("The maintenance reason must be a string")
        await self.rpc(
            node,
            "SetMaintenance",
            cpb.MaintenanceRequest(node_uuid=node["uuid"], maintenance=True, reason=reason or ""),
        )
        return web.Response(status=202)

    async def unset_maintenance(self, request: web.Request) -> web.Response:
        node = await self.node_by_ident(request)
        await self.rpc(node, "SetMaintenance", cpb.MaintenanceRequest(node_uuid=node["uuid"], maintenance=False))
        return web.Response(status=202)

    async def get_boot_device(self, request: web.Request) -> web.Response:
        node = await self.node_by_ident(request)
        reply = await self.rpc(node, "GetBootDevice", cpb.NodeRef(node_uuid=node["uuid"]))
        return web.json_response({"boot_device": reply.boot_device or None, "persistent": reply.persistent})

    async def set_boot_device(self, request: web.Request) -> web.Response:
        node = await self.node_by_ident(request)
        body = await self.body(request)
        if not isinstance(body, dict) or not isinstance(body.get("boot_device"), str):
            raise errors.InvalidParameterValue("boot_device is required")
        persistent = body.get("persistent", False)
        if not isinstance(persistent, bool):
            raise errors.InvalidParameterValue("persistent must be a boolean")
        await self.rpc(
            node,
            "SetBootDevice",
            cpb.BootDeviceRequest(node_uuid=node["uuid"], boot_device=body["boot_device"], persistent=persistent),
        )
        return web.Response(status=204)

    async def supported_boot_devices(self, request: web.Request) -> web.Response:
        node = await self.node_by_ident(request)
        reply = await self.rpc(node, "GetSupportedBootDevices", cpb.NodeRef(node_uuid=node["uuid"]))
        return web.json_response({"supported_boot_devices": list(reply.boot_devices)})

    # -- traits (1.37) ---------------------------------------------------------------

    async def _save_traits(self, node: dict[str, Any], traits: list[str]) -> web.Response:
        await self.rpc(
            node,
            "UpdateNode",
            cpb.ConductorUpdateNodeRequest(node_uuid=node["uuid"], changes_json=dumps({"traits": traits})),
        )
        return web.Response(status=204)

    async def list_traits(self, request: web.Request) -> web.Response:
        _endpoint_gone(request, (1, 37))
        node = await self.node_by_ident(request)
        return web.json_response({"traits": sorted(node["traits"])})

    async def set_traits(self, request: web.Request) -> web.Response:
        _endpoint_gone(request, (1, 37))
        node = await self.node_by_ident(request)
        body = await self.body(request)
        if not isinstance(body, dict) or set(body) != {"traits"} or not isinstance(body["traits"], list):
            raise errors.InvalidParameterValue('The body must be {"traits": [...]}')
        traits = sorted({validate_trait(t) for t in body["traits"]})
        if len(traits) > MAX_TRAITS:
            raise errors.InvalidParameterValue(f"Could not modify traits: a node can have at most {MAX_TRAITS} traits")
        return await self._save_traits(node, traits)

    async def clear_traits(self, request: web.Request) -> web.Response:
        _endpoint_gone(request, (1, 37))
        return await self._save_traits(await self.node_by_ident(request), [])

    async def add_trait(self, request: web.Request) -> web.Response:
        _endpoint_gone(request, (1, 37))
        node = await self.node_by_ident(request)
        trait = validate_trait(request.match_info["trait"])
        traits = sorted(set(node["traits"]) | {trait})
        if len(traits) > MAX_TRAITS:
            raise errors.InvalidParameterValue(f"Could not modify traits: a node can have at most {MAX_TRAITS} traits")
        return await self._save_traits(node, traits)

    async def remove_trait(self, request: web.Request) -> web.Response:
        _endpoint_gone(request, (1, 37))
        node = await self.node_by_ident(request)
        trait = request.match_info["trait"]
        if trait not in node["traits"]:
            raise errors.NotFound(f"Node {node['uuid']} doesn't have a trait '{trait}'")
        return await self._save_traits(node, sorted(set(node["traits"]) - {trait}))

    # -- VIFs (1.28) ----------------------------------------------------------------

    async def list_vifs(self, request: web.Request) -> web.Response:
        _endpoint_gone(request, (1, 28))
        node = await self.node_by_ident(request)
        ports = await self.ports.list(node_id=node["id"], limit=self.config.max_limit)
        groups = await self.portgroups.list(node_id=node["id"], limit=self.config.max_limit)
        vifs = [
            {"id": p["internal_info"]["tenant_vif_port_id"]}
            for p in [*ports, *groups]
            if (p.get("internal_info") or {}).get("tenant_vif_port_id")
        ]
        return web.json_response({"vifs": vifs})

    async def attach_vif(self, request: web.Request) -> web.Response:
        _endpoint_gone(request, (1, 28))
        node = await self.node_by_ident(request)
        body = await self.body(request)
        vif = body.get("id") if isinstance(body, dict) else None
        if not isinstance(vif, str) or not vif or len(vif) > 255:
            raise errors.InvalidParameterValue("A VIF attachment needs an 'id' string")
        target = {k: body[k] for k in ("port_uuid", "portgroup_uuid") if body.get(k) is not None}
        if target:  # 1.67: attach to this very port or port group
            _require_version(request, (1, 67), "port_uuid and portgroup_uuid in a VIF attachment")
            if len(target) == 2:
                raise errors.InvalidParameterValue("Cannot specify both port_uuid and portgroup_uuid")
            for key, value in target.items():
                if not isinstance(value, str) or not is_uuid(value):
                    raise errors.InvalidParameterValue(f"Expected a UUID for {key} but received {value}.")
        await self.rpc(node, "VifAttach", cpb.VifRequest(node_uuid=node["uuid"], vif_id=vif, **target))
        return web.Response(status=204)

    async def detach_vif(self, request: web.Request) -> web.Response:
        _endpoint_gone(request, (1, 28))
        node = await self.node_by_ident(request)
        await self.rpc(node, "VifDetach", cpb.VifRequest(node_uuid=node["uuid"], vif_id=request.match_info["vif"]))
        return web.Response(status=204)

    # -- ports -------------------------------------------------------------------

    async def node_ports(self, request: web.Request) -> web.Response:
        node = await self.node_by_ident(request)
        return await self._list_ports(request, node_id=node["id"], detail=False)

    async def node_ports_detail(self, request: web.Request) -> web.Response:
        node = await self.node_by_ident(request)
        return await self._list_ports(request, node_id=node["id"], detail=True)

    async def list_ports(self, request: web.Request) -> web.Response:
        return await self._list_ports(request, detail=False)

    async def list_ports_detail(self, request: web.Request) -> web.Response:
        return await self._list_ports(request, detail=True)

    async def _list_ports(self, request: web.Request, *, detail: bool, node_id: int | None = None) -> web.Response:
        q = request.query
        fields = self._fields(request, views.PORT_FIELD_VERSIONS)
        node_ident = q.get("node") or q.get("node_uuid")
        if node_ident and node_id is None:
            node_id = (await self.nodes.get_by_ident(node_ident))["id"]
        address = normalize_mac(q["address"]) if "address" in q else None
        limit = self._limit(request)
        if q.get("portgroup"):  # 1.24: the ports of one group (UUID or name)
            _require_version(request, (1, 24), "The portgroup filter")
            if node_id is not None or address is not None:
                raise errors.InvalidParameterValue("The portgroup filter cannot be combined with node or address")
            group = await self.portgroups.get(q["portgroup"])
            rows = await self.with_portgroups(
                await self.portgroups.ports(
                    group["id"],
                    limit=limit,
                    marker=q.get("marker"),
                    sort_key=q.get("sort_key", "id"),
                    sort_dir=q.get("sort_dir", "asc"),
                )
            )
        else:
            rows = await self.with_portgroups(
                await self.ports.list(
                    node_id=node_id,
                    address=address,
                    limit=limit,
                    marker=q.get("marker"),
                    sort_key=q.get("sort_key", "id"),
                    sort_dir=q.get("sort_dir", "asc"),
                )
            )
        base, version = self.base(request), request["version"]
        if detail:
            docs = [views.port_document(r, base=base, version=version) for r in rows]
        else:
            docs = [
                views.port_document(r, base=base, version=version, fields=fields or views.PORT_LIST_FIELDS)
                for r in rows
            ]
        body: dict[str, Any] = {"ports": docs}
        if len(rows) == limit and rows:
            carried = {k: v for k, v in q.items() if k not in ("limit", "marker")}
            carried.update(limit=str(limit), marker=rows[-1]["uuid"])
            body["next"] = f"{base}{request.path}?" + "&".join(f"{k}={v}" for k, v in carried.items())
        return web.json_response(body, dumps=dumps)

    async def get_port(self, request: web.Request) -> web.Response:
        fields = self._fields(request, views.PORT_FIELD_VERSIONS)
        port = (await self.with_portgroups([await self.ports.get(request.match_info["ident"])]))[0]
        return web.json_response(
            views.port_document(port, base=self.base(request), version=request["version"], fields=fields), dumps=dumps
        )

    async def with_portgroups(self, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Port rows with ``portgroup_uuid`` filled in (one query for the page)."""
        uuids = await self.portgroups.uuids_by_id([r.get("portgroup_id") for r in rows])
        for row in rows:
            row["portgroup_uuid"] = uuids.get(row.get("portgroup_id"))
        return rows

    async def create_port(self, request: web.Request) -> web.Response:
        body = await self.create_body(request, "port", PORT_CREATE_KEYS, views.PORT_FIELD_VERSIONS)
        if "node_uuid" not in body or "address" not in body:
            raise errors.InvalidParameterValue("A port needs 'address' and 'node_uuid'")
        if not isinstance(body["node_uuid"], str) or not is_uuid(body["node_uuid"]):
            raise errors.InvalidParameterValue(f"Expected a UUID for node_uuid but received {body['node_uuid']}.")
        node = await self.nodes.get(body["node_uuid"])
        values = _validate_port_values(body, request["version"])
        values.pop("node_uuid", None)
        values["node_id"] = node["id"]
        values.setdefault("uuid", str(uuidlib.uuid4()))
        group_id = await self.portgroups.resolve_for_port(values.pop("portgroup_uuid", None), node["id"])
        port = await self.ports.create(values)
        if group_id is not None:
            await self.portgroups.set_port_group(port["uuid"], group_id)
            port["portgroup_id"] = group_id
        port = (await self.with_portgroups([port]))[0]
        doc = views.port_document(port, base=self.base(request), version=request["version"])
        return web.json_response(doc, status=201, dumps=dumps, headers={"Location": doc["links"][0]["href"]})

    async def patch_port(self, request: web.Request) -> web.Response:
        port = (await self.with_portgroups([await self.ports.get(request.match_info["ident"])]))[0]
        patch = await self.body(request)
        current = json.loads(dumps({k: port.get(k) for k in views.PORT_FIELD_VERSIONS if k in port}))
        changes = apply_patch(
            current,
            patch,
            {"uuid", "created_at", "updated_at", "links", "internal_info"},
            views.PORT_FIELD_VERSIONS,
            request["version"],
        )
        values = _validate_port_values(changes, request["version"])
        if "node_uuid" in values:
            values["node_id"] = (await self.nodes.get(values.pop("node_uuid")))["id"]
        node_id = values.get("node_id", port["node_id"])
        group_changed = "portgroup_uuid" in values
        group_id = await self.portgroups.resolve_for_port(values.pop("portgroup_uuid", None), node_id)
        if not group_changed and port.get("portgroup_id") is not None and node_id != port["node_id"]:
            raise errors.InvalidParameterValue(
                "A port in a port group cannot move to another node; remove it from the group first"
            )
        if values:
            port = await self.ports.update(port["uuid"], values)
        if group_changed:
            await self.portgroups.set_port_group(port["uuid"], group_id)
            port["portgroup_id"] = group_id
        port = (await self.with_portgroups([port]))[0]
        return web.json_response(
            views.port_document(port, base=self.base(request), version=request["version"]), dumps=dumps
        )

    async def delete_port(self, request: web.Request) -> web.Response:
        port = await self.ports.get(request.match_info["ident"])
        await self.ports.delete(port["uuid"])
        return web.Response(status=204)

    # -- drivers -----------------------------------------------------------------

    def _driver_doc(self, request: web.Request, name: str, hosts: list[str]) -> dict[str, Any]:
        base = self.base(request)
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
        _require_version(request, (1, 77), "The fields parameter on drivers")
        wanted = [f.strip() for f in raw.split(",") if f.strip()]
        for name in wanted:
            if name not in DRIVER_FIELDS:
                raise errors.InvalidParameterValue(f'Field(s) "{name}" are not valid')
        return wanted or None

    def _driver_interfaces(self, doc: dict[str, Any], name: str, hosts: list[str]) -> None:
        conductor = self.router.rings.conductors[hosts[0]]
        for kind, names in conductor["interfaces"].get(name, {}).items():
            if kind not in DRIVER_INTERFACE_KINDS:  # firmware: API 1.86, above our maximum
                continue
            doc[f"default_{kind}_interface"] = names[0] if names else None
            doc[f"enabled_{kind}_interfaces"] = names

    async def list_drivers(self, request: web.Request) -> web.Response:
        fields = self._driver_fields(request)
        if fields is not None and request.query.get("detail") is not None:
            raise errors.InvalidParameterValue("Can not specify ?detail=True and fields in the same request.")
        drivers = self.router.hardware_types()
        driver_type = request.query.get("type")
        if driver_type == "classic":
            drivers = {}
        docs = []
        for name, hosts in sorted(drivers.items()):
            doc = self._driver_doc(request, name, hosts)
            if fields is not None:
                self._driver_interfaces(doc, name, hosts)
                doc = {k: v for k, v in doc.items() if k in fields}
            docs.append(doc)
        return web.json_response({"drivers": docs})

    async def get_driver(self, request: web.Request) -> web.Response:
        fields = self._driver_fields(request)
        name = request.match_info["name"]
        drivers = self.router.hardware_types()
        if name not in drivers:
            raise errors.NotFound(f"Driver {name} could not be found.")
        doc = self._driver_doc(request, name, drivers[name])
        self._driver_interfaces(doc, name, drivers[name])
        if fields is not None:
            doc = {k: v for k, v in doc.items() if k in fields}
        return web.json_response(doc)

    async def driver_properties(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        if name not in self.router.hardware_types():
            raise errors.NotFound(f"Driver {name} could not be found.")
        return web.json_response({})


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
)
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
MAX_TRAITS = 50
TRAIT_RE = re.compile(r"^[A-Z0-9_]+$")


def validate_trait(value: Any) -> str:
    """Standard os-traits style names or CUSTOM_*, at most 255 characters."""
    if not isinstance(value, str) or not TRAIT_RE.match(value) or len(value) > 255:
        raise errors.InvalidParameterValue(
            f"Invalid trait {value!r}: a trait must be upper-case letters, digits and underscores "
            "(a standard trait or CUSTOM_...), at most 255 characters"
        )
    return value


def _bool(value: str, name: str) -> bool:
    lowered = value.strip().lower()
    if lowered in ("true", "1", "yes", "on"):
        return True
    if lowered in ("false", "0", "no", "off"):
        return False
    raise errors.InvalidParameterValue(f"Invalid value for {name}: {value}")


def checked_node_changes(node: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    """A node patch's changes, checked against the node's state (REST PATCH and gRPC PatchNode alike)."""
    if (
        node["target_provision_state"]
        and node["provision_state"] not in states.PATCH_ALLOWED_WITH_TARGET
        and not (node["maintenance"] and set(changes) == {"instance_uuid"})
    ):
        raise errors.InvalidState(f"Node {node['uuid']} can not be updated while a state transition is in progress.")
    values = _validate_node_values(changes, create=False)
    if values.get("retired") and node["provision_state"] == states.AVAILABLE:
        # Ironic (1.61): an available node is moved to manageable before it is retired.
        raise errors.InvalidState(
            f"Cannot set retired=True for node {node['uuid']} in state {node['provision_state']}; "
            "move it to manageable first"
        )
    return values


def _validate_node_values(values: dict[str, Any], *, create: bool) -> dict[str, Any]:
    out = dict(values)
    if create and not isinstance(values.get("driver"), str):
        raise errors.InvalidParameterValue("Mandatory field missing: 'driver'")
    for key in NODE_DICT_FIELDS:
        if key in out and not isinstance(out[key], dict):
            if out[key] is None and not create:
                out[key] = {}
            else:
                raise errors.InvalidParameterValue(f"{key} must be a JSON object")
    if "network_data" in out:
        validate_network_data(out["network_data"])
    if out.get("name") is not None:
        name = out["name"]
        if not isinstance(name, str) or not NAME_RE.match(name) or is_uuid(name) or len(name) > 255:
            raise errors.InvalidParameterValue(
                f"Cannot use name '{name}': names may contain only RFC 3986 unreserved characters and must not be a UUID."
            )
    for key in ("uuid", "instance_uuid"):
        if out.get(key) is not None and (not isinstance(out[key], str) or not is_uuid(out[key])):
            raise errors.InvalidParameterValue(f"Expected a UUID for {key} but received {out[key]}.")
    for key in (
        "driver",
        "resource_class",
        "conductor_group",
        "owner",
        "lessee",
        "description",
        "protected_reason",
        "retired_reason",
        *INTERFACE_FIELDS,
    ):
        if key in out and out[key] is not None and not isinstance(out[key], str):
            raise errors.InvalidParameterValue(f"{key} must be a string")
    if out.get("conductor_group") is not None and not re.match(r"^[A-Za-z0-9_\-.]*$", out["conductor_group"]):
        raise errors.InvalidParameterValue("conductor_group may contain letters, digits, _, - and . only")
    if out.get("resource_class") is not None and len(out["resource_class"]) > 80:
        raise errors.InvalidParameterValue("resource_class is longer than 80 characters")
    if out.get("conductor_group") is not None and len(out["conductor_group"]) > 255:
        raise errors.InvalidParameterValue("conductor_group is longer than 255 characters")
    if out.get("description") is not None and len(out["description"]) > 4096:
        raise errors.InvalidParameterValue("description is longer than 4096 characters")
    for key in ("automated_clean", "protected", "retired"):
        if key in out and out[key] is not None and not isinstance(out[key], bool):
            raise errors.InvalidParameterValue(f"{key} must be a boolean")
    if "conductor_group" in out and out["conductor_group"] is None:
        out["conductor_group"] = ""
    for key in ("protected", "retired"):  # NOT NULL flags: null means the default, false
        if key in out and out[key] is None:
            out[key] = False
    return out


LOCAL_LINK_KEYS = ("port_id", "switch_id", "hostname", "switch_info", "network_type")


def check_local_link_connection(llc: dict[str, Any], version: tuple[int, int] | None) -> None:
    """Ironic's LOCAL_LINK_CONN_SCHEMA: string values of known keys, and either
    empty, port_id with switch_id, port_id with hostname (smart NIC), or
    network_type "unmanaged" (1.64) alone; network_type is "managed" or "unmanaged"."""
    unknown = set(llc) - set(LOCAL_LINK_KEYS)
    if unknown:
        raise errors.InvalidParameterValue(
            f"Invalid local_link_connection: unexpected keys {sorted(unknown)}; allowed are {', '.join(LOCAL_LINK_KEYS)}"
        )
    for key, value in llc.items():
        if not isinstance(value, str):
            raise errors.InvalidParameterValue(f"Invalid local_link_connection: {key} must be a string")
    if "network_type" in llc:
        if version is not None and version < (1, 64):  # None: the native gRPC API, not versioned
            raise errors.NotAcceptable("network_type in local_link_connection requires API version 1.64 or newer")
        if llc["network_type"] not in ("managed", "unmanaged"):
            raise errors.InvalidParameterValue(
                f"Invalid local_link_connection: network_type must be 'managed' or 'unmanaged', not {llc['network_type']!r}"
            )
    if llc and not (
        llc.get("network_type") == "unmanaged" or ("port_id" in llc and ("switch_id" in llc or "hostname" in llc))
    ):
        raise errors.InvalidParameterValue(
            "Invalid local_link_connection: it needs port_id and switch_id, port_id and hostname (smart NIC), "
            "or network_type 'unmanaged'"
        )


def _validate_port_values(values: dict[str, Any], version: tuple[int, int] | None = None) -> dict[str, Any]:
    out = dict(values)
    if "address" in out:
        out["address"] = normalize_mac(out["address"])
    for key in ("extra", "local_link_connection"):
        if key in out and not isinstance(out[key], dict):
            raise errors.InvalidParameterValue(f"{key} must be a JSON object")
    if "local_link_connection" in out:
        check_local_link_connection(out["local_link_connection"], version)
    if "pxe_enabled" in out and not isinstance(out["pxe_enabled"], bool):
        raise errors.InvalidParameterValue("pxe_enabled must be a boolean")
    if "is_smartnic" in out and not isinstance(out["is_smartnic"], bool):
        raise errors.InvalidParameterValue("is_smartnic must be a boolean")
    if out.get("physical_network") is not None and not isinstance(out["physical_network"], str):
        raise errors.InvalidParameterValue("physical_network must be a string")
    if "node_uuid" in out and (not isinstance(out["node_uuid"], str) or not is_uuid(out["node_uuid"])):
        raise errors.InvalidParameterValue(f"Expected a UUID for node_uuid but received {out['node_uuid']}.")
    if "uuid" in out and (not isinstance(out["uuid"], str) or not is_uuid(out["uuid"])):
        raise errors.InvalidParameterValue(f"Expected a UUID but received {out['uuid']}.")
    return out


def apply_patch(
    current: dict[str, Any], patch: Any, readonly: set[str], known: dict[str, tuple[int, int]], version: tuple[int, int]
) -> dict[str, Any]:
    """Apply an RFC 6902 patch with Ironic's rules; returns the changed top-level fields."""
    if not isinstance(patch, list) or not patch:
        raise errors.PatchError("The patch must be a non-empty JSON list")
    for op in patch:
        if (
            not isinstance(op, dict)
            or op.get("op") not in ("add", "replace", "remove")
            or not isinstance(op.get("path"), str)
        ):
            raise errors.PatchError(f"Invalid patch operation {op!r}: op must be add, replace or remove with a path")
        if not op["path"].startswith("/") or op["path"] == "/":
            raise errors.PatchError(f"Invalid patch path {op['path']!r}")
        if op["op"] != "remove" and "value" not in op:
            raise errors.PatchError(f"'add' and 'replace' operations need a value: {op['path']}")
        root = op["path"].split("/")[1]
        if root in readonly:
            raise errors.PatchError(f"'{op['path']}' is an internal attribute and can not be updated")
        if root not in known:
            raise errors.PatchError(f"Adding a new attribute ({op['path']}) to the root of the resource is not allowed")
        if known[root] > version:
            raise errors.NotAcceptable(f"Field {root} is not supported at this API version")
    try:
        patched = jsonpatch.apply_patch(current, patch)
    except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException) as exc:
        raise errors.PatchError(f"Couldn't apply patch {patch!r}. Reason: {exc}") from None
    changes = {}
    for key in set(current) | set(patched):
        if current.get(key) != patched.get(key):
            changes[key] = patched.get(key)
    return changes


DEPLOY_STEP_INTERFACES = ("bios", "deploy", "firmware", "management", "power", "raid")


def check_deploy_steps(deploy_steps: Any, verb: str, version: tuple[int, int]) -> list[dict[str, Any]]:
    """Ironic's deploy_steps (1.69): only with active/rebuild, each step
    {interface, step, args, priority}. Whether the node offers the step is the
    conductor's check (400 there too)."""
    if not deploy_steps:
        return []
    if version < (1, 69):
        raise errors.NotAcceptable("Request not acceptable. The minimal required API version should be 1.69")
    if verb not in ("active", "rebuild"):
        raise errors.InvalidParameterValue(
            '"deploy_steps" is only valid when setting target provision state to active or rebuild'
        )
    if not isinstance(deploy_steps, list):
        raise errors.InvalidParameterValue("deploy_steps must be a list of steps")
    for step in deploy_steps:
        if (
            not isinstance(step, dict)
            or set(step) != {"interface", "step", "args", "priority"}
            or step["interface"] not in DEPLOY_STEP_INTERFACES
            or not isinstance(step["step"], str)
            or not step["step"]
            or not isinstance(step["args"], dict)
            or isinstance(step["priority"], bool)
            or not isinstance(step["priority"], int)
            or not 0 <= step["priority"] <= 2**31 - 1
        ):
            raise errors.InvalidParameterValue(
                f'Invalid deploy step {step!r}: expected {{"interface": one of {", ".join(DEPLOY_STEP_INTERFACES)}, '
                '"step": name, "args": object, "priority": integer >= 0}'
            )
    keys = [(s["interface"], s["step"]) for s in deploy_steps]
    if len(set(keys)) != len(keys):
        raise errors.InvalidParameterValue("Duplicate deploy steps: each interface and step may appear once")
    return deploy_steps


def check_disable_ramdisk(value: Any, verb: str, version: tuple[int, int]) -> bool:
    """disable_ramdisk (1.70): a boolean, for manual cleaning only."""
    if value is None:
        return False
    if version < (1, 70):
        raise errors.NotAcceptable("disable_ramdisk is not acceptable in this API version (1.70 or newer)")
    if not isinstance(value, bool):
        raise errors.InvalidParameterValue("disable_ramdisk must be a boolean")
    if verb != "clean":
        raise errors.InvalidParameterValue("disable_ramdisk is supported only with manual cleaning")
    return value


def check_configdrive(configdrive: Any, verb: str, version: tuple[int, int]) -> None:
    """CONTRACT.md 3.1; the full builder and storage arrive with the config drive issue."""
    if not configdrive:
        return
    if verb not in ("active", "rebuild") or (verb == "rebuild" and version < (1, 35)):
        raise errors.ConfigDriveInvalid(
            "Adding a config drive is only supported when setting provision state to active, rebuild"
        )
    if isinstance(configdrive, dict):
        if version < (1, 56):
            raise errors.ConfigDriveInvalid("Invalid configdrive format: a dictionary needs API version 1.56")
        extra = set(configdrive) - {"meta_data", "network_data", "user_data", "vendor_data"}
        if extra:
            raise errors.ConfigDriveInvalid(f"Invalid configdrive format: unexpected keys {sorted(extra)}")
        if "vendor_data" in configdrive and version < (1, 59):
            raise errors.ConfigDriveInvalid("Invalid configdrive format: vendor_data needs API version 1.59")
        for key in ("meta_data", "network_data", "vendor_data"):
            if key in configdrive and not isinstance(configdrive[key], dict):
                raise errors.ConfigDriveInvalid(f"Invalid configdrive format: {key} must be an object")
        return
    if not isinstance(configdrive, str):
        raise errors.ConfigDriveInvalid("Invalid configdrive format: expected a string or an object")
    if "://" in configdrive:
        return
    if not re.fullmatch(r"[A-Za-z0-9+/=\s]+", configdrive):
        raise errors.ConfigDriveInvalid(
            "Invalid configdrive format: it is neither a JSON, nor a URL, nor a base64 string"
        )


async def check_configdrive_payload(configdrive: Any) -> None:
    """Decode an inline drive once so that bad base64, bad gzip, a non-ISO
    payload or one over 64 MiB is a 400 now rather than a failed deploy later."""
    if not isinstance(configdrive, str) or not configdrive or "://" in configdrive:
        return
    from services.common.images.configdrive import decode_configdrive

    await asyncio.to_thread(decode_configdrive, configdrive)
