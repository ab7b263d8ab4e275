"""gRPC server bootstrap shared by every service: health, reflection, request
ids and metrics, so each service only registers its own servicers."""

from __future__ import annotations

import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, cast

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer
from grpc_reflection.v1alpha import reflection

from services.common.grpc_auth import Authenticator, AuthInterceptor, internal_token_metadata
from services.common.logs import request_id_var
from services.common.metrics import ServiceMetrics
from services.common.request_project import METADATA_KEY as PROJECT_KEY
from services.common.request_project import project_var
from services.common.tls import TlsFiles, grpc_channel_credentials, grpc_server_credentials

REQUEST_ID_KEY = "x-request-id"
MAX_MESSAGE_BYTES = 80 * 1024 * 1024


class ContextInterceptor(grpc.aio.ServerInterceptor):
    """Sets the request id from metadata (or a new one) and records metrics."""

    def __init__(self, metrics: ServiceMetrics) -> None:
        self._metrics = metrics

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any] | None]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        handler = await continuation(handler_call_details)
        if handler is None or handler.unary_unary is None:
            return handler
        method = handler_call_details.method.rsplit("/", 1)[-1]
        incoming = dict(handler_call_details.invocation_metadata or ())
        # An aio server's handlers are coroutines; the stubs type RpcMethodHandler for the sync server.
        inner = cast(Callable[[Any, grpc.aio.ServicerContext[Any, Any]], Awaitable[Any]], handler.unary_unary)
        metrics = self._metrics

        async def wrapped(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            request_id_var.set(str(incoming.get(REQUEST_ID_KEY) or f"req-{uuid.uuid4()}"))
            project_var.set(str(incoming[PROJECT_KEY]) if incoming.get(PROJECT_KEY) else None)
            started = time.perf_counter()
            code = "OK"
            try:
                return await inner(request, context)
            except BaseException:
                code = (context.code() or grpc.StatusCode.UNKNOWN).name if hasattr(context, "code") else "ERROR"
                raise
            finally:
                metrics.observe("grpc", method, code, time.perf_counter() - started)

        return grpc.unary_unary_rpc_method_handler(
            wrapped,
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )


async def start_grpc_server(
    *,
    host: str,
    port: int,
    register: Callable[[grpc.aio.Server], None],
    service_names: Sequence[str],
    metrics: ServiceMetrics,
    authenticate: Authenticator | None,
    tls: TlsFiles | None,
) -> tuple[grpc.aio.Server, int, HealthServicer]:
    """Start a gRPC server with health checking and reflection.

    Returns the server, the bound port (useful with port 0) and the health
    servicer, which the caller flips to NOT_SERVING on shutdown so load
    balancers drain it before it stops. ``authenticate`` decides who may call
    (services/common/grpc_auth.py); None leaves the service open, which only
    the public NodeService under ``noauth`` does. ``tls`` serves TLS with
    those files (services/common/tls.py); None serves plain TCP.
    """
    interceptors: list[grpc.aio.ServerInterceptor] = [ContextInterceptor(metrics)]
    if authenticate is not None:
        interceptors.insert(0, AuthInterceptor(authenticate))
    server = grpc.aio.server(
        interceptors=interceptors,
        options=[
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            ("grpc.so_reuseport", 0),
        ],
    )
    register(server)
    health = HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    names = [*service_names, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME]
    reflection.enable_server_reflection(names, server)
    if tls is not None:
        bound = server.add_secure_port(f"{host}:{port}", grpc_server_credentials(tls))
    else:
        bound = server.add_insecure_port(f"{host}:{port}")
    if bound == 0:
        raise OSError(f"cannot bind gRPC on {host}:{port} (address in use?)")
    await server.start()
    await health.set("", health_pb2.HealthCheckResponse.SERVING)
    for name in service_names:
        await health.set(name, health_pb2.HealthCheckResponse.SERVING)
    return server, bound, health


async def stop_grpc_server(server: grpc.aio.Server, health: HealthServicer, grace: float = 5.0) -> None:
    """Drain: report NOT_SERVING, let in-flight calls finish, then stop."""
    await health.enter_graceful_shutdown()
    await server.stop(grace)


def client_channel(address: str, *, token: str, tls: TlsFiles | None) -> grpc.aio.Channel:
    """A channel to an internal service with Ferrum's message limits, presenting
    the internal token on every call; over TLS verified against the configured
    CA when ``tls`` is set (the deployment's TLS switch, services/common/tls.py)."""
    options = [
        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
        ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ]
    interceptors = internal_token_metadata(token)
    if tls is not None:
        return grpc.aio.secure_channel(
            address, grpc_channel_credentials(tls), options=options, interceptors=interceptors
        )
    return grpc.aio.insecure_channel(address, options=options, interceptors=interceptors)
