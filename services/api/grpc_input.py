"""Screening the native gRPC API's requests before any handler reads them.

REST refuses NUL characters, NaN and Infinity and deep nesting in its
middleware and JSON reader; the gRPC API had no such gate, so a NUL in an
identifier or NaN in ``properties`` reached asyncpg or protobuf's JSON
printer and came back as UNKNOWN with exception class names in the details.
Here every request is checked once, generically, from its descriptor:

- every string, map key and ``Struct`` key: no NUL (PostgreSQL text cannot
  hold it), and at most :data:`MAX_STRING` characters, except the two fields
  that carry documents (``patch_json``: the REST body limit;
  ``configdrive_string``: the provision body limit);
- every double (``google.protobuf.Value`` numbers): finite, since JSON and
  PostgreSQL's jsonb have no NaN or Infinity;
- ``Struct``/``ListValue`` fields become plain JSON values only through
  :func:`json_field`, which applies REST's nesting limit;
- bytes that protobuf itself cannot parse (a message nested past its
  recursion limit of 100, truncated input) are answered INVALID_ARGUMENT by
  the handlers :func:`add_screened_servicer` registers, instead of gRPC's
  INTERNAL "Exception deserializing request".
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
from google.protobuf import json_format
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import DecodeError, Message

from services.api.json_body import json_depth
from services.common import errors
from services.common.config import ApiConfig

MAX_STRING = 64 * 1024
MAX_DETAILS = 1024  # characters of an error message sent back (gRPC details ride in a trailer)


def _string_limits(config: ApiConfig) -> dict[str, int]:
    return {"patch_json": config.max_json_body_size, "configdrive_string": config.max_json_body_size_provision}


def _check_string(value: str, where: str, limit: int) -> None:
    if "\x00" in value:
        raise errors.InvalidParameterValue(f"NUL characters are not allowed in {where}")
    if len(value) > limit:
        raise errors.InvalidParameterValue(f"{where} is longer than {limit} characters")


def screen_request(request: Message, config: ApiConfig) -> None:
    """Refuse NUL characters, oversized strings and non-finite numbers anywhere in ``request``."""
    limits = _string_limits(config)
    stack: list[tuple[Message, str]] = [(request, "")]
    while stack:
        message, prefix = stack.pop()
        for field, value in message.ListFields():
            where = f"{prefix}{field.name}"
            if field.message_type is not None and field.message_type.GetOptions().map_entry:
                value_field = field.message_type.fields_by_name["value"]
                for key, item in value.items():
                    if isinstance(key, str):
                        _check_string(key, f"a key of {where}", MAX_STRING)
                    if value_field.message_type is not None:
                        stack.append((item, f"{where}.{key}."[:200]))
                    elif isinstance(item, str):
                        _check_string(item, where, MAX_STRING)
                continue
            items = value if field.is_repeated else [value]
            for item in items:
                if field.type == FieldDescriptor.TYPE_MESSAGE:
                    stack.append((item, f"{where}."))
                elif field.type == FieldDescriptor.TYPE_STRING:
                    _check_string(item, where, limits.get(field.name, MAX_STRING))
                elif field.type in (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT) and not math.isfinite(
                    item
                ):
                    raise errors.InvalidParameterValue(f"NaN and Infinity are not valid JSON numbers ({where})")


def json_field(request: Message, name: str, *, depth: int) -> Any:
    """A ``Struct`` or ``ListValue`` field as a JSON value, nested no deeper than
    REST allows for the same field of a body (the field itself is level 2)."""
    try:
        value = json_format.MessageToDict(getattr(request, name))
    except (json_format.Error, ValueError):
        raise errors.InvalidParameterValue(f"{name} holds a value JSON cannot carry") from None
    json_depth({name: value}, depth)
    return value


def short(exc: errors.FerrumError) -> errors.FerrumError:
    """The same error with its message cut to :data:`MAX_DETAILS` characters
    (messages quote the input, and a 3 MB ident must not come back whole)."""
    if len(exc.message) <= MAX_DETAILS:
        return exc
    return type(exc)(exc.message[: MAX_DETAILS - 3] + "...")


class _Undecodable:
    """What the lenient deserializer hands on for bytes protobuf refused."""


def _lenient(deserialize: Callable[[bytes], Any]) -> Callable[[bytes], Any]:
    def parse(data: bytes) -> Any:
        try:
            return deserialize(data)
        except (DecodeError, RecursionError, ValueError):
            return _Undecodable()

    return parse


async def _refuse(context: grpc.aio.ServicerContext) -> None:
    await errors.abort_with(
        context,
        errors.InvalidParameterValue(
            "The request could not be parsed (malformed, or nested deeper than protobuf's recursion limit)"
        ),
    )


def _screened(handler: Any) -> Any:
    """``handler`` (a grpc ``RpcMethodHandler``, a named tuple at run time) with a
    lenient deserializer; typed Any because grpc's stubs declare neither the
    tuple nor the aio signatures of its callables."""
    if handler.request_deserializer is None:
        return handler
    if handler.unary_unary is not None:
        inner = handler.unary_unary

        async def unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
            if isinstance(request, _Undecodable):
                await _refuse(context)
            return await inner(request, context)

        return handler._replace(request_deserializer=_lenient(handler.request_deserializer), unary_unary=unary)
    if handler.unary_stream is not None:
        inner_stream = handler.unary_stream

        async def stream(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            if isinstance(request, _Undecodable):
                await _refuse(context)
            async for item in inner_stream(request, context):
                yield item

        return handler._replace(request_deserializer=_lenient(handler.request_deserializer), unary_stream=stream)
    return handler


class _ScreeningServer:
    """Stands in for the server while the generated ``add_*_to_server`` registers
    its handlers, and registers screened copies with the real one."""

    def __init__(self, server: grpc.aio.Server) -> None:
        self._server = server
        self.handlers: dict[str, dict[str, grpc.RpcMethodHandler]] = {}

    def add_registered_method_handlers(self, service: str, handlers: dict[str, grpc.RpcMethodHandler]) -> None:
        self.handlers[service] = {name: _screened(h) for name, h in handlers.items()}

    def add_generic_rpc_handlers(self, generic: Any) -> None:
        """Registered once the service's method table is known (the generated code
        passes the same table to both calls)."""


def add_screened_servicer(add_to_server: Callable[[Any, Any], None], servicer: Any, server: grpc.aio.Server) -> None:
    """``add_NodeServiceServicer_to_server(servicer, server)``, with undecodable
    requests answered INVALID_ARGUMENT."""
    proxy = _ScreeningServer(server)
    add_to_server(servicer, proxy)
    for service, handlers in proxy.handlers.items():
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service, handlers),))
        server.add_registered_method_handlers(service, handlers)
