"""Unary calls to a gRPC servicer of this same process, without the network.

``ferrum stack`` (the default deployment, the demo and the tests) runs the
api, the conductor and the object store in one process and one event loop.
A unary call between them over loopback gRPC costs about 0.6 ms of CPU
(protobuf encoding both ways, HTTP/2 frames, a hop through the gRPC core's
threads and back) and two event-loop turns each way: as much as the work
of a cheap call such as a lifecycle verb's lock and state change (issue 22).
A caller that finds the address it is about to call registered here calls
the servicer's method directly instead.

The contract callers see is the network's: the servicers end a failed call
with :func:`services.common.errors.abort_with`, which on the local context
raises the same ``grpc.aio.AioRpcError`` (status code, details, the error
class in trailing metadata) that a gRPC client would have got, and a
servicer that raises anything else becomes ``UNKNOWN`` as the gRPC server
makes it. A deadline is kept the same way (``DEADLINE_EXCEEDED``, and the
servicer's work is cancelled). The call runs in its own task, with a copy of
the caller's context variables (the request id and the project, which a
gRPC caller sends as metadata), so what the servicer sets in its context
does not leak back into the caller's.

Only unary-unary methods go this way; streams (the object store's ``Put``
and ``Get``) stay on gRPC. Authentication does not apply: both ends are the
same process, which is what the internal token proves between processes.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import time
from typing import Any

import grpc
from google.protobuf.descriptor import ServiceDescriptor

from services.common.metrics import ServiceMetrics

LOG = logging.getLogger(__name__)


class _LocalAbort(grpc.aio.AioRpcError):
    """What :meth:`LocalContext.abort` raises: told apart from any other
    ``AioRpcError`` that escapes a servicer (a call it made itself failed),
    which the gRPC server would have turned into ``UNKNOWN``."""


def _metadata(pairs: Any) -> grpc.aio.Metadata:
    return grpc.aio.Metadata(*tuple(pairs or ()))


class LocalContext:
    """The part of ``grpc.aio.ServicerContext`` the servicers use: trailing
    metadata and ``abort``."""

    def __init__(self) -> None:
        self._trailing: tuple[tuple[str, str], ...] = ()
        self._code: grpc.StatusCode | None = None

    def set_trailing_metadata(self, metadata: Any) -> None:
        self._trailing = tuple(metadata)

    async def abort(self, code: grpc.StatusCode, details: str = "", trailing_metadata: Any = ()) -> None:
        self._code = code
        raise _LocalAbort(code, _metadata(()), _metadata(trailing_metadata or self._trailing), details)

    def code(self) -> grpc.StatusCode | None:
        return self._code


class LocalServicer:
    """One servicer, its unary methods callable in-process (see the module docstring)."""

    def __init__(self, servicer: Any, service: ServiceDescriptor, *, metrics: ServiceMetrics | None = None) -> None:
        self.servicer = servicer
        self.metrics = metrics
        self.unary = frozenset(m.name for m in service.methods if not m.client_streaming and not m.server_streaming)

    def serves(self, method: str) -> bool:
        return method in self.unary

    async def call(self, method: str, request: Any, *, timeout: float | None = None) -> Any:
        """The reply of ``method``, or the ``grpc.aio.AioRpcError`` a gRPC client would get."""
        handler = getattr(self.servicer, method)
        context = LocalContext()
        started = time.perf_counter()
        code = "OK"
        job = asyncio.create_task(
            self._run(handler, request, context), name=f"local:{method}", context=contextvars.copy_context()
        )
        try:
            if timeout is None:
                return await job
            try:
                async with asyncio.timeout(timeout):
                    return await job
            except TimeoutError:
                raise grpc.aio.AioRpcError(
                    grpc.StatusCode.DEADLINE_EXCEEDED, _metadata(()), _metadata(()), "Deadline Exceeded"
                ) from None
        except grpc.aio.AioRpcError as exc:
            code = exc.code().name
            raise
        finally:
            if self.metrics is not None:
                self.metrics.observe("grpc", method, code, time.perf_counter() - started)

    @staticmethod
    async def _run(handler: Any, request: Any, context: LocalContext) -> Any:
        try:
            return await handler(request, context)
        except _LocalAbort:
            raise
        except Exception as exc:
            # What the gRPC server does with an exception the servicer did not turn into a status.
            LOG.exception("unexpected error in local call %s", getattr(handler, "__name__", handler))
            raise grpc.aio.AioRpcError(
                grpc.StatusCode.UNKNOWN, _metadata(()), _metadata(()), f"Unexpected {type(exc)}: {exc}"
            ) from None
