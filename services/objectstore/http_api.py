"""Temp-URL downloads over HTTP for BMCs and iPXE: GET and HEAD on
``/t/<id>.<expires>.<sig>/<name>``. Refusals carry a fixed short body and
never say whether the object exists."""

from __future__ import annotations

import logging

from aiohttp import web

from services.objectstore.store import ObjectStore

LOG = logging.getLogger(__name__)
_REFUSALS = {401: "temp URL expired\n", 403: "temp URL signature invalid\n", 404: "not found\n"}


def add_routes(app: web.Application, store: ObjectStore) -> None:
    async def download(request: web.Request) -> web.StreamResponse:
        token, name = request.match_info["token"], request.match_info["name"]
        check = await store.check_temp_url(request.method, token, name)
        if check.status != 200:
            LOG.info("temp URL refused status=%d method=%s peer=%s", check.status, request.method, request.remote)
            return web.Response(status=check.status, text=_REFUSALS[check.status],
                                headers={"Cache-Control": "no-store"})
        return await store.serve(request, check)

    app.router.add_get("/t/{token}/{name:.+}", download)
