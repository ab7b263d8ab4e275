"""The 308 from ``/v1/ports/`` to ``/v1/ports`` (query kept).

python-ironicclient lists with filters as ``/v1/ports/?node=..``; Ironic
serves both spellings, so a path that exists without the slash gets a 308 to
it (method and body kept), anything else the usual 404. The routes table
registers this handler for every path that ends in ``/`` after ``/`` and
``/v1/``, the only routes of their own that end in one.
"""

from __future__ import annotations

from aiohttp import web

from services.api.context import ApiContext


class TrailingSlashRedirect:
    def __init__(self, ctx: ApiContext) -> None:
        self.ctx = ctx

    async def redirect(self, request: web.Request) -> web.Response:
        path = request.path.rstrip("/")
        match = await request.app.router.resolve(request.clone(rel_url=path))
        if match.http_exception is not None or match.handler == self.redirect:
            raise web.HTTPNotFound()
        query = f"?{request.query_string}" if request.query_string else ""
        raise web.HTTPPermanentRedirect(f"{self.ctx.base(request)}{path}{query}")
