"""A second real HTTP server for microversions the api does not advertise yet.

Ferrum advertises a version only once every version below it is real
(docs/api.md). A resource of a later version can be built and tested before
that: this server is made from the same pool, conductor router and handlers
(the routes table, services/api/routes.py) as the api service, and differs
only in accepting versions up to ``ceiling``. Requests at a version the live
api advertises go to the live api; when the maximum is raised, every request
goes there unchanged (tests/integration/test_api_157_178.py does the same
for 1.57 to 1.78).
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
from aiohttp import web
from aiohttp.test_utils import TestServer

from services.api import versions
from services.api.context import ApiContext
from services.api.middlewares import error_middleware
from services.api.routes import add_routes


class VersionedApi:
    """One REST call at one microversion, to whichever server advertises it."""

    def __init__(self, session: aiohttp.ClientSession, live: str, lab: str, live_max: tuple[int, int]) -> None:
        self.session, self.live, self.lab, self.live_max = session, live, lab, live_max

    async def call(
        self, version: tuple[int, int], method: str, path: str, body: Any = None, expect: int | None = None
    ) -> tuple[int, Any]:
        base = self.live if version <= self.live_max else self.lab
        headers = {versions.HEADER: versions.fmt(version)}
        async with self.session.request(method, base + path, json=body, headers=headers) as r:
            text = await r.text()
            if expect is not None:
                assert r.status == expect, f"{method} {path} at {versions.fmt(version)}: {r.status} {text}"
            return r.status, (json.loads(text) if text else None)


@asynccontextmanager
async def versioned_api(stack: Any, ceiling: tuple[int, int]) -> AsyncIterator[VersionedApi]:
    """The live api of ``stack`` plus a lab server that accepts versions up to ``ceiling``."""

    @web.middleware
    async def lab_versions(request: web.Request, handler: Any) -> web.StreamResponse:
        raw = request.headers.get(versions.HEADER, "1.1")
        match = re.fullmatch(r"1\.(\d+)", raw.strip())
        if not match or not 1 <= int(match.group(1)) <= ceiling[1]:
            raise web.HTTPNotAcceptable(text=f"the lab server serves 1.1 to {versions.fmt(ceiling)}")
        request["version"] = (1, int(match.group(1)))
        response = await handler(request)
        response.headers.update(versions.headers(request["version"]))
        return response

    service = next(s for s in stack.services if s.name == "api")
    app = web.Application(middlewares=[error_middleware, lab_versions])
    add_routes(app, ApiContext(service.pool, service.router, service.settings, internal_token=service.internal_token))
    server = TestServer(app, host="127.0.0.1", port=0)
    await server.start_server()
    live = stack.endpoints["api REST (Ironic v1)"]
    try:
        async with aiohttp.ClientSession() as session:
            async with session.get(live + "/") as r:
                major, minor = (await r.json())["default_version"]["version"].split(".")
            yield VersionedApi(session, live, str(server.make_url("")).rstrip("/"), (int(major), int(minor)))
    finally:
        await server.close()
