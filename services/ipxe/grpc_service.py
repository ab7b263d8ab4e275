"""gRPC ``ferrum.v1.BootScriptRenderer``: the same scripts as the HTTP routes,
for the api gateway's ``vendor_passthru/ipxe_config`` and other services."""

from __future__ import annotations

from typing import Any

import grpc

from ferrum.v1 import renderer_pb2, renderer_pb2_grpc
from services.common import errors
from services.ipxe.handlers import selector
from services.ipxe.render import ScriptRenderer
from services.ipxe.safety import UnsafeValue

SERVICE_NAME = renderer_pb2.DESCRIPTOR.services_by_name["BootScriptRenderer"].full_name


class RendererServicer(renderer_pb2_grpc.BootScriptRendererServicer):
    def __init__(self, renderer: ScriptRenderer) -> None:
        self._renderer = renderer

    async def RenderBootScript(
        self,
        request: renderer_pb2.RenderBootScriptRequest,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> renderer_pb2.RenderBootScriptResponse:
        which = request.WhichOneof("selector")
        try:
            mac, uuid = selector(
                request.mac if which == "mac" else None, request.node_uuid if which == "node_uuid" else None
            )
        except UnsafeValue as exc:
            await errors.abort_with(context, errors.InvalidParameterValue(str(exc)))
            raise  # pragma: no cover - abort raises
        rendered = await self._renderer.render(mac=mac, uuid=uuid)
        return renderer_pb2.RenderBootScriptResponse(
            script=rendered.script,
            node_uuid=rendered.node_uuid,
            kind=rendered.kind,
            reason=rendered.reason,
        )
