"""A node's states and the requests that change them:
``GET /v1/nodes/{ident}/states``, ``PUT .../states/power``,
``PUT .../states/provision``, ``PUT|GET .../states/console`` (docs/console.md),
``PUT .../states/raid`` (the target RAID config, 1.12) and ``PUT|DELETE /v1/nodes/{ident}/maintenance``.

The api checks what it can without the hardware (the verb, the version, the
body, whether the state machine allows the event now) so that a bad request
is a 400/406/409 at once; the owning conductor then does the work and the
answer is 202. Boot mode and secure boot changes live with the management
endpoints (:mod:`services.api.node_management`).
"""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from ferrum.v1 import conductor_pb2 as cpb
from services.api import params, views
from services.api.context import ApiContext
from services.api.provision_params import (
    check_child_step_nodes,
    check_clean_steps,
    check_configdrive,
    check_deploy_steps,
    check_disable_ramdisk,
    check_rescue_password,
    check_service_steps,
)
from services.api.runbook_use import STEPS_KEY, resolve_runbook
from services.common import errors, states
from services.common.conductor_messages import step_messages
from services.common.db.records import NodeRecord
from services.common.db.runbooks import RunbookRepository
from services.common.jsonutil import dumps
from services.common.request_project import project_var

SOFT_POWER_SINCE = (1, 27)
PROVISION_KEYS = {
    "target",
    "configdrive",
    "clean_steps",
    "rescue_password",
    "deploy_steps",
    "disable_ramdisk",
    "service_steps",
    "runbook",
}
# Verbs Ironic checks against the state machine before the version (they are not in
# its MIN_VERB_VERSIONS): an old client asking one where it cannot apply gets 400, not 406.
STATE_BEFORE_VERSION = ("unhold", "service")
# oslo's strutils.bool_from_string(strict=True), which Ironic's args.boolean uses for "enabled".
TRUE_STRINGS = ("1", "t", "true", "on", "y", "yes")
FALSE_STRINGS = ("0", "f", "false", "off", "n", "no")


def boolean_argument(name: str, value: Any) -> bool:
    """A JSON boolean, or one of the strings Ironic accepts for it; 400 with Ironic's text otherwise."""
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower() if value is not None else "None"
    if text in TRUE_STRINGS:
        return True
    if text in FALSE_STRINGS:
        return False
    acceptable = ", ".join(f"'{s}'" for s in sorted(TRUE_STRINGS + FALSE_STRINGS))
    raise errors.InvalidParameterValue(
        f"Invalid {name}: Unrecognized value '{value}', acceptable values are: {acceptable}"
    )


def accepted(base: str, node: NodeRecord) -> web.Response:
    """202 pointing at the node's states, where the client watches the change happen."""
    return web.Response(status=202, headers={"Location": f"{base}/v1/nodes/{node['uuid']}/states"})


class NodeStatesApi:
    def __init__(self, ctx: ApiContext) -> None:
        self.ctx = ctx
        self.runbooks = RunbookRepository(ctx.pool)

    async def get_states(self, request: web.Request) -> web.Response:
        node = await self.ctx.node_by_ident(request)
        return web.json_response(views.node_states_document(node, request["version"]), dumps=dumps)

    async def set_power(self, request: web.Request) -> web.Response:
        node = await self.ctx.node_by_ident(request)
        body = await self.ctx.body(request)
        target = body.get("target") if isinstance(body, dict) else None
        if target not in states.POWER_TARGETS:
            raise errors.InvalidParameterValue(
                f"Invalid state {target!r}: must be one of {sorted(states.POWER_TARGETS)}"
            )
        timeout = body.get("timeout")
        if target in states.SOFT_POWER_TARGETS or timeout is not None:
            params.require_version(request, SOFT_POWER_SINCE, "Soft power actions and timeout")
        if timeout is not None and (
            not isinstance(timeout, int) or isinstance(timeout, bool) or not 1 <= timeout <= 2**31 - 1
        ):
            raise errors.InvalidParameterValue(
                f"Invalid timeout value {timeout}. The timeout must be a positive integer."
            )
        if target in (states.POWER_OFF, states.SOFT_POWER_OFF) and node.get("disable_power_off"):
            # API 1.95: the node may not be powered off (Ironic's PowerStateFailure, 409).
            raise errors.InvalidState(f"Failed to set node power state to {target}.")
        await self.ctx.rpc(
            node, "ChangePowerState", cpb.PowerStateRequest(node_uuid=node["uuid"], target=target, timeout=timeout or 0)
        )
        return accepted(self.ctx.base(request), node)

    async def set_provision(self, request: web.Request) -> web.Response:
        node = await self.ctx.node_by_ident(request)
        body = await self.ctx.body(request, provision=True)
        if not isinstance(body, dict) or not isinstance(body.get("target"), str):
            raise errors.InvalidParameterValue("The provision request needs a 'target' string")
        unknown = set(body) - PROVISION_KEYS
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
        if verb not in STATE_BEFORE_VERSION:
            params.require_version(request, since, f"The provision verb {verb}")
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
        if verb in STATE_BEFORE_VERSION:
            params.require_version(request, since, f"The provision verb {verb}")
        if body.get("runbook") is not None:  # 1.92: the runbook's steps instead of the request's
            used = await resolve_runbook(
                self.runbooks,
                node,
                body["runbook"],
                verb=verb,
                version=request["version"],
                project=project_var.get(),
                given_steps=body.get(STEPS_KEY.get(verb, "clean_steps")),
            )
            # The runbook's disable_ramdisk replaces the request's, and is checked like one (1.70 clean, 1.108 service).
            body = {**body, STEPS_KEY[verb]: used.steps, "disable_ramdisk": used.disable_ramdisk or None}
        configdrive = body.get("configdrive")
        check_configdrive(configdrive, verb, request["version"])  # its contents: the conductor, before it writes
        clean_steps = check_clean_steps(body.get("clean_steps"), verb)
        check_rescue_password(body.get("rescue_password"), verb)
        deploy_steps = check_deploy_steps(body.get("deploy_steps"), verb, request["version"])
        disable_ramdisk = check_disable_ramdisk(body.get("disable_ramdisk"), verb, request["version"])
        service_steps = check_service_steps(body.get("service_steps"), verb)
        await check_child_step_nodes(self.ctx.nodes, clean_steps or service_steps)
        await self.ctx.rpc(
            node,
            "DoProvisionAction",
            cpb.ProvisionActionRequest(
                node_uuid=node["uuid"],
                event=event,
                configdrive_json=json.dumps(configdrive) if configdrive else "",
                clean_steps=step_messages("clean", clean_steps),
                rescue_password=body.get("rescue_password") or "",
                deploy_steps=step_messages("deploy", deploy_steps),
                disable_ramdisk=disable_ramdisk,
                service_steps=step_messages("service", service_steps),
            ),
        )
        return accepted(self.ctx.base(request), node)

    async def get_console(self, request: web.Request) -> web.Response:
        """``{"console_enabled": bool, "console_info": {"type", "url", ...} | null}`` from the owning conductor."""
        node = await self.ctx.node_by_ident(request)
        reply = await self.ctx.rpc(node, "GetConsoleInformation", cpb.NodeRef(node_uuid=node["uuid"]))
        info = dict(reply.console_info) if reply.console_enabled else None
        return web.json_response({"console_enabled": reply.console_enabled, "console_info": info}, dumps=dumps)

    async def set_console(self, request: web.Request) -> web.Response:
        """``{"enabled": true|false}``: 202 once the owning conductor changed the console under the lock."""
        node = await self.ctx.node_by_ident(request)
        body = await self.ctx.body(request) if request.can_read_body else {}
        if not isinstance(body, dict):
            raise errors.InvalidParameterValue("The console request must be a JSON object")
        unexpected = set(body) - {"enabled"}
        if unexpected:
            raise errors.InvalidParameterValue(f"Unexpected arguments: {', '.join(sorted(unexpected))}")
        if "enabled" not in body:
            raise errors.InvalidParameterValue("Missing mandatory parameter: enabled")
        enabled = boolean_argument("enabled", body["enabled"])
        await self.ctx.rpc(node, "SetConsoleMode", cpb.ConsoleModeRequest(node_uuid=node["uuid"], enabled=enabled))
        return accepted(self.ctx.base(request), node)

    async def set_raid(self, request: web.Request) -> web.Response:
        """The body becomes ``target_raid_config`` (1.12): checked by the node's raid
        interface under the lock, 204. ``{}`` clears it. As Ironic, a raid interface
        that cannot take one (``no-raid``) answers 404, RAID being optional."""
        node = await self.ctx.node_by_ident(request)
        body = await self.ctx.body(request)
        if not isinstance(body, dict):
            raise errors.InvalidParameterValue(
                f"Invalid target_raid_config: {type(body).__name__} is not a JSON object"
            )
        try:
            await self.ctx.rpc(
                node,
                "SetTargetRaidConfig",
                cpb.TargetRaidConfigRequest(node_uuid=node["uuid"], target_raid_config_json=json.dumps(body)),
            )
        except errors.UnsupportedDriverExtension as exc:
            raise errors.NotFound(exc.message) from None
        return web.Response(status=204)

    async def set_maintenance(self, request: web.Request) -> web.Response:
        node = await self.ctx.node_by_ident(request)
        reason = None
        if request.can_read_body:
            body = await self.ctx.body(request)
            reason = body.get("reason") if isinstance(body, dict) else None
            if reason is not None and not isinstance(reason, str):
                raise errors.InvalidParameterValue("The maintenance reason must be a string")
        await self.ctx.rpc(
            node,
            "SetMaintenance",
            cpb.MaintenanceRequest(node_uuid=node["uuid"], maintenance=True, reason=reason or ""),
        )
        return web.Response(status=202)

    async def unset_maintenance(self, request: web.Request) -> web.Response:
        node = await self.ctx.node_by_ident(request)
        await self.ctx.rpc(node, "SetMaintenance", cpb.MaintenanceRequest(node_uuid=node["uuid"], maintenance=False))
        return web.Response(status=202)
