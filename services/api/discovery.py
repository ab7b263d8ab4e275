"""Version discovery: ``GET /`` (the versions document) and ``GET /v1``
(the v1 resources), as Ironic answers them, so clients can negotiate.

A resource appears in ``/v1`` only from the microversion that introduced it.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from services.api import versions
from services.api.context import ApiContext

# Resources listed in /v1 and the microversion each appeared in.
V1_RESOURCES: tuple[tuple[str, tuple[int, int]], ...] = (
    ("chassis", (1, 1)),
    ("nodes", (1, 1)),
    ("ports", (1, 1)),
    ("drivers", (1, 1)),
    ("portgroups", (1, 23)),
    ("lookup", (1, 22)),
    ("heartbeat", (1, 22)),
    ("volume", (1, 32)),
    ("conductors", (1, 49)),
    ("allocations", (1, 52)),
    ("events", (1, 54)),
    ("deploy_templates", (1, 55)),
    ("shards", (1, 82)),
    ("continue_inspection", (1, 84)),
    ("runbooks", (1, 92)),
    ("inspection_rules", (1, 96)),
)


def version_document(base: str) -> dict[str, Any]:
    """The one API version Ferrum serves (v1) and its microversion range."""
    return {
        "id": "v1",
        "links": [{"href": f"{base}/v1/", "rel": "self"}],
        "status": "CURRENT",
        "min_version": versions.fmt(versions.MIN_VERSION),
        "version": versions.fmt(versions.MAX_VERSION),
    }


class DiscoveryApi:
    def __init__(self, ctx: ApiContext) -> None:
        self.ctx = ctx

    async def root(self, request: web.Request) -> web.Response:
        doc = version_document(self.ctx.base(request))
        return web.json_response(
            {
                "name": "OpenStack Ironic API",
                "description": "Ironic is an OpenStack project which aims to provision baremetal machines. "
                "This endpoint is served by Ferrum.",
                "default_version": doc,
                "versions": [doc],
            }
        )

    async def v1_root(self, request: web.Request) -> web.Response:
        if request.method not in ("GET", "HEAD"):
            raise web.HTTPMethodNotAllowed(request.method, ["GET", "HEAD"])
        base = self.ctx.base(request)
        doc: dict[str, Any] = {
            "id": "v1",
            "links": [
                {"href": f"{base}/v1/", "rel": "self"},
                {
                    "href": "https://docs.openstack.org//ironic/latest/contributor//webapi.html",
                    "rel": "describedby",
                    "type": "text/html",
                },
            ],
            "media_types": {"base": "application/json", "type": "application/vnd.openstack.ironic.v1+json"},
            "version": version_document(base),
        }
        for name, since in V1_RESOURCES:
            if request["version"] < since:
                continue
            doc[name] = [{"href": f"{base}/v1/{name}/", "rel": "self"}, {"href": f"{base}/{name}/", "rel": "bookmark"}]
        return web.json_response(doc)
