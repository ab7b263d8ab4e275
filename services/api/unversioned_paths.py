"""Paths without the ``/v1`` prefix are served as their ``/v1`` form, as Ironic does.

Ironic's root controller hands any path it does not know to the default
version, so ``/nodes/detail``, ``/ports/detail?node=..``,
``/nodes/{id}/allocation`` and ``/drivers/{name}/properties`` answer as their
``/v1/...`` routes, and some clients rely on it. Here a request that matched
no route and does not start with ``/v1`` is resolved again with the prefix;
if that names a route, its handler serves the request under the ``/v1``
path (so links and ``next`` point at ``/v1``), otherwise the original 404
stands. It is the innermost middleware: version negotiation and auth have
already run on the request as sent.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import web

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
PREFIX = "/v1"


@web.middleware
async def unversioned_path_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    path = request.rel_url.raw_path
    if request.match_info.http_exception is None or path == "/" or path == PREFIX or path.startswith(PREFIX + "/"):
        return await handler(request)
    versioned = request.clone(
        rel_url=request.rel_url.with_path(PREFIX + path, encoded=True).with_query(request.rel_url.query)
    )
    match = await request.app.router.resolve(versioned)
    if match.http_exception is not None:
        return await handler(request)  # no /v1 route either: the original 404 or 405
    match.add_app(request.app)
    match.freeze()
    versioned._match_info = match  # what aiohttp's own dispatch sets; there is no public setter
    return await match.handler(versioned)
