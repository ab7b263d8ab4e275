"""The object store's aiohttp routes: temp-URL downloads (GET and HEAD on
``/t/<id>.<expires>.<sig>/<name>``) and the PUT upload route for the requests
the fast front door (``upload_front_door``) hands over, such as chunked bodies.
Download refusals carry a fixed short body and never say whether the object
exists."""

from __future__ import annotations

import logging

from aiohttp import web

from services.objectstore.store import ObjectStore
from services.objectstore.upload_requests import HttpUploads, Reply

LOG = logging.getLogger(__name__)
_REFUSALS = {401: "temp URL expired\n", 403: "temp URL signature invalid\n", 404: "not found\n"}
UPLOAD_READ = 1024 * 1024


def _response(reply: Reply) -> web.Response:
    return web.Response(status=reply.status, body=reply.body, headers=dict(reply.headers))


def add_routes(app: web.Application, store: ObjectStore, uploads: HttpUploads) -> None:
    async def download(request: web.Request) -> web.StreamResponse:
        token, name = request.match_info["token"], request.match_info["name"]
        check = await store.check_temp_url(request.method, token, name)
        if check.status != 200:
            LOG.info("temp URL refused status=%d method=%s peer=%s", check.status, request.method, request.remote)
            return web.Response(
                status=check.status, text=_REFUSALS[check.status], headers={"Cache-Control": "no-store"}
            )
        return await store.serve(request, check)

    async def upload(request: web.Request) -> web.StreamResponse:
        chunked = "chunked" in request.headers.get("Transfer-Encoding", "").lower()
        if request.content_length is None and not chunked:
            return web.Response(status=411, text="a PUT needs Content-Length or chunked encoding\n")
        headers = {k.lower(): v for k, v in request.headers.items()}
        try:
            plan = uploads.plan(request.path, headers, request.content_length)
            row = await uploads.receive(plan, request.content.iter_chunked(UPLOAD_READ))
        except Exception as exc:  # noqa: BLE001 - every failure becomes an answer
            return _response(HttpUploads.failed(exc))
        return _response(HttpUploads.created(row))

    app.router.add_get("/t/{token}/{name:.+}", download)
    app.router.add_put("/u/{token}/{container}/{name:.+}", upload)
