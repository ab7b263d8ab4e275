"""The REST app's middlewares: Ironic error bodies, microversion
negotiation and version headers, NUL rejection, and http_basic auth."""

from __future__ import annotations

import base64
import binascii
import json
import logging
import re
from collections.abc import Awaitable, Callable

import asyncpg
from aiohttp import web

from services.api import versions
from services.common import errors
from services.common.basic_auth import BasicAuthVerifier
from services.common.db.outage import is_unavailable, unavailable
from services.common.request_project import HEADER as PROJECT_HEADER
from services.common.request_project import parse_project, project_var

LOG = logging.getLogger(__name__)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
PUBLIC_PREFIXES = ("/v1/lookup", "/v1/heartbeat/", "/v1/continue_inspection")
PUBLIC_PATHS = ("/", "/v1", "/v1/", "/v1/openapi.yaml", "/v1/openapi.json")
# The iSCSI deploy ramdisk's report carries its own credential (the per-deploy key).
PUBLIC_PATTERNS = (re.compile(r"^/v1/nodes/[^/]+/vendor_passthru/pass_deploy_info$"),)


def error_response(status: int, message: str, faultcode: str = "Client") -> web.Response:
    """Ironic's shape: error_message holds JSON text with faultstring."""
    inner = json.dumps({"faultcode": faultcode, "faultstring": message, "debuginfo": None})
    return web.json_response({"error_message": inner}, status=status)


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except errors.FerrumError as exc:
        if exc.http_status >= 500 and not exc.retryable:
            LOG.error("request failed: %s", exc.message)
        return _with_version(request, _ferrum_error_response(exc))
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        message = {404: "The resource could not be found.", 405: "The method is not allowed for this resource."}
        response = error_response(exc.status, message.get(exc.status, exc.reason))
        if exc.status == 405 and "Allow" in exc.headers:
            response.headers["Allow"] = exc.headers["Allow"]
        return _with_version(request, response)
    except (asyncpg.DataError, asyncpg.CheckViolationError) as exc:
        # Input PostgreSQL refused (out of range, malformed, over a length
        # limit) that a handler's own checks let through: still the client's.
        LOG.warning("unchecked bad input on %s %s: %s", request.method, request.path, exc)
        return _with_version(request, error_response(400, f"Invalid input: {exc}"))
    except Exception as exc:
        if is_unavailable(exc):
            # PostgreSQL is restarting or unreachable: nothing was changed, retry shortly.
            LOG.warning("database unavailable serving %s %s: %s", request.method, request.path, type(exc).__name__)
            return _with_version(request, _ferrum_error_response(unavailable(exc)))
        LOG.exception("unexpected error serving %s %s", request.method, request.path)
        return _with_version(request, error_response(500, "Internal Server Error", "Server"))


def _ferrum_error_response(exc: errors.FerrumError) -> web.Response:
    response = error_response(exc.http_status, exc.message, exc.faultcode)
    if isinstance(exc, errors.Unauthorized):
        response.headers["WWW-Authenticate"] = 'Basic realm="Baremetal API"'
    if isinstance(exc, errors.ServiceUnavailable):
        # Agents and clients back off for this long before they try again.
        response.headers["Retry-After"] = str(exc.retry_after)
    return response


def _with_version(request: web.Request, response: web.Response) -> web.Response:
    """Errors carry the three version headers too, as every Ironic response does."""
    if "version" in request:
        response.headers.update(versions.headers(request["version"]))
    return response


def _reject_nul(request: web.Request) -> None:
    """PostgreSQL text cannot hold NUL, so a NUL in the path or query is bad input (400), not a 500."""
    if (
        "\x00" in request.path
        or "\x00" in request.query_string
        or any("\x00" in k or "\x00" in v for k, v in request.query.items())
    ):
        raise errors.InvalidParameterValue("NUL characters are not allowed in the URL")


@web.middleware
async def version_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        version = versions.negotiate(
            request.headers.get(versions.HEADER), request.headers.get(versions.STANDARD_HEADER)
        )
    except errors.NotAcceptable as exc:
        refusal = error_response(406, exc.message)
        refusal.headers.update(versions.headers(versions.MIN_VERSION))
        return refusal
    request["version"] = version
    _reject_nul(request)
    # The project the caller acts for (services/common/request_project.py); None is system scope.
    project_var.set(parse_project(request.headers.get(PROJECT_HEADER)))
    response = await handler(request)
    response.headers.update(versions.headers(version))
    return response


def basic_auth_middleware(verifier: BasicAuthVerifier) -> Callable[..., Awaitable[web.StreamResponse]]:
    """Ironic standalone's http_basic: bcrypt hashes from an htpasswd file,
    checked off the event loop by ``verifier`` (:mod:`services.common.basic_auth`)."""

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        path = request.path
        if path in PUBLIC_PATHS or path.startswith(PUBLIC_PREFIXES) or any(p.match(path) for p in PUBLIC_PATTERNS):
            return await handler(request)
        header = request.headers.get("Authorization", "")
        if not header.lower().startswith("basic "):
            raise errors.Unauthorized("Authorization required")
        try:
            user, _, password = base64.b64decode(header[6:].strip()).decode().partition(":")
        except (binascii.Error, UnicodeDecodeError):
            raise errors.Unauthorized("Invalid authorization header") from None
        if not await verifier.verify(user, password):
            raise errors.Unauthorized("Incorrect username or password")
        return await handler(request)

    return middleware
