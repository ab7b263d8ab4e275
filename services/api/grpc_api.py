"""The native ferrum.v1.NodeService: the REST API's node, port, state and
volume operations with typed messages and gRPC status codes, plus WatchNodes.

Validation is shared with the REST handlers, so both APIs accept and refuse
exactly the same things."""

from __future__ import annotations

import json
import logging
import uuid as uuidlib
from collections.abc import AsyncIterator, Mapping
from typing import Any

import asyncpg
import grpc
from google.protobuf import struct_pb2, timestamp_pb2

from ferrum.v1 import api_pb2 as pb
from ferrum.v1 import api_pb2_grpc as pb_grpc
from ferrum.v1 import common_pb2 as cpb
from ferrum.v1 import conductor_pb2 as conductor_pb
from services.api import views
from services.api.conductor_router import ConductorRouter
from services.api.event_hub import EventHub
from services.api.grpc_input import add_screened_servicer, json_field, screen_request, short
from services.api.json_body import loads_limited
from services.api.json_patch import apply_patch
from services.api.node_values import (
    NODE_CREATE_KEYS,
    NODE_READONLY,
    checked_node_changes,
    linked_parent,
    node_from_json,
    validate_node_values,
)
from services.api.port_values import validate_port_values
from services.api.provision_params import (
    check_child_step_nodes,
    check_configdrive,
    check_deploy_steps,
    check_disable_ramdisk,
)
from services.api.runbook_use import resolve_runbook
from services.api.versions import MAX_VERSION
from services.common import errors, states
from services.common.conductor_messages import step_messages
from services.common.config import ApiConfig
from services.common.db.events import EventRepository
from services.common.db.node_secrets import NodeSecrets
from services.common.db.nodes import INTERFACE_FIELDS, NodePage, NodeRepository, is_uuid
from services.common.db.outage import is_unavailable, unavailable
from services.common.db.ports import PortRepository
from services.common.db.records import NodeEventRecord, NodeRecord, PortRecord
from services.common.db.runbooks import RunbookRepository
from services.common.jsonutil import dumps
from services.common.request_project import project_var
from services.common.secret_masking import mask_text

LOG = logging.getLogger(__name__)

# The native API has no microversions: it speaks the newest REST semantics.
LATEST = MAX_VERSION


def _struct(value: dict[str, Any] | None) -> struct_pb2.Struct:
    message = struct_pb2.Struct()
    if value:
        message.update(json.loads(dumps(value)))
    return message


def _whole_numbers(value: Any) -> Any:
    """google.protobuf.Value has only doubles: give integral ones back as ints (step priorities)."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, list):
        return [_whole_numbers(v) for v in value]
    if isinstance(value, dict):
        return {k: _whole_numbers(v) for k, v in value.items()}
    return value


def _ts(value: Any) -> timestamp_pb2.Timestamp | None:
    if value is None:
        return None
    stamp = timestamp_pb2.Timestamp()
    stamp.FromDatetime(value)
    return stamp


def node_message(row: NodeRecord) -> cpb.Node:
    masked = views.node_document(row, base="", version=LATEST, full=False)
    columns: Mapping[str, Any] = row  # the interface columns, read by name
    message = cpb.Node(
        uuid=row["uuid"],
        name=row["name"] or "",
        driver=row["driver"],
        interfaces={f.removesuffix("_interface"): columns[f] for f in INTERFACE_FIELDS if columns.get(f)},
        driver_info=_struct(masked["driver_info"]),
        driver_internal_info=_struct(masked["driver_internal_info"]),
        instance_info=_struct(masked["instance_info"]),
        properties=_struct(row["properties"]),
        extra=_struct(row["extra"]),
        provision_state=row["provision_state"],
        target_provision_state=row["target_provision_state"] or "",
        power_state=row["power_state"] or "",
        target_power_state=row["target_power_state"] or "",
        maintenance=row["maintenance"],
        maintenance_reason=row["maintenance_reason"] or "",
        last_error=masked["last_error"] or "",
        reservation=row["reservation"] or "",
        conductor_group=row["conductor_group"],
        resource_class=row["resource_class"] or "",
        instance_uuid=row["instance_uuid"] or "",
        owner=row["owner"] or "",
        lessee=row["lessee"] or "",
        automated_clean_set=row["automated_clean"] is not None,
        automated_clean=bool(row["automated_clean"]),
        description=row["description"] or "",
        protected=row["protected"],
        protected_reason=row["protected_reason"] or "",
        retired=bool(row.get("retired")),
        retired_reason=row.get("retired_reason") or "",
        network_data=_struct(row.get("network_data")),
        boot_mode=row.get("boot_mode") or "",
        secure_boot_set=row.get("secure_boot") is not None,
        secure_boot=bool(row.get("secure_boot")),
        shard=row.get("shard") or "",
        parent_node=row.get("parent_node") or "",
        console_enabled=bool(row.get("console_enabled")),
        service_step=_struct(row.get("service_step")),
        disable_power_off=bool(row.get("disable_power_off")),
        instance_name=row.get("instance_name") or "",
        health=row.get("health") or "",
    )
    for name in ("created_at", "updated_at", "provision_updated_at"):
        stamp = _ts(row.get(name))
        if stamp is not None:
            getattr(message, name).CopyFrom(stamp)
    return message


def port_message(row: PortRecord) -> cpb.Port:
    message = cpb.Port(
        uuid=row["uuid"],
        node_uuid=row["node_uuid"],
        address=row["address"],
        pxe_enabled=row["pxe_enabled"],
        extra=_struct(row["extra"]),
        local_link_connection=_struct(row["local_link_connection"]),
        physical_network=row["physical_network"] or "",
        name=row["name"] or "",
        description=row.get("description") or "",
        vendor=row.get("vendor") or "",
        category=row.get("category") or "",
        available_for_dynamic_portgroup=bool(row.get("available_for_dynamic_portgroup", True)),
    )
    for name in ("created_at", "updated_at"):
        stamp = _ts(row.get(name))
        if stamp is not None:
            getattr(message, name).CopyFrom(stamp)
    return message


def event_message(row: NodeEventRecord) -> cpb.NodeEvent:
    message = cpb.NodeEvent(
        sequence=row["sequence"],
        node_uuid=row["node_uuid"],
        event=row["event"],
        provision_state=row["provision_state"] or "",
        target_provision_state=row["target_provision_state"] or "",
        power_state=row["power_state"] or "",
        severity=row["severity"],
        message=mask_text(row["message"]),
        conductor=row["conductor"] or "",
    )
    message.created_at.FromDatetime(row["created_at"])
    return message


def add_node_service(servicer: NodeServicer, server: grpc.aio.Server) -> None:
    """Register the NodeService; requests protobuf cannot parse are INVALID_ARGUMENT."""
    add_screened_servicer(pb_grpc.add_NodeServiceServicer_to_server, servicer, server)


class NodeServicer(pb_grpc.NodeServiceServicer):
    def __init__(
        self,
        pool: asyncpg.Pool,
        router: ConductorRouter,
        hub: EventHub,
        *,
        secrets: NodeSecrets,
        config: ApiConfig | None = None,
    ) -> None:
        self.pool, self.router, self.hub = pool, router, hub
        self.config = config or ApiConfig()
        self.nodes = NodeRepository(pool, secrets=secrets)
        self.ports, self.events = PortRepository(pool), EventRepository(pool)

    async def _guard(self, context: grpc.aio.ServicerContext, coro: Any, request: Any = None) -> Any:
        """Run one call: the request screened first (NUL, NaN, sizes), every
        failure answered with a status code and a message that names no internals."""
        try:
            if request is not None:
                screen_request(request, self.config)
            return await coro
        except grpc.aio.AbortError:
            raise
        except Exception as exc:  # noqa: BLE001 - every failure gets a status code, none is UNKNOWN
            await self._fail(context, exc)
        finally:
            coro.close()  # never started when the screen refused the request

    async def _fail(self, context: grpc.aio.ServicerContext, exc: Exception) -> None:
        """End the call with the status ``exc`` deserves; the details never carry a class name or traceback."""
        if isinstance(exc, errors.FerrumError):
            await errors.abort_with(context, short(exc))
        if isinstance(exc, asyncpg.DataError | asyncpg.CheckViolationError):
            # Input PostgreSQL refused that the checks let through: still the client's, as on REST.
            LOG.warning("unchecked bad input on gRPC: %s", exc)
            await errors.abort_with(context, short(errors.InvalidParameterValue(f"Invalid input: {exc}")))
        if is_unavailable(exc):
            await errors.abort_with(context, unavailable(exc))
        LOG.error("unexpected error serving a gRPC call", exc_info=exc)
        await errors.abort_with(context, errors.FerrumError("Internal error; the api's log has the details"))

    def _json(self, request: Any, name: str) -> Any:
        return json_field(request, name, depth=self.config.max_json_body_depth)

    async def _rpc(self, node: NodeRecord, method: str, message: Any) -> Any:
        return await self.router.call(node["uuid"], node["driver"], node["conductor_group"], method, message)

    async def CreateNode(self, request: pb.CreateNodeRequest, context: grpc.aio.ServicerContext) -> cpb.Node:
        async def run() -> cpb.Node:
            values: dict[str, Any] = {"driver": request.driver}
            for key in ("name", "uuid", "resource_class", "conductor_group", "owner", "description"):
                if getattr(request, key):
                    values[key] = getattr(request, key)
            for key in ("driver_info", "properties", "instance_info", "extra"):
                if request.HasField(key):
                    values[key] = self._json(request, key)
            for kind, name in request.interfaces.items():
                field = f"{kind}_interface"
                if field not in NODE_CREATE_KEYS:
                    raise errors.InvalidParameterValue(f"unknown interface kind {kind!r}")
                values[field] = name
            values = validate_node_values(values, create=True)
            values.setdefault("uuid", str(uuidlib.uuid4()))
            group = values.get("conductor_group", "")
            await self.router.require_served(values["uuid"], values["driver"], group)
            reply = await self.router.call(
                values["uuid"],
                values["driver"],
                group,
                "CreateNode",
                conductor_pb.ConductorCreateNodeRequest(node_json=dumps(values)),
            )
            return node_message(node_from_json(reply.node_json))

        return await self._guard(context, run(), request)

    async def GetNode(self, request: pb.GetNodeRequest, context: grpc.aio.ServicerContext) -> cpb.Node:
        return await self._guard(context, self._get(request.ident), request)

    async def _get(self, ident: str) -> cpb.Node:
        return node_message(await self.nodes.get_by_ident(ident))

    async def ListNodes(self, request: pb.ListNodesRequest, context: grpc.aio.ServicerContext) -> pb.ListNodesResponse:
        async def run() -> pb.ListNodesResponse:
            filters = {
                k: getattr(request, k)
                for k in ("provision_state", "driver", "conductor_group", "owner")
                if getattr(request, k)
            }
            limit = request.limit or 1000
            if limit < 0 or limit > 1000:
                raise errors.InvalidParameterValue("limit must be between 1 and 1000")
            rows = await self.nodes.list(
                NodePage(
                    filters=filters,
                    limit=limit,
                    marker=request.marker or None,
                    sort_key=request.sort_key or "id",
                    sort_dir=request.sort_dir or "asc",
                )
            )
            return pb.ListNodesResponse(
                nodes=[node_message(r) for r in rows], next_marker=rows[-1]["uuid"] if len(rows) == limit else ""
            )

        return await self._guard(context, run(), request)

    async def PatchNode(self, request: pb.PatchNodeRequest, context: grpc.aio.ServicerContext) -> cpb.Node:
        async def run() -> cpb.Node:
            node = await self.nodes.get_by_ident(request.ident)
            patch = loads_limited(request.patch_json, depth=self.config.max_json_body_depth, what="patch_json")
            current = json.loads(dumps({k: node.get(k) for k in views.NODE_FIELD_VERSIONS if k in node}))
            changes = checked_node_changes(
                node, apply_patch(current, patch, NODE_READONLY, views.NODE_FIELD_VERSIONS, LATEST)
            )
            if changes.get("parent_node"):  # resolved and checked as REST does (1.83)
                changes["parent_node"] = await linked_parent(self.nodes, node, changes["parent_node"])
            if not changes:
                return node_message(node)
            driver = changes.get("driver", node["driver"])
            group = changes.get("conductor_group", node["conductor_group"])
            if "driver" in changes or "conductor_group" in changes:
                await self.router.require_served(node["uuid"], driver, group)
            reply = await self.router.call(
                node["uuid"],
                driver,
                group,
                "UpdateNode",
                conductor_pb.ConductorUpdateNodeRequest(node_uuid=node["uuid"], changes_json=dumps(changes)),
            )
            return node_message(node_from_json(reply.node_json))

        return await self._guard(context, run(), request)

    async def DeleteNode(
        self, request: pb.DeleteNodeRequest, context: grpc.aio.ServicerContext
    ) -> pb.DeleteNodeResponse:
        async def run() -> pb.DeleteNodeResponse:
            node = await self.nodes.get_by_ident(request.ident)
            await self._rpc(node, "DestroyNode", conductor_pb.NodeRef(node_uuid=node["uuid"]))
            return pb.DeleteNodeResponse()

        return await self._guard(context, run(), request)

    async def SetProvisionState(
        self, request: pb.SetProvisionStateRequest, context: grpc.aio.ServicerContext
    ) -> cpb.Node:
        async def run() -> cpb.Node:
            # The JSON parts first, as REST reads its whole body before anything else.
            clean = _whole_numbers(self._json(request, "clean_steps")) if request.HasField("clean_steps") else None
            deploy = _whole_numbers(self._json(request, "deploy_steps")) if request.HasField("deploy_steps") else None
            which = request.WhichOneof("configdrive")
            configdrive = (
                request.configdrive_string
                if which == "configdrive_string"
                else self._json(request, "configdrive_dict")
                if which
                else None
            )
            node = await self.nodes.get_by_ident(request.ident)
            try:
                event = states.verb_to_event(request.target)
            except states.UnknownVerb:
                raise errors.InvalidParameterValue(
                    f'The requested action "{request.target}" could not be understood.'
                ) from None
            check_configdrive(configdrive, request.target, LATEST)
            if event not in states.allowed_events(node["provision_state"]):
                raise errors.InvalidStateRequested(
                    f'The requested action "{request.target}" can not be performed on node "{node["uuid"]}" '
                    f'while it is in state "{node["provision_state"]}".'
                )
            steps = clean
            service_steps = None
            disable_requested = request.disable_ramdisk or None
            if request.runbook:  # the same resolution as REST (services/api/runbook_use.py)
                used = await resolve_runbook(
                    RunbookRepository(self.pool),
                    node,
                    request.runbook,
                    verb=request.target,
                    version=LATEST,
                    project=project_var.get(),
                    given_steps=clean,
                )
                if request.target == "clean":
                    steps = used.steps
                else:
                    service_steps = used.steps
                disable_requested = used.disable_ramdisk or None
            deploy_steps = check_deploy_steps(deploy, request.target, LATEST)
            disable_ramdisk = check_disable_ramdisk(disable_requested, request.target, LATEST)
            await check_child_step_nodes(self.nodes, steps or service_steps)
            await self._rpc(
                node,
                "DoProvisionAction",
                conductor_pb.ProvisionActionRequest(
                    node_uuid=node["uuid"],
                    event=event,
                    configdrive_json=json.dumps(configdrive) if configdrive else "",
                    clean_steps=step_messages("clean", steps),
                    rescue_password=request.rescue_password,
                    deploy_steps=step_messages("deploy", deploy_steps),
                    disable_ramdisk=disable_ramdisk,
                    service_steps=step_messages("service", service_steps),
                ),
            )
            return await self._get(node["uuid"])

        return await self._guard(context, run(), request)

    async def SetPowerState(self, request: pb.SetPowerStateRequest, context: grpc.aio.ServicerContext) -> cpb.Node:
        async def run() -> cpb.Node:
            node = await self.nodes.get_by_ident(request.ident)
            if request.target not in states.POWER_TARGETS:
                raise errors.InvalidParameterValue(f"Invalid power target {request.target!r}")
            if request.timeout < 0:  # 0 is "not set"; REST refuses anything below 1
                raise errors.InvalidParameterValue(
                    f"Invalid timeout value {request.timeout}. The timeout must be a positive integer."
                )
            await self._rpc(
                node,
                "ChangePowerState",
                conductor_pb.PowerStateRequest(node_uuid=node["uuid"], target=request.target, timeout=request.timeout),
            )
            return await self._get(node["uuid"])

        return await self._guard(context, run(), request)

    async def SetMaintenance(self, request: pb.SetMaintenanceRequest, context: grpc.aio.ServicerContext) -> cpb.Node:
        async def run() -> cpb.Node:
            node = await self.nodes.get_by_ident(request.ident)
            await self._rpc(
                node,
                "SetMaintenance",
                conductor_pb.MaintenanceRequest(
                    node_uuid=node["uuid"], maintenance=request.maintenance, reason=request.reason
                ),
            )
            return await self._get(node["uuid"])

        return await self._guard(context, run(), request)

    async def CreatePort(self, request: pb.CreatePortRequest, context: grpc.aio.ServicerContext) -> cpb.Port:
        async def run() -> cpb.Port:
            node = await self.nodes.get_by_ident(request.node_ident)
            values: dict[str, Any] = {"address": request.address}
            if request.pxe_enabled_set:
                values["pxe_enabled"] = request.pxe_enabled
            if request.HasField("extra"):
                values["extra"] = self._json(request, "extra")
            values = validate_port_values(values)
            if request.name:
                values["name"] = request.name
            values.update(node_id=node["id"], uuid=str(uuidlib.uuid4()))
            return port_message(await self.ports.create(values))

        return await self._guard(context, run(), request)

    async def GetPort(self, request: pb.GetPortRequest, context: grpc.aio.ServicerContext) -> cpb.Port:
        return await self._guard(context, self._port(request.ident), request)

    async def _port(self, ident: str) -> cpb.Port:
        return port_message(await self.ports.get(ident))

    async def ListPorts(self, request: pb.ListPortsRequest, context: grpc.aio.ServicerContext) -> pb.ListPortsResponse:
        async def run() -> pb.ListPortsResponse:
            node_id = (await self.nodes.get_by_ident(request.node_ident))["id"] if request.node_ident else None
            address = validate_port_values({"address": request.address})["address"] if request.address else None
            limit = request.limit or 1000
            rows = await self.ports.list(node_id=node_id, address=address, limit=limit, marker=request.marker or None)
            return pb.ListPortsResponse(
                ports=[port_message(r) for r in rows], next_marker=rows[-1]["uuid"] if len(rows) == limit else ""
            )

        return await self._guard(context, run(), request)

    async def DeletePort(
        self, request: pb.DeletePortRequest, context: grpc.aio.ServicerContext
    ) -> pb.DeletePortResponse:
        async def run() -> pb.DeletePortResponse:
            port = await self.ports.get(request.ident)
            await self.ports.delete(port["uuid"])
            return pb.DeletePortResponse()

        return await self._guard(context, run(), request)

    # api.proto declares the volume calls, but volumes are served over REST only
    # so far; say so with UNIMPLEMENTED (the generated base class's status).
    async def CreateVolumeConnector(
        self, request: pb.CreateVolumeConnectorRequest, context: grpc.aio.ServicerContext
    ) -> cpb.VolumeConnector:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "volume connectors are served over REST only")

    async def CreateVolumeTarget(
        self, request: pb.CreateVolumeTargetRequest, context: grpc.aio.ServicerContext
    ) -> cpb.VolumeTarget:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "volume targets are served over REST only")

    async def WatchNodes(
        self, request: pb.WatchNodesRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[cpb.NodeEvent]:
        """Replay from ``after_sequence`` then follow live changes, in order."""
        try:
            screen_request(request, self.config)
            if request.node_uuid and not is_uuid(request.node_uuid):
                raise errors.InvalidParameterValue("node_uuid must be a UUID")
            sequence = request.after_sequence
            if sequence == 0:
                sequence = await self.events.latest_sequence()
            elif sequence < 0:
                sequence = 0
            while True:
                woken = self.hub.armed()  # before the read: see services/api/event_hub.py
                try:
                    batch = await self.events.events_after(sequence, node_uuid=request.node_uuid or None, limit=500)
                    for row in batch:
                        sequence = row["sequence"]
                        yield event_message(row)
                    if len(batch) < 500:
                        await self.hub.wait(woken, timeout=5.0)
                finally:
                    self.hub.disarm(woken)
        except grpc.aio.AbortError:
            raise
        except Exception as exc:  # noqa: BLE001 - every failure gets a status code, none is UNKNOWN
            await self._fail(context, exc)
