"""A node's virtual media on request: ``POST|DELETE /v1/nodes/{ident}/vmedia``
(microversion 1.89) and ``GET`` (1.93), through the node's management
interface (the Redfish BMC's VirtualMedia; the fake interface keeps them in
the node). A driver that cannot is a 400 naming its interface.

Checks as Ironic's: ``device_type`` one of ``cdrom``, ``floppy``, ``disk``;
``image_url`` with an http, https, nfs or cifs scheme; only those keys and
``image_download_source``. Ferrum hands the URL to the BMC as it is (Ironic's
``http`` source); ``local`` and ``swift``, where Ironic's conductor copies
the image to its own web server first, are refused with a 400, and a request
that names no source gets ``http`` (Ironic's default is ``local``).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlparse

from aiohttp import web

from ferrum.v1 import conductor_pb2 as cpb
from services.api.context import ApiContext
from services.common import errors
from services.common.conductor_messages import virtual_media_list
from services.common.jsonutil import dumps

ATTACH_SINCE = (1, 89)
GET_SINCE = (1, 93)
VMEDIA_DEVICES = ("disk", "cdrom", "floppy")
URL_SCHEMES = ("http", "https", "nfs", "cifs")
DOWNLOAD_SOURCES = ("http", "local", "swift")


def check_attach(body: Any) -> tuple[str, str]:
    """(device_type, image_url) from an attach request; 400 as Ironic's schema otherwise."""
    if not isinstance(body, dict):
        raise errors.InvalidParameterValue("The virtual media request must be a JSON object")
    unexpected = set(body) - {"device_type", "image_url", "image_download_source"}
    if unexpected:
        raise errors.InvalidParameterValue(
            f"Additional properties are not allowed ({', '.join(sorted(map(repr, unexpected)))} unexpected)"
        )
    for key in ("device_type", "image_url"):
        if key not in body:
            raise errors.InvalidParameterValue(f"'{key}' is a required property")
        if not isinstance(body[key], str):
            raise errors.InvalidParameterValue(f"{body[key]!r} is not of type 'string'")
    if body["device_type"] not in VMEDIA_DEVICES:
        raise errors.InvalidParameterValue(f"{body['device_type']!r} is not one of {list(VMEDIA_DEVICES)}")
    source = body.get("image_download_source", "http")
    if source not in DOWNLOAD_SOURCES:
        raise errors.InvalidParameterValue(f"{source!r} is not one of {list(DOWNLOAD_SOURCES)}")
    if source != "http":
        raise errors.InvalidParameterValue(
            f"image_download_source {source!r} is not supported: Ferrum hands the image URL to the BMC "
            "as it is ('http')"
        )
    scheme = urlparse(body["image_url"]).scheme
    if scheme not in URL_SCHEMES:
        raise errors.Invalid(f"Unsupported or missing URL scheme: {scheme}")
    return body["device_type"], body["image_url"]


def check_device_types(raw: str | None) -> list[str]:
    """``?device_types=cdrom,floppy``; every device when absent."""
    wanted = [d.strip() for d in (raw or "").split(",") if d.strip()]
    invalid = [d for d in wanted if d not in VMEDIA_DEVICES]
    if invalid:
        raise errors.Invalid(f"Invalid device type(s) {', '.join(invalid)} (valid are {', '.join(VMEDIA_DEVICES)})")
    return wanted


class NodeVmediaApi:
    def __init__(self, ctx: ApiContext) -> None:
        self.ctx = ctx

    async def attach(self, request: web.Request) -> web.Response:
        node = await self.ctx.node_by_ident(request)
        device_type, image_url = check_attach(await self.ctx.body(request))
        message = cpb.VirtualMediaRequest(node_uuid=node["uuid"], device_type=device_type, image_url=image_url)
        await self.ctx.rpc(node, "AttachVirtualMedia", message)
        return web.Response(status=204)

    async def detach(self, request: web.Request) -> web.Response:
        devices = check_device_types(request.query.get("device_types"))
        node = await self.ctx.node_by_ident(request)
        await self.ctx.rpc(
            node, "DetachVirtualMedia", cpb.VirtualMediaRequest(node_uuid=node["uuid"], device_types=devices)
        )
        return web.Response(status=204)

    async def list_media(self, request: web.Request) -> web.Response:
        node = await self.ctx.node_by_ident(request)
        reply = await self.ctx.rpc(node, "GetVirtualMedia", cpb.NodeRef(node_uuid=node["uuid"]))
        return web.json_response(virtual_media_list(reply), dumps=dumps)
