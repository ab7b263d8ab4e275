"""Files over HTTP on 127.0.0.1 for the machines under test (10.0.2.2 from a QEMU guest)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Mapping
from pathlib import Path

from aiohttp import web

from services.common.aiohttp_serving import start_http_site


@contextlib.asynccontextmanager
async def serving_files(files: Mapping[str, Path], fetched: list[str] | None = None) -> AsyncIterator[int]:
    """Serve ``files`` (URL path -> file) on an ephemeral port; yields the port.
    Every requested path is appended to ``fetched`` when given."""

    async def serve(request: web.Request) -> web.StreamResponse:
        if fetched is not None:
            fetched.append(request.path)
        path = files.get(request.path)
        if path is None:
            raise web.HTTPNotFound()
        return web.FileResponse(path)

    app = web.Application()
    app.router.add_get("/{name:.*}", serve)
    runner, port = await start_http_site(app, "127.0.0.1", 0)
    try:
        yield port
    finally:
        await runner.cleanup()
