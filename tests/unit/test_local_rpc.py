"""An in-process call (services/common/local_rpc.py) fails exactly as the same call over gRPC.

One servicer is served by a real gRPC server on 127.0.0.1 and wrapped in a
LocalServicer; each case calls both and compares what the caller gets.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest

from ferrum.v1 import objectstore_pb2 as pb
from ferrum.v1 import objectstore_pb2_grpc as pb_grpc
from services.common import errors
from services.common.endpoints import Endpoints
from services.common.local_rpc import LocalServicer
from services.common.metrics import ServiceMetrics

SERVICE = pb.DESCRIPTOR.services_by_name["ObjectStore"]
caller_var: contextvars.ContextVar[str] = contextvars.ContextVar("caller", default="-")


class Servicer(pb_grpc.ObjectStoreServicer):
    """Two of the object store's methods; the others keep the generated UNIMPLEMENTED ones."""

    def __init__(self) -> None:
        self.cancelled = asyncio.Event()
        self.seen_caller = ""

    async def Stat(self, request: pb.ObjectRef, context: Any) -> pb.ObjectInfo:
        self.seen_caller = caller_var.get()
        caller_var.set("changed by the servicer")
        if request.name == "missing":
            await errors.abort_with(context, errors.ObjectNotFound(f"Object {request.name} not found"))
        if request.name == "boom":
            raise RuntimeError("an internal detail")
        return pb.ObjectInfo(container=request.container, name=request.name, size=7)

    async def TempUrl(self, request: pb.TempUrlRequest, context: Any) -> pb.TempUrlResponse:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            self.cancelled.set()
            raise
        return pb.TempUrlResponse()


def make_servicer() -> Servicer:
    return Servicer()  # type: ignore[abstract]  # the stub calls the generated methods abstract: they answer UNIMPLEMENTED


@pytest.fixture
async def both() -> AsyncIterator[tuple[Servicer, Any, LocalServicer]]:
    servicer = make_servicer()
    server = grpc.aio.server()
    pb_grpc.add_ObjectStoreServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    try:
        yield servicer, pb_grpc.ObjectStoreStub(channel), LocalServicer(servicer, SERVICE)
    finally:
        await channel.close()
        await server.stop(None)


async def outcome(call: Any) -> tuple[Any, ...]:
    """What a caller can see of a call: the reply, or the failure's code, details and error class."""
    try:
        reply = await call
    except grpc.aio.AioRpcError as exc:
        error = errors.from_rpc_error(exc)
        return exc.code(), exc.details(), type(error).__name__, str(error)
    return ("reply", reply)


async def test_replies_and_failures_match_grpc(both: tuple[Servicer, Any, LocalServicer]) -> None:
    _, stub, local = both
    for name in ("present", "missing", "boom"):
        request = pb.ObjectRef(container="c", name=name)
        remote = await outcome(stub.Stat(request, timeout=5))
        here = await outcome(local.call("Stat", request, timeout=5))
        assert here == remote, name
    assert (await outcome(local.call("Stat", pb.ObjectRef(name="missing"))))[2] == "ObjectNotFound"
    unknown = await outcome(local.call("Stat", pb.ObjectRef(name="boom")))
    assert unknown[0] == grpc.StatusCode.UNKNOWN and unknown[2] == "FerrumError"


async def test_deadline_cancels_the_work(both: tuple[Servicer, Any, LocalServicer]) -> None:
    servicer, _, local = both
    got = await outcome(local.call("TempUrl", pb.TempUrlRequest(container="c", name="n"), timeout=0.05))
    assert got[0] == grpc.StatusCode.DEADLINE_EXCEEDED
    assert got[2] == "NoConductorAvailable"  # what from_rpc_error makes of a deadline, as over gRPC
    await asyncio.wait_for(servicer.cancelled.wait(), 5)


async def test_context_is_the_callers_copy(both: tuple[Servicer, Any, LocalServicer]) -> None:
    servicer, _, local = both
    caller_var.set("req-123")
    await local.call("Stat", pb.ObjectRef(container="c", name="present"))
    assert servicer.seen_caller == "req-123"
    assert caller_var.get() == "req-123"  # the servicer's change stayed in its copy


def test_only_unary_methods_and_registered_addresses_are_local() -> None:
    local = LocalServicer(make_servicer(), SERVICE)
    assert local.serves("Stat") and local.serves("PutSmall")
    assert not local.serves("Put") and not local.serves("Get")  # streams stay on gRPC
    endpoints = Endpoints()
    endpoints.servicers["127.0.0.1:5000"] = local
    assert endpoints.local("127.0.0.1:5000", "Stat") is local
    assert endpoints.local("127.0.0.1:5000", "Get") is None
    assert endpoints.local("127.0.0.1:5001", "Stat") is None


async def test_calls_are_counted_in_metrics() -> None:
    metrics = ServiceMetrics("objectstore")
    local = LocalServicer(make_servicer(), SERVICE, metrics=metrics)
    await local.call("Stat", pb.ObjectRef(container="c", name="present"))
    await outcome(local.call("Stat", pb.ObjectRef(container="c", name="missing")))
    counted = {
        (sample.labels["method"], sample.labels["code"]): sample.value
        for family in metrics.registry.collect()
        for sample in family.samples
        if sample.name == "ferrum_requests_total"
    }
    assert counted == {("Stat", "OK"): 1, ("Stat", "NOT_FOUND"): 1}
