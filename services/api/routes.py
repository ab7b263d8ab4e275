"""Every REST route of the api, in one table.

Each row names the method, the path, the resource class and handler that
serve it, and, for an endpoint newer than 1.1, the microversion below which
it does not exist (404, Ironic's answer for a resource the client's version
does not know; :func:`services.api.params.require_endpoint`). Feature gates
inside an endpoint (a filter, a body key: 406) stay in the handlers.

The order is the registration order, and it matters where paths overlap:
``/v1/nodes/detail`` before ``/v1/nodes/{ident}``, ``.../vendor_passthru/methods``
before ``.../vendor_passthru/{method}``, and the trailing-slash redirect after
``/`` and ``/v1/``, the only routes of their own that end in a slash.
``docs/ports-and-endpoints.md`` and ``services/api/openapi.yaml`` list the
same routes; ``tests/unit/test_api_routes.py`` keeps the three in step.
``/metrics`` is not here: :func:`services.api.service.build_app` adds it, as
every Ferrum HTTP server does.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from services.api import params
from services.api.allocations import AllocationsApi
from services.api.chassis import ChassisApi
from services.api.conductors import ConductorsApi
from services.api.context import ApiContext
from services.api.deploy_templates import DeployTemplatesApi
from services.api.discovery import DiscoveryApi
from services.api.drivers import DriversApi
from services.api.external_events import ExternalEventsApi
from services.api.inspection_rules import InspectionRulesApi
from services.api.ipxe_passthru import IpxePassthru
from services.api.node_bios import NodeBiosApi
from services.api.node_firmware import NodeFirmwareApi
from services.api.node_history import NodeHistoryApi
from services.api.node_inventory import NodeInventoryApi
from services.api.node_management import NodeManagementApi
from services.api.node_states import NodeStatesApi
from services.api.node_traits import NodeTraitsApi
from services.api.node_vifs import NodeVifsApi
from services.api.node_vmedia import NodeVmediaApi
from services.api.nodes import NodesApi
from services.api.openapi import OpenApiDocument
from services.api.portgroups import PortgroupsApi
from services.api.ports import PortsApi
from services.api.ramdisk import RamdiskApi
from services.api.runbooks import RunbooksApi
from services.api.shards import ShardsApi
from services.api.trailing_slash import TrailingSlashRedirect
from services.api.vendor_passthru import HTTP_METHODS, VendorPassthruApi
from services.api.volumes import VolumeApi, VolumeConnectorsApi, VolumeTargetsApi

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass(frozen=True)
class Route:
    method: str  # an HTTP method, or "*" for any
    path: str
    resource: type
    handler: str  # the name of the resource's coroutine method
    since: tuple[int, int] | None = None  # 404 below this microversion
    head: bool = True  # a GET route also answers HEAD (aiohttp's add_get)
    refusal: int = 404  # what a request below ``since`` gets, where Ironic answers 405 or 406


def _node_routes() -> tuple[Route, ...]:
    n = "/v1/nodes/{ident}"
    return (
        Route("GET", "/v1/nodes", NodesApi, "list_nodes"),
        Route("POST", "/v1/nodes", NodesApi, "create_node"),
        Route("GET", "/v1/nodes/detail", NodesApi, "list_nodes_detail"),
        Route("GET", n, NodesApi, "get_node"),
        Route("PATCH", n, NodesApi, "patch_node"),
        Route("DELETE", n, NodesApi, "delete_node"),
        Route("GET", f"{n}/validate", NodesApi, "validate_node"),
        Route("GET", f"{n}/states", NodeStatesApi, "get_states"),
        Route("PUT", f"{n}/states/power", NodeStatesApi, "set_power"),
        Route("PUT", f"{n}/states/provision", NodeStatesApi, "set_provision"),
        Route("GET", f"{n}/states/console", NodeStatesApi, "get_console"),
        Route("PUT", f"{n}/states/console", NodeStatesApi, "set_console"),
        Route("PUT", f"{n}/states/raid", NodeStatesApi, "set_raid", (1, 12), refusal=406),
        Route("PUT", f"{n}/maintenance", NodeStatesApi, "set_maintenance"),
        Route("DELETE", f"{n}/maintenance", NodeStatesApi, "unset_maintenance"),
        Route("GET", f"{n}/management/boot_device", NodeManagementApi, "get_boot_device"),
        Route("PUT", f"{n}/management/boot_device", NodeManagementApi, "set_boot_device"),
        Route("GET", f"{n}/management/boot_device/supported", NodeManagementApi, "supported_boot_devices"),
        # Below 1.37 Ironic's node controller takes these: GET reads "traits" as ?fields= (406),
        # it has no PUT (405), and its DELETE answers 404 for anything under a node.
        Route("GET", f"{n}/traits", NodeTraitsApi, "list_traits", (1, 37), refusal=406),
        Route("PUT", f"{n}/traits", NodeTraitsApi, "set_traits", (1, 37), refusal=405),
        Route("DELETE", f"{n}/traits", NodeTraitsApi, "clear_traits", (1, 37)),
        Route("PUT", f"{n}/traits/{{trait}}", NodeTraitsApi, "add_trait", (1, 37), refusal=405),
        Route("DELETE", f"{n}/traits/{{trait}}", NodeTraitsApi, "remove_trait", (1, 37)),
        Route("GET", f"{n}/vifs", NodeVifsApi, "list_vifs", (1, 28)),
        Route("POST", f"{n}/vifs", NodeVifsApi, "attach_vif", (1, 28)),
        Route("DELETE", f"{n}/vifs/{{vif}}", NodeVifsApi, "detach_vif", (1, 28)),
        Route("GET", f"{n}/ports", PortsApi, "node_ports"),
        Route("GET", f"{n}/children", NodesApi, "list_children", (1, 83)),
        Route("GET", f"{n}/ports/detail", PortsApi, "node_ports_detail"),
    )


def _vendor_routes() -> tuple[Route, ...]:
    """python-ironicclient puts the method in the path (Ironic's pecan ``_default``
    accepts both that and ``?method=``); ``/methods`` comes first, so it wins for GET.
    These routes take the HTTP method as given, so none of them answers HEAD."""
    node, driver = "/v1/nodes/{ident}/vendor_passthru", "/v1/drivers/{driver}/vendor_passthru"
    v = VendorPassthruApi
    return (
        Route("GET", f"{node}/methods", v, "node_methods"),
        Route("GET", f"{driver}/methods", v, "driver_methods"),
        *(
            route
            for method in HTTP_METHODS
            for route in (
                Route(method, node, v, "node_call", head=False),
                Route(method, driver, v, "driver_call", head=False),
            )
        ),
        *(
            route
            for method in HTTP_METHODS
            for route in (
                Route(method, f"{node}/{{method}}", v, "node_call", head=False),
                Route(method, f"{driver}/{{method}}", v, "driver_call", head=False),
            )
        ),
    )


def _volume_routes() -> tuple[Route, ...]:
    since = (1, 32)
    rows = [
        Route("GET", "/v1/volume", VolumeApi, "volume_root", since),
        Route("GET", "/v1/volume/", VolumeApi, "volume_root", since),
    ]
    for plural, resource in (("connectors", VolumeConnectorsApi), ("targets", VolumeTargetsApi)):
        rows += [
            Route("GET", f"/v1/volume/{plural}", resource, "list_records", since),
            Route("POST", f"/v1/volume/{plural}", resource, "create_record", since),
            Route("GET", f"/v1/volume/{plural}/{{ident}}", resource, "get_record", since),
            Route("PATCH", f"/v1/volume/{plural}/{{ident}}", resource, "patch_record", since),
            Route("DELETE", f"/v1/volume/{plural}/{{ident}}", resource, "delete_record", since),
            Route("GET", f"/v1/nodes/{{node}}/volume/{plural}", resource, "list_records", since),
            Route("POST", f"/v1/nodes/{{node}}/volume/{plural}", resource, "refuse_node_post", since),
        ]
    rows.append(Route("GET", "/v1/nodes/{node}/volume", VolumeApi, "volume_root", since))
    return tuple(rows)


ROUTES: tuple[Route, ...] = (
    Route("GET", "/", DiscoveryApi, "root"),
    Route("*", "/v1", DiscoveryApi, "v1_root"),
    Route("*", "/v1/", DiscoveryApi, "v1_root"),
    *_node_routes(),
    Route("GET", "/v1/ports", PortsApi, "list_ports"),
    Route("POST", "/v1/ports", PortsApi, "create_port"),
    Route("GET", "/v1/ports/detail", PortsApi, "list_ports_detail"),
    Route("GET", "/v1/ports/{ident}", PortsApi, "get_port"),
    Route("PATCH", "/v1/ports/{ident}", PortsApi, "patch_port"),
    Route("DELETE", "/v1/ports/{ident}", PortsApi, "delete_port"),
    Route("GET", "/v1/chassis", ChassisApi, "list_chassis"),
    Route("POST", "/v1/chassis", ChassisApi, "create_chassis"),
    Route("GET", "/v1/chassis/detail", ChassisApi, "list_chassis_detail"),
    Route("GET", "/v1/chassis/{ident}", ChassisApi, "get_chassis"),
    Route("PATCH", "/v1/chassis/{ident}", ChassisApi, "patch_chassis"),
    Route("DELETE", "/v1/chassis/{ident}", ChassisApi, "delete_chassis"),
    Route("GET", "/v1/chassis/{ident}/nodes", NodesApi, "list_chassis_nodes"),
    Route("GET", "/v1/chassis/{ident}/nodes/detail", NodesApi, "list_chassis_nodes_detail"),
    Route("GET", "/v1/drivers", DriversApi, "list_drivers"),
    Route("GET", "/v1/drivers/{name}", DriversApi, "get_driver"),
    Route("GET", "/v1/drivers/{name}/properties", DriversApi, "driver_properties"),
    Route(
        "GET",
        "/v1/drivers/{driver}/raid/logical_disk_properties",
        DriversApi,
        "raid_logical_disk_properties",
        (1, 12),
        refusal=406,
    ),
    Route("GET", "/v1/lookup", RamdiskApi, "lookup", (1, 22)),
    Route("POST", "/v1/heartbeat", RamdiskApi, "heartbeat_without_node", (1, 22)),
    Route("POST", "/v1/heartbeat/{ident}", RamdiskApi, "heartbeat", (1, 22)),
    Route("POST", "/v1/continue_inspection", RamdiskApi, "continue_inspection"),
    Route("GET", "/v1/allocations", AllocationsApi, "list_allocations", (1, 52)),
    Route("POST", "/v1/allocations", AllocationsApi, "create_allocation", (1, 52), refusal=405),
    Route("GET", "/v1/allocations/{ident}", AllocationsApi, "get_allocation", (1, 52)),
    Route("PATCH", "/v1/allocations/{ident}", AllocationsApi, "patch_allocation", (1, 52), refusal=405),
    Route("DELETE", "/v1/allocations/{ident}", AllocationsApi, "delete_allocation", (1, 52), refusal=405),
    Route("GET", "/v1/nodes/{node}/allocation", AllocationsApi, "get_node_allocation", (1, 52)),
    Route("DELETE", "/v1/nodes/{node}/allocation", AllocationsApi, "delete_node_allocation", (1, 52)),
    # Only paths ending in '/' match; no route above but / and /v1/ does.
    Route("*", "/{path:.+/}", TrailingSlashRedirect, "redirect"),
    Route("GET", "/v1/portgroups", PortgroupsApi, "list_portgroups", (1, 23)),
    Route("POST", "/v1/portgroups", PortgroupsApi, "create_portgroup", (1, 23)),
    Route("GET", "/v1/portgroups/detail", PortgroupsApi, "list_portgroups_detail", (1, 23)),
    Route("GET", "/v1/portgroups/{ident}", PortgroupsApi, "get_portgroup", (1, 23)),
    Route("PATCH", "/v1/portgroups/{ident}", PortgroupsApi, "patch_portgroup", (1, 23)),
    Route("DELETE", "/v1/portgroups/{ident}", PortgroupsApi, "delete_portgroup", (1, 23)),
    Route("GET", "/v1/portgroups/{ident}/ports", PortgroupsApi, "list_portgroup_ports", (1, 24)),
    Route("GET", "/v1/portgroups/{ident}/ports/detail", PortgroupsApi, "list_portgroup_ports_detail", (1, 24)),
    Route("GET", "/v1/nodes/{node}/portgroups", PortgroupsApi, "list_node_portgroups", (1, 24)),
    Route("GET", "/v1/nodes/{node}/portgroups/detail", PortgroupsApi, "list_node_portgroups_detail", (1, 24)),
    Route("GET", "/v1/nodes/{ident}/bios", NodeBiosApi, "list_settings", (1, 40)),
    Route("GET", "/v1/nodes/{ident}/bios/{setting}", NodeBiosApi, "get_setting", (1, 40)),
    Route("GET", "/v1/nodes/{ident}/history", NodeHistoryApi, "list_history", (1, 78)),
    Route("GET", "/v1/nodes/{ident}/history/{event}", NodeHistoryApi, "get_event", (1, 78)),
    Route("GET", "/v1/nodes/{ident}/inventory", NodeInventoryApi, "get_inventory", (1, 81)),
    Route("GET", "/v1/nodes/{ident}/firmware", NodeFirmwareApi, "list_firmware"),
    Route("POST", "/v1/nodes/{ident}/vmedia", NodeVmediaApi, "attach", (1, 89)),
    Route("DELETE", "/v1/nodes/{ident}/vmedia", NodeVmediaApi, "detach", (1, 89)),
    Route("GET", "/v1/nodes/{ident}/vmedia", NodeVmediaApi, "list_media", (1, 93)),
    # 1.82; the handler refuses older versions itself, with Ironic's message.
    Route("GET", "/v1/shards", ShardsApi, "list_shards"),
    Route("GET", "/v1/conductors", ConductorsApi, "list_conductors", (1, 49)),
    Route("GET", "/v1/conductors/{hostname}", ConductorsApi, "get_conductor", (1, 49)),
    Route("POST", "/v1/events", ExternalEventsApi, "post_events", (1, 54)),
    Route("GET", "/v1/deploy_templates", DeployTemplatesApi, "list_templates", (1, 55)),
    Route("POST", "/v1/deploy_templates", DeployTemplatesApi, "create_template", (1, 55), refusal=405),
    Route("GET", "/v1/deploy_templates/{ident}", DeployTemplatesApi, "get_template", (1, 55)),
    Route("PATCH", "/v1/deploy_templates/{ident}", DeployTemplatesApi, "patch_template", (1, 55), refusal=405),
    Route("DELETE", "/v1/deploy_templates/{ident}", DeployTemplatesApi, "delete_template", (1, 55), refusal=405),
    Route("GET", "/v1/inspection_rules", InspectionRulesApi, "list_rules", (1, 96)),
    Route("POST", "/v1/inspection_rules", InspectionRulesApi, "create_rule", (1, 96), refusal=405),
    Route("GET", "/v1/inspection_rules/{ident}", InspectionRulesApi, "get_rule", (1, 96)),
    Route("PATCH", "/v1/inspection_rules/{ident}", InspectionRulesApi, "patch_rule", (1, 96), refusal=405),
    Route("DELETE", "/v1/inspection_rules/{ident}", InspectionRulesApi, "delete_rule", (1, 96), refusal=405),
    # Ironic's runbook controller: 404 for a read and 405 for a write below 1.92; traits 404 below 1.112.
    Route("GET", "/v1/runbooks", RunbooksApi, "list_runbooks", (1, 92)),
    Route("POST", "/v1/runbooks", RunbooksApi, "create_runbook", (1, 92), refusal=405),
    Route("GET", "/v1/runbooks/{ident}", RunbooksApi, "get_runbook", (1, 92)),
    Route("PATCH", "/v1/runbooks/{ident}", RunbooksApi, "patch_runbook", (1, 92), refusal=405),
    Route("DELETE", "/v1/runbooks/{ident}", RunbooksApi, "delete_runbook", (1, 92), refusal=405),
    Route("GET", "/v1/runbooks/{ident}/traits", RunbooksApi, "list_traits", (1, 112)),
    Route("PUT", "/v1/runbooks/{ident}/traits", RunbooksApi, "set_traits", (1, 112)),
    Route("DELETE", "/v1/runbooks/{ident}/traits", RunbooksApi, "clear_traits", (1, 112)),
    Route("PUT", "/v1/runbooks/{ident}/traits/{trait}", RunbooksApi, "add_trait", (1, 112)),
    Route("DELETE", "/v1/runbooks/{ident}/traits/{trait}", RunbooksApi, "remove_trait", (1, 112)),
    # Before the generic vendor routes: the iSCSI deploy ramdisk's report (seed 002), public, key-checked.
    Route("POST", "/v1/nodes/{ident}/vendor_passthru/pass_deploy_info", RamdiskApi, "pass_deploy_info", head=False),
    *_vendor_routes(),
    Route("GET", "/v1/nodes/{ident}/management/indicators", NodeManagementApi, "list_indicators", (1, 63)),
    Route("GET", "/v1/nodes/{ident}/management/indicators/{indicator}", NodeManagementApi, "get_indicator", (1, 63)),
    Route("PUT", "/v1/nodes/{ident}/management/indicators/{indicator}", NodeManagementApi, "set_indicator", (1, 63)),
    Route("PUT", "/v1/nodes/{ident}/states/boot_mode", NodeManagementApi, "set_boot_mode", (1, 76)),
    Route("PUT", "/v1/nodes/{ident}/states/secure_boot", NodeManagementApi, "set_secure_boot", (1, 76)),
    Route("GET", "/v1/openapi.yaml", OpenApiDocument, "serve_yaml"),
    Route("GET", "/v1/openapi.json", OpenApiDocument, "serve_json"),
    *_volume_routes(),
    # Public: install_public_route (services.api.ipxe_passthru) serves it ahead of auth.
    Route("GET", "/v1/drivers/{driver}/vendor_passthru/ipxe_config", IpxePassthru, "handle"),
)


def _check(routes: tuple[Route, ...]) -> None:
    """Every handler exists, and no method and path appear twice (a second row would never be reached)."""
    seen: set[tuple[str, str]] = set()
    for route in routes:
        if not callable(getattr(route.resource, route.handler, None)):
            raise AssertionError(f"{route.resource.__name__} has no handler {route.handler!r}")
        key = (route.method, route.path)
        if key in seen:
            raise AssertionError(f"route {route.method} {route.path} is listed twice")
        seen.add(key)


_check(ROUTES)


def build_resource(resource: type, ctx: ApiContext) -> Any:
    """One instance of a resource class; all take the context but two."""
    if resource is OpenApiDocument:
        return OpenApiDocument()
    if resource is IpxePassthru:
        return IpxePassthru(ctx.settings, token=ctx.internal_token, endpoints=ctx.endpoints)
    return resource(ctx)


def _gated(handler: Handler, since: tuple[int, int], refusal: int) -> Handler:
    async def gated(request: web.Request) -> web.StreamResponse:
        params.require_endpoint(request, since, refusal)
        return await handler(request)

    return gated


def add_routes(app: web.Application, ctx: ApiContext, routes: tuple[Route, ...] = ROUTES) -> dict[type, Any]:
    """Register ``routes`` on ``app`` in order, one instance per resource class; returns the instances."""
    resources: dict[type, Any] = {}
    for route in routes:
        if route.resource not in resources:
            resources[route.resource] = build_resource(route.resource, ctx)
        handler = getattr(resources[route.resource], route.handler)
        if route.since is not None:
            handler = _gated(handler, route.since, route.refusal)
        if route.method == "GET" and route.head:
            app.router.add_get(route.path, handler)
        else:
            app.router.add_route(route.method, route.path, handler)
    return resources
