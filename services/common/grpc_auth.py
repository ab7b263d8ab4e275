"""Who may call a gRPC service: an interceptor on the server, metadata on the client.

Two kinds of callers, two kinds of credentials:
- Ferrum's own services call each other (api -> conductor and renderer,
  conductor -> object store) with the **internal token** in
  ``x-ferrum-internal-token`` metadata. The token is configured
  (``FERRUM_SECURITY_INTERNAL_TOKEN``) or generated once and kept in
  PostgreSQL, which every Ferrum process shares and nothing else may read
  (docs/security.md), so replicas on other hosts agree with no manual step.
- People and tools call the public NodeService with the same credentials as
  REST: ``authorization: Basic ...`` checked against the htpasswd file when
  the api runs ``http_basic``.

Health checks stay open (load balancers and Kubernetes probes carry no
credentials); every other method, reflection included, is refused with
UNAUTHENTICATED before the servicer runs.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Protocol

import grpc

from services.common import errors

LOG = logging.getLogger(__name__)

INTERNAL_TOKEN_KEY = "x-ferrum-internal-token"
OPEN_PREFIXES = ("/grpc.health.v1.Health/",)


class Authenticator(Protocol):
    async def __call__(self, metadata: Mapping[str, str]) -> str | None:
        """None when the caller may proceed; else why not (sent as the status details)."""


def internal_token_authenticator(token: str) -> Authenticator:
    """Only callers presenting this internal token (compared in constant time)."""
    expected = token.encode()

    async def check(metadata: Mapping[str, str]) -> str | None:
        given = metadata.get(INTERNAL_TOKEN_KEY, "")
        if given and hmac.compare_digest(given.encode(), expected):
            return None
        return "This internal Ferrum service needs the internal token (x-ferrum-internal-token)."

    return check


def basic_authenticator(verify: Callable[[str, str], Awaitable[bool]]) -> Authenticator:
    """``authorization: Basic base64(user:password)``, verified by ``verify``."""

    async def check(metadata: Mapping[str, str]) -> str | None:
        header = metadata.get("authorization", "")
        scheme, _, encoded = header.partition(" ")
        if scheme.lower() != "basic" or not encoded:
            return "Authentication required: send HTTP basic credentials in the authorization metadata."
        try:
            user, sep, password = base64.b64decode(encoded.strip(), validate=True).decode().partition(":")
        except (binascii.Error, UnicodeDecodeError):
            return "Malformed basic credentials."
        if not sep or not await verify(user, password):
            return "Invalid credentials."
        return None

    return check


class AuthInterceptor(grpc.aio.ServerInterceptor):
    """Refuses every method but the open ones unless ``authenticate`` accepts the caller."""

    def __init__(self, authenticate: Authenticator, *, open_prefixes: Sequence[str] = OPEN_PREFIXES) -> None:
        self._authenticate = authenticate
        self._open = tuple(open_prefixes)

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any] | None]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        method = handler_call_details.method
        if method.startswith(self._open):
            return await continuation(handler_call_details)
        metadata = {k: v for k, v in handler_call_details.invocation_metadata or () if isinstance(v, str)}
        code = grpc.StatusCode.UNAUTHENTICATED
        try:
            refusal = await self._authenticate(metadata)
        except errors.ServiceUnavailable as exc:  # the password checker is saturated: the client retries
            refusal, code = exc.message, grpc.StatusCode.UNAVAILABLE
        handler = await continuation(handler_call_details)
        if refusal is None or handler is None:
            return handler
        LOG.warning("refused gRPC call method=%s code=%s", method, code.name)
        return _refusing(handler, refusal, code)


def _refusing(
    handler: grpc.RpcMethodHandler[Any, Any],
    details: str,
    code: grpc.StatusCode = grpc.StatusCode.UNAUTHENTICATED,
) -> grpc.RpcMethodHandler[Any, Any]:
    """A handler of the same shape that ends the call with ``code``."""

    async def refuse(_request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        await context.abort(code, details)

    async def refuse_stream(_request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        await context.abort(code, details)
        yield  # pragma: no cover - makes this an async generator, as a streaming handler must be

    shape = {
        "request_deserializer": handler.request_deserializer,
        "response_serializer": handler.response_serializer,
    }
    if handler.unary_unary is not None:
        return grpc.unary_unary_rpc_method_handler(refuse, **shape)
    if handler.unary_stream is not None:
        return grpc.unary_stream_rpc_method_handler(refuse_stream, **shape)
    if handler.stream_unary is not None:
        return grpc.stream_unary_rpc_method_handler(refuse, **shape)
    return grpc.stream_stream_rpc_method_handler(refuse_stream, **shape)


class _AddsMetadata:
    """Adds fixed metadata (the caller's credentials) to every call on a channel.

    grpc.aio files each interceptor under one call shape only, so there is one
    small class per shape (``_interceptors``)."""

    def __init__(self, pairs: Sequence[tuple[str, str]]) -> None:
        self._pairs = tuple(pairs)

    def _details(self, details: grpc.aio.ClientCallDetails) -> grpc.aio.ClientCallDetails:
        metadata = grpc.aio.Metadata(*(details.metadata or ()), *self._pairs)
        return grpc.aio.ClientCallDetails(
            details.method, details.timeout, metadata, details.credentials, details.wait_for_ready
        )


class _UnaryUnary(_AddsMetadata, grpc.aio.UnaryUnaryClientInterceptor):
    async def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return await continuation(self._details(details), request)


class _UnaryStream(_AddsMetadata, grpc.aio.UnaryStreamClientInterceptor):
    async def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return await continuation(self._details(details), request)


class _StreamUnary(_AddsMetadata, grpc.aio.StreamUnaryClientInterceptor):
    async def intercept_stream_unary(self, continuation: Any, details: Any, request_iterator: Any) -> Any:
        return await continuation(self._details(details), request_iterator)


class _StreamStream(_AddsMetadata, grpc.aio.StreamStreamClientInterceptor):
    async def intercept_stream_stream(self, continuation: Any, details: Any, request_iterator: Any) -> Any:
        return await continuation(self._details(details), request_iterator)


def _interceptors(pairs: Sequence[tuple[str, str]]) -> list[grpc.aio.ClientInterceptor]:
    return [kind(pairs) for kind in (_UnaryUnary, _UnaryStream, _StreamUnary, _StreamStream)]


def internal_token_metadata(token: str) -> list[grpc.aio.ClientInterceptor]:
    """Client interceptors that present the internal token on every call."""
    return _interceptors([(INTERNAL_TOKEN_KEY, token)]) if token else []


def basic_auth_metadata(user: str, password: str) -> list[grpc.aio.ClientInterceptor]:
    """Client interceptors that present HTTP basic credentials (public NodeService)."""
    encoded = base64.b64encode(f"{user}:{password}".encode()).decode()
    return _interceptors([("authorization", f"Basic {encoded}")])
