"""Nobody calls a Ferrum gRPC service without credentials (issue 16, item 2).

The internal services (conductor, object store, renderer) refuse every call
without the internal token, including the conductor's LookupToken (which
hands out agent tokens) and the object store's List/Get/TempUrl (config
drives with user data); the public NodeService takes the same credentials as
REST under ``http_basic``. Health checks stay open; reflection does not.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import bcrypt
import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from ferrum.v1 import (
    api_pb2,
    api_pb2_grpc,
    conductor_pb2,
    conductor_pb2_grpc,
    objectstore_pb2,
    objectstore_pb2_grpc,
    renderer_pb2,
    renderer_pb2_grpc,
)
from services.common.grpc_auth import basic_auth_metadata, internal_token_metadata
from services.common.internal_token import internal_token
from services.runtime import ALL_SERVICES_ORDER, RunningStack
from tests.conftest import test_settings


@pytest.fixture(scope="module")
async def stack(database_url: str, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[RunningStack]:
    state = tmp_path_factory.mktemp("grpc-auth")
    htpasswd = state / "htpasswd"
    htpasswd.write_text("admin:" + bcrypt.hashpw(b"s3cret", bcrypt.gensalt(rounds=4)).decode() + "\n")
    settings = test_settings(database_url, state, api={"auth_strategy": "http_basic", "htpasswd_file": str(htpasswd)})
    running = RunningStack()
    await running.start(settings, list(ALL_SERVICES_ORDER))
    try:
        yield running
    finally:
        await running.close()


def channel(address: str, interceptors: list[Any] | None = None) -> grpc.aio.Channel:
    return grpc.aio.insecure_channel(address, interceptors=interceptors or [])


async def refused(call: Any) -> str:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call
    assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED, (caught.value.code(), caught.value.details())
    return caught.value.details() or ""


def internal_calls(stack: RunningStack) -> list[tuple[str, Any]]:
    """(address, a function of a channel that makes one call) for every internal service."""
    e = stack.endpoints
    return [
        (
            e["conductor gRPC"],
            lambda ch: conductor_pb2_grpc.ConductorServiceStub(ch).LookupToken(conductor_pb2.NodeRef(node_uuid="x")),
        ),
        (
            e["conductor gRPC"],
            lambda ch: conductor_pb2_grpc.ConductorServiceStub(ch).DestroyNode(conductor_pb2.NodeRef(node_uuid="x")),
        ),
        (
            e["objectstore gRPC"],
            lambda ch: objectstore_pb2_grpc.ObjectStoreStub(ch).List(objectstore_pb2.ListObjectsRequest()),
        ),
        (
            e["objectstore gRPC"],
            lambda ch: objectstore_pb2_grpc.ObjectStoreStub(ch).TempUrl(
                objectstore_pb2.TempUrlRequest(container="c", name="n")
            ),
        ),
        (
            e["objectstore gRPC"],
            lambda ch: _first(
                objectstore_pb2_grpc.ObjectStoreStub(ch).Get(objectstore_pb2.GetObjectRequest(container="c", name="n"))
            ),
        ),
        (
            e["ipxe gRPC"],
            lambda ch: renderer_pb2_grpc.BootScriptRendererStub(ch).RenderBootScript(
                renderer_pb2.RenderBootScriptRequest(mac="52:54:00:00:00:01")
            ),
        ),
    ]


async def _first(stream: Any) -> Any:
    async for item in stream:
        return item
    return None


async def test_internal_services_refuse_calls_without_the_token(stack: RunningStack) -> None:
    for address, call in internal_calls(stack):
        async with channel(address) as ch:
            assert "internal token" in await refused(call(ch))
        async with channel(address, internal_token_metadata("not-the-token-" * 3)) as ch:
            await refused(call(ch))


async def test_internal_services_answer_with_the_token(stack: RunningStack) -> None:
    token = await internal_token(stack.settings, stack.pool)  # type: ignore[arg-type]
    for address, call in internal_calls(stack):
        async with channel(address, internal_token_metadata(token)) as ch:
            try:
                await call(ch)
            except grpc.aio.AioRpcError as exc:  # past authentication: the service's own answer
                assert exc.code() in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.INVALID_ARGUMENT), exc


async def test_health_is_open_and_reflection_is_not(stack: RunningStack) -> None:
    for label in ("conductor gRPC", "objectstore gRPC", "ipxe gRPC", "api gRPC"):
        async with channel(stack.endpoints[label]) as ch:
            # types-grpcio-health-checking/-reflection declare these stubs without their
            # methods and for sync channels only.
            health = health_pb2_grpc.HealthStub(ch)
            reply = await health.Check(health_pb2.HealthCheckRequest(), timeout=5)  # type: ignore[attr-defined]
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
            requests = iter([reflection_pb2.ServerReflectionRequest(list_services="")])
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                reflection = reflection_pb2_grpc.ServerReflectionStub(ch)  # type: ignore[arg-type]
                async for _ in reflection.ServerReflectionInfo(requests):  # type: ignore[operator]
                    pass
            assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED, label


async def test_node_service_takes_the_rest_credentials(stack: RunningStack, tmp_path: Path) -> None:
    address = stack.endpoints["api gRPC"]
    create = api_pb2.CreateNodeRequest(driver="fake-hardware", name="grpc-auth-node")
    async with channel(address) as ch:
        await refused(api_pb2_grpc.NodeServiceStub(ch).CreateNode(create))
    async with channel(address, basic_auth_metadata("admin", "wrong")) as ch:
        assert "Invalid credentials" in await refused(api_pb2_grpc.NodeServiceStub(ch).CreateNode(create))
    async with channel(address, basic_auth_metadata("nobody", "s3cret")) as ch:
        await refused(api_pb2_grpc.NodeServiceStub(ch).ListNodes(api_pb2.ListNodesRequest()))
    assert stack.pool is not None
    assert not await stack.pool.fetchval("SELECT count(*) FROM nodes WHERE name = 'grpc-auth-node'")
    async with channel(address, basic_auth_metadata("admin", "s3cret")) as ch:
        node = await api_pb2_grpc.NodeServiceStub(ch).CreateNode(create)
        assert node.name == "grpc-auth-node"
        listed = await api_pb2_grpc.NodeServiceStub(ch).ListNodes(api_pb2.ListNodesRequest())
        assert "grpc-auth-node" in [n.name for n in listed.nodes]
