"""Vendor passthru (API 1.1): ``/v1/nodes/{ident}/vendor_passthru[/methods]``
and ``/v1/drivers/{driver}/vendor_passthru[/methods]``; the method is named
by ``?method=`` or, as python-ironicclient sends it, as the last path part.

A vendor interface declares its methods (HTTP methods, async or not,
description, attach). The api only forwards: node calls go to the node's
conductor, driver calls to a conductor that runs the hardware type, both
through ``ConductorService.VendorPassthru``. A synchronous method answers 200
with its return value, an asynchronous one 202 (it runs under the node lock
in the background). A missing ``method`` is a 400 here; an unknown method, a
wrong HTTP method or an interface without passthru (``no-vendor``) is the
conductor's 400, as Ironic answers. Ferrum's own ``ipxe_config`` driver
passthru keeps its dedicated public route (services/api/ipxe_passthru.py).
"""

from __future__ import annotations

import json
from typing import Any

import grpc
from aiohttp import web

from ferrum.v1 import conductor_pb2 as cpb
from services.api.context import ApiContext
from services.common import errors
from services.common.conductor_messages import vendor_methods_body
from services.common.grpcserver import REQUEST_ID_KEY
from services.common.jsonutil import dumps
from services.common.logs import request_id_var

HTTP_METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")


class VendorPassthruApi:
    def __init__(self, ctx: ApiContext) -> None:
        self.ctx = ctx

    async def _driver_rpc(self, driver: str, name: str, message: Any) -> Any:
        """Call one conductor that runs ``driver`` (driver methods have no node to route by)."""
        router = self.ctx.router
        hosts = router.hardware_types().get(driver)
        if not hosts:
            raise errors.NotFound(f"Driver {driver} could not be found.")
        address = router.rings.conductors[sorted(hosts)[0]]["grpc_address"]
        try:
            return await getattr(router.stub(address), name)(
                message, timeout=router.timeout, metadata=((REQUEST_ID_KEY, request_id_var.get()),)
            )
        except grpc.aio.AioRpcError as exc:
            raise errors.from_rpc_error(exc) from None

    async def _data(self, request: web.Request) -> Any:
        if not request.can_read_body:
            return {}
        return await self.ctx.body(request)

    @staticmethod
    def _method(request: web.Request) -> str:
        method = request.match_info.get("method") or request.query.get("method")
        if not method:
            raise errors.InvalidParameterValue("Method not specified")
        return method

    @staticmethod
    def _answer(reply: Any) -> web.Response:
        status = 202 if reply.is_async else 200
        value = json.loads(reply.return_json) if reply.return_json else None
        if reply.attach and isinstance(value, str):
            return web.Response(body=value.encode(), status=status, content_type="application/octet-stream")
        return web.json_response(value, status=status, dumps=dumps)

    async def node_methods(self, request: web.Request) -> web.Response:
        node = await self.ctx.node_by_ident(request)
        reply = await self.ctx.rpc(node, "GetVendorMethods", cpb.VendorMethodsRequest(node_uuid=node["uuid"]))
        return web.json_response(vendor_methods_body(reply))

    async def node_call(self, request: web.Request) -> web.Response:
        node = await self.ctx.node_by_ident(request)
        method = self._method(request)
        data = await self._data(request)
        reply = await self.ctx.rpc(
            node,
            "VendorPassthru",
            cpb.VendorPassthruRequest(
                node_uuid=node["uuid"], method=method, http_method=request.method, data_json=dumps(data)
            ),
        )
        return self._answer(reply)

    async def driver_methods(self, request: web.Request) -> web.Response:
        driver = request.match_info["driver"]
        reply = await self._driver_rpc(driver, "GetVendorMethods", cpb.VendorMethodsRequest(driver=driver))
        return web.json_response(vendor_methods_body(reply))

    async def driver_call(self, request: web.Request) -> web.Response:
        driver = request.match_info["driver"]
        method = self._method(request)
        data = await self._data(request)
        reply = await self._driver_rpc(
            driver,
            "VendorPassthru",
            cpb.VendorPassthruRequest(driver=driver, method=method, http_method=request.method, data_json=dumps(data)),
        )
        return self._answer(reply)
