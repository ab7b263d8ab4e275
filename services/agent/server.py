"""The agent's HTTP command API (IPA's routes, CONTRACT 5.3).

``/v1/commands`` needs ``?agent_token=`` equal to the token the lookup gave
(401 "Token invalid." otherwise, also before any lookup); a new command while
an async one still runs is 409 "Agent is busy". Errors are IPA's
``{"faultcode", "faultstring"}`` bodies (its ``format_exception``), for
every status: a malformed body, name or params is 400, an unknown route 404,
a wrong method 405, a body over ``MAX_BODY`` 413, and only a bug is 500.
"""

from __future__ import annotations

import hmac
import json
import logging
from typing import TYPE_CHECKING, Any

from aiohttp import web

from services.agent import commands as agent_commands
from services.common import errors

if TYPE_CHECKING:
    from services.agent.agent import Agent

LOG = logging.getLogger(__name__)
MAX_BODY = 256 * 1024 * 1024  # a configdrive may be inline


def _fault(status: int, faultcode: str, message: str) -> web.Response:
    return web.json_response({"faultcode": faultcode, "faultstring": message}, status=status)


@web.middleware
async def _errors(request: web.Request, handler: Any) -> web.StreamResponse:
    try:
        return await handler(request)
    except errors.FerrumError as exc:
        return _fault(exc.http_status, exc.faultcode, exc.message)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return _fault(exc.status, "Client" if exc.status < 500 else "Server", exc.reason)
    except Exception as exc:
        LOG.exception("agent API request failed method=%s path=%s", request.method, request.path)
        return _fault(500, "Server", str(exc) or type(exc).__name__)


def _check_token(agent: Agent, request: web.Request) -> None:
    expected = agent.agent_token
    given = request.query.get("agent_token", "")
    if not expected or not hmac.compare_digest(given.encode(), expected.encode()):
        raise errors.Unauthorized("Token invalid.")


class CommandApi:
    """The routes' handlers, bound to one agent (no application keys: they arrived in
    aiohttp 3.9, and the ramdisk runs Debian's 3.8)."""

    def __init__(self, agent: Agent) -> None:
        self.agent = agent

    async def root(self, request: web.Request) -> web.Response:
        base = f"{request.scheme}://{request.host}"
        return web.json_response(
            {
                "name": "OpenStack Ironic Python Agent API",
                "description": "Ferrum deploy agent (IPA-compatible)",
                "versions": [{"id": "v1", "links": [{"href": f"{base}/v1/", "rel": "self"}]}],
                "default_version": {"id": "v1", "links": [{"href": f"{base}/v1/", "rel": "self"}]},
            }
        )

    async def v1(self, request: web.Request) -> web.Response:
        base = f"{request.scheme}://{request.host}/v1"
        return web.json_response(
            {
                "id": "v1",
                "status": [{"href": f"{base}/status", "rel": "self"}],
                "commands": [{"href": f"{base}/commands", "rel": "self"}],
            }
        )

    async def status(self, request: web.Request) -> web.Response:
        return web.json_response(self.agent.status())

    async def list_commands(self, request: web.Request) -> web.Response:
        _check_token(self.agent, request)
        return web.json_response({"commands": [c.as_dict() for c in self.agent.command_results()]})

    async def get_command(self, request: web.Request) -> web.Response:
        _check_token(self.agent, request)
        cmd = self.agent.get_command(request.match_info["command_id"])
        if cmd is None:
            raise errors.NotFound(f"Command {request.match_info['command_id']} not found")
        return web.json_response(cmd.as_dict())

    async def run_command(self, request: web.Request) -> web.Response:
        _check_token(self.agent, request)
        try:
            body = json.loads(await request.read() or b"null")
        except (ValueError, RecursionError):  # RecursionError: nested deeper than the parser's stack
            raise errors.InvalidParameterValue("Request body is not valid JSON") from None
        if not isinstance(body, dict) or not isinstance(body.get("name"), str) or "params" not in body:
            raise errors.InvalidParameterValue("Missing or invalid name or params")
        params = body["params"]
        if not isinstance(params, dict):
            raise errors.InvalidParameterValue("params must be an object")
        wait = request.query.get("wait", "false").lower() in ("true", "1", "yes")
        cmd = await self.agent.execute_command(body["name"], params, wait=wait)
        return web.json_response(cmd.as_dict())

    async def inventory(self, request: web.Request) -> web.Response:
        _check_token(self.agent, request)
        cmd = agent_commands.CommandResult("get_hardware_info", {})
        return web.json_response(await agent_commands.get_hardware_info(self.agent, {}, cmd))


def build_app(agent: Agent) -> web.Application:
    app = web.Application(middlewares=[_errors], client_max_size=MAX_BODY)
    api = CommandApi(agent)
    for prefix in ("/v1", ""):
        app.router.add_get(f"{prefix}/status", api.status)
        app.router.add_get(f"{prefix}/commands", api.list_commands)
        app.router.add_get(f"{prefix}/commands/", api.list_commands)
        app.router.add_post(f"{prefix}/commands", api.run_command)
        app.router.add_post(f"{prefix}/commands/", api.run_command)
        app.router.add_get(f"{prefix}/commands/{{command_id}}", api.get_command)
    app.router.add_get("/v1/inventory", api.inventory)
    app.router.add_get("/", api.root)
    app.router.add_get("/v1", api.v1)
    app.router.add_get("/v1/", api.v1)
    return app
