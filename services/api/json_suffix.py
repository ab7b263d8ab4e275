"""Below microversion 1.91 a ``.json`` path suffix is dropped, as Ironic did.

Ironic once guessed the content type from a ``.json`` extension; to keep old
clients working, a request that names a version below 1.91 in
``X-OpenStack-Ironic-API-Version`` and whose path ends in ``.json`` is served
as the path without it (``/v1/nodes.json`` lists nodes,
``/v1/nodes/test.json`` is the node ``test``), and when the shorter path
names nothing (a 404), as the path sent, so a node really named
``test.json`` is still found. From 1.91, and without the header, the path
means what it says. Like the unversioned-path middleware it re-resolves the
route and runs after version negotiation and auth.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import web

from services.api import versions
from services.common import errors

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
SUFFIX = ".json"
UNTIL = (1, 91)  # the first version without the special treatment


@web.middleware
async def json_suffix_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    path = request.rel_url.raw_path.rstrip("/")
    if not path.endswith(SUFFIX) or not request.headers.get(versions.HEADER) or request.get("version", UNTIL) >= UNTIL:
        return await handler(request)
    stripped = request.clone(
        rel_url=request.rel_url.with_path(path[: -len(SUFFIX)], encoded=True).with_query(request.rel_url.query)
    )
    match = await request.app.router.resolve(stripped)
    if match.http_exception is not None:
        return await handler(request)
    match.add_app(request.app)
    match.freeze()
    stripped._match_info = match  # what aiohttp's own dispatch sets; there is no public setter
    try:
        return await match.handler(stripped)
    except (errors.NotFound, web.HTTPNotFound):
        return await handler(request)  # the name with its suffix, as Ironic's _get_with_suffix
