"""The public ramdisk endpoints: agent lookup and heartbeat (CONTRACT.md 5.1, 5.2).

They need no credentials (the machine has none) and so reveal nothing: a node
that is unknown or not being deployed answers one generic 404, and a
heartbeat only counts with the node's one-time agent token, which the owning
conductor checks. Ferrum always requires the token; it accepts
``agent_token`` at every version from 1.22 on, because it issues tokens even
below the 1.62 that introduced them in Ironic (see docs/agent.md). Below 1.22
both are 404 (the routes table gates them).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from aiohttp import web

from ferrum.v1 import conductor_pb2 as cpb
from services.api import views
from services.api.context import ApiContext
from services.api.node_values import node_from_json
from services.api.validators import MAC_RE
from services.common import errors, states
from services.common.conductor_messages import deploy_info_message, deploy_progress_message
from services.common.db.nodes import is_uuid
from services.common.db.records import NodeRecord
from services.common.jsonutil import dumps

NOT_FOUND = (
    "Node could not be found. Lookup is only allowed while a node is being deployed, cleaned, inspected or rescued."
)
HEARTBEAT_FIELDS = {
    "callback_url": (1, 22),
    "agent_version": (1, 36),
    "agent_token": (1, 22),
    "agent_verify_ca": (1, 68),
    "agent_status": (1, 72),
    "agent_status_message": (1, 72),
    # Ferrum extension, documented in docs/agent.md: the image write progress.
    "deploy_progress": (1, 22),
    # Ferrum extension (docs/deploy.md): an iSCSI deploy ramdisk's pass_deploy_info fields.
    "deploy_info": (1, 22),
}
DEPLOY_INFO_FIELDS = ("address", "port", "key", "iqn", "error")
AGENT_STATUSES = ("start", "end", "error")
SINCE = (1, 22)
CONTINUE_INSPECTION_SINCE = (1, 84)


class RamdiskApi:
    def __init__(self, ctx: ApiContext) -> None:
        self.ctx = ctx

    async def lookup(self, request: web.Request) -> web.Response:
        raw = request.query.get("addresses", "")
        macs = [a.strip().lower().replace("-", ":") for a in raw.split(",") if MAC_RE.match(a.strip().lower())]
        node_uuid = request.query.get("node_uuid") or ""
        if node_uuid and not is_uuid(node_uuid):
            raise errors.InvalidParameterValue(f"Expected a UUID but received {node_uuid}.")
        if not macs and not node_uuid:
            raise errors.InvalidParameterValue(
                "IncompleteLookup: one of 'addresses' (a valid MAC) or 'node_uuid' is required"
            )
        node: NodeRecord | None
        if node_uuid:
            try:
                node = await self.ctx.nodes.get(node_uuid)
            except errors.NodeNotFound:
                node = None
        else:
            node = await self.ctx.nodes.get_by_port_address(macs)
        if node is None or node["provision_state"] not in states.LOOKUP_ALLOWED_STATES:
            raise errors.NotFound(NOT_FOUND)
        try:
            reply = await self.ctx.rpc(node, "LookupToken", cpb.NodeRef(node_uuid=node["uuid"]))
        except errors.NotFound:
            raise errors.NotFound(NOT_FOUND) from None
        fresh = node_from_json(reply.node_json) if reply.node_json else node
        return web.Response(
            text=dumps(self.lookup_document(request, fresh, reply.agent_token)), content_type="application/json"
        )

    def lookup_document(self, request: web.Request, fresh: NodeRecord, token: str) -> dict[str, Any]:
        """What lookup answers (and continue_inspection from 1.84): the node's agent view and the agent's config."""
        base = self.ctx.base(request)
        return {
            "node": {
                "uuid": fresh["uuid"],
                "properties": fresh["properties"],
                "instance_info": views.mask_instance_info(fresh["instance_info"]),
                "driver_internal_info": views.mask_secrets(fresh["driver_internal_info"]),
                "links": views.links(base, "nodes", fresh["uuid"]),
            },
            "config": {
                "heartbeat_timeout": self.ctx.config.ramdisk_heartbeat_timeout,
                "agent_token": token,
                "agent_token_required": True,
                "agent_md5_checksum_enable": False,
                "disable_deep_image_inspection": False,
                "permitted_image_formats": ["raw", "qcow2", "iso"],
                "metrics": {
                    "backend": "noop",
                    "prepend_host": False,
                    "prepend_uuid": False,
                    "prepend_host_reverse": True,
                    "global_prefix": None,
                },
                "metrics_statsd": {"statsd_host": "localhost", "statsd_port": 8125},
                "agent_skip_bmc_detect": True,
            },
        }

    async def heartbeat_without_node(self, request: web.Request) -> web.Response:
        """``POST /v1/heartbeat`` names no node: a malformed request (400), as Ironic answers, not a 404."""
        raise errors.MissingParameter("Missing argument: node_ident (POST /v1/heartbeat/{node_ident})")

    async def heartbeat(self, request: web.Request) -> web.Response:
        body = await self.ctx.body(request)
        if not isinstance(body, dict):
            raise errors.InvalidParameterValue("The heartbeat body must be a JSON object")
        for key in body:
            if key not in HEARTBEAT_FIELDS:
                raise errors.InvalidParameterValue(f'Unknown argument: "{key}"')
            since = HEARTBEAT_FIELDS[key]
            if request["version"] < since:
                raise errors.InvalidParameterValue(
                    f'Field "{key}" not recognised in API version {request["version"][0]}.{request["version"][1]}'
                )
        callback_url = body.get("callback_url")
        if (
            not isinstance(callback_url, str)
            or urlsplit(callback_url).scheme not in ("http", "https")
            or not urlsplit(callback_url).netloc
        ):
            raise errors.InvalidParameterValue(f'Invalid callback_url "{callback_url}": an http(s) URL is required')
        token = body.get("agent_token")
        if not isinstance(token, str) or not token:
            raise errors.InvalidParameterValue("Agent token is required for heartbeat processing.")
        status = body.get("agent_status") or ""
        if status and status not in AGENT_STATUSES:
            raise errors.InvalidParameterValue(f'Unknown agent_status "{status}"; expected one of {AGENT_STATUSES}')
        progress = body.get("deploy_progress")
        if progress is not None and not isinstance(progress, dict):
            raise errors.InvalidParameterValue("deploy_progress must be an object")
        verify_ca = body.get("agent_verify_ca")
        if verify_ca is not None and (not isinstance(verify_ca, str) or "BEGIN CERTIFICATE" not in verify_ca):
            raise errors.InvalidParameterValue("agent_verify_ca must be a PEM certificate")
        deploy_info = body.get("deploy_info")
        if deploy_info is not None:
            deploy_info = checked_deploy_info(deploy_info)
        for key in ("agent_version", "agent_status_message"):
            if body.get(key) is not None and not isinstance(body[key], str):
                raise errors.InvalidParameterValue(f"{key} must be a string")
        ident = request.match_info["ident"]
        try:
            node = await self.ctx.nodes.get_by_ident(ident)
        except errors.NodeNotFound:
            raise errors.NotFound(f"Node {ident} could not be found.") from None
        known = node["driver_internal_info"].get("agent_url")
        if known and known != callback_url:
            raise errors.InvalidParameterValue('Detected change in ramdisk provided "callback_url"')
        await self.ctx.rpc(
            node,
            "Heartbeat",
            cpb.HeartbeatRequest(
                node_uuid=node["uuid"],
                callback_url=callback_url,
                agent_version=body.get("agent_version") or "",
                agent_token=token,
                agent_status=status,
                agent_status_message=body.get("agent_status_message") or "",
                progress=deploy_progress_message(progress) if progress else None,
                agent_verify_ca=verify_ca or "",
                deploy_info=deploy_info_message(deploy_info) if deploy_info is not None else None,
            ),
        )
        return web.Response(status=202)

    async def pass_deploy_info(self, request: web.Request) -> web.Response:
        """Seed 002's ``POST /v1/nodes/{uuid}/vendor_passthru/pass_deploy_info``:
        an iSCSI deploy ramdisk says where its disk is exposed, or why not.
        Public, as lookup and heartbeat: the per-deploy key in the body is the
        credential, and the owning conductor checks it (400 when wrong, 409
        when the node is not waiting for it). 200 with no body, as the seed."""
        body = checked_deploy_info(await self.ctx.body(request))
        ident = request.match_info["ident"]
        try:
            node = await self.ctx.nodes.get_by_ident(ident)
        except errors.NodeNotFound:
            raise errors.NotFound(f"Node {ident} could not be found.") from None
        await self.ctx.rpc(
            node, "PassDeployInfo", cpb.PassDeployInfoRequest(node_uuid=node["uuid"], info=deploy_info_message(body))
        )
        return web.Response(status=200)

    async def continue_inspection(self, request: web.Request) -> web.Response:
        """IPA's post of its inventory at the end of an in-band inspection
        (Ironic's ``POST /v1/continue_inspection``), as Ironic serves it: at
        1.84 and newer, and at 1.1 for ironic-inspector's ramdisks (with
        Ironic's ``{"uuid"}`` reply); 404 at any version between, and for
        ``?node_uuid=`` below 1.84. The node is found by ``node_uuid`` and by
        the MACs of the inventory (both must name the same node) and must be
        in ``inspect wait``; anything else is the same generic 404 as lookup.
        From 1.84 the node's agent token is issued first (a token already
        issued shows as ``******``) and the reply is lookup's, so the agent
        can go on heartbeating."""
        newer = request["version"] >= CONTINUE_INSPECTION_SINCE
        node_uuid = request.query.get("node_uuid")
        if not (newer or request["version"] == (1, 1)) or (node_uuid is not None and not newer):
            raise errors.NotFound("API version 1.84 or newer is required")
        if node_uuid is not None and not is_uuid(node_uuid):
            raise errors.InvalidParameterValue(f"Expected a UUID but received {node_uuid}.")
        body = await self.ctx.body(request)
        inventory = body.get("inventory") if isinstance(body, dict) else None
        if not isinstance(inventory, dict):
            raise errors.InvalidParameterValue("Invalid inspection data: 'inventory' is a required object")
        interfaces = inventory.get("interfaces")
        if not isinstance(interfaces, list) or not interfaces:
            raise errors.InvalidParameterValue(
                "Invalid inspection data: inventory 'interfaces' must be a non-empty list"
            )
        if not all(isinstance(i, dict) and isinstance(i.get("mac_address"), str) for i in interfaces):
            raise errors.InvalidParameterValue("Invalid inspection data: every interface needs a 'mac_address' string")
        macs = [m for m in (str(i["mac_address"]).strip().lower() for i in interfaces) if MAC_RE.match(m)]
        if not macs and not node_uuid:
            raise errors.InvalidParameterValue("No lookup information provided")
        node = await self.inspected_node(macs, node_uuid)
        token = ""
        if newer:  # before the data is processed, which may take a while (Ironic's get_node_with_token)
            try:
                reply = await self.ctx.rpc(node, "LookupToken", cpb.NodeRef(node_uuid=node["uuid"]))
            except errors.NotFound:
                raise errors.NotFound(NOT_FOUND) from None
            token, node = reply.agent_token, (node_from_json(reply.node_json) if reply.node_json else node)
        try:
            await self.ctx.rpc(
                node, "ContinueInspection", cpb.ContinueInspectionRequest(node_uuid=node["uuid"], data_json=dumps(body))
            )
        except errors.NotFound:
            raise errors.NotFound(NOT_FOUND) from None
        doc = self.lookup_document(request, node, token) if newer else {"uuid": node["uuid"]}
        return web.Response(status=202, text=dumps(doc), content_type="application/json")

    async def inspected_node(self, macs: list[str], node_uuid: str | None) -> NodeRecord:
        """The node in ``inspect wait`` that ``node_uuid`` and the MACs name, as Ironic's
        inspection lookup: the MACs must not belong to another node; any failure is one 404."""
        node: NodeRecord | None = None
        if node_uuid:
            try:
                node = await self.ctx.nodes.get(node_uuid)
            except errors.NodeNotFound:
                raise errors.NotFound(NOT_FOUND) from None
        if macs:
            by_mac = await self.ctx.nodes.get_by_port_address(macs)
            if by_mac is not None:
                if node is not None and str(by_mac["uuid"]) != str(node["uuid"]):
                    raise errors.NotFound(NOT_FOUND)
                node = by_mac
        if node is None or node["provision_state"] != states.INSPECTWAIT:
            raise errors.NotFound(NOT_FOUND)
        return node


def checked_deploy_info(body: Any) -> dict[str, Any]:
    """The fields of a pass_deploy_info report, type-checked (400 otherwise)."""
    if not isinstance(body, dict):
        raise errors.InvalidParameterValue("The deploy info must be a JSON object")
    unknown = sorted(set(body) - set(DEPLOY_INFO_FIELDS))
    if unknown:
        raise errors.InvalidParameterValue(f'Unknown argument: "{unknown[0][:64]}"')
    for key in ("address", "key", "iqn", "error"):
        value = body.get(key)
        if value is not None and (not isinstance(value, str) or len(value) > 4096):
            raise errors.InvalidParameterValue(f"Deploy info '{key}' must be a string")
    port = body.get("port")
    if port is not None:
        if isinstance(port, str) and port.isdigit():
            port = int(port)
        if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
            raise errors.InvalidParameterValue("Deploy info 'port' must be a TCP port number")
    if not body.get("key"):
        raise errors.MissingParameter("Deploy info needs the deploy key ('key')")
    return {**body, "port": port}
