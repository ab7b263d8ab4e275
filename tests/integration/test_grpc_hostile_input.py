"""Every NodeService method against a table of hostile inputs (issue 16 #8, #9):
NUL characters, NaN and Infinity, huge strings, bad UUIDs and deep nesting
give INVALID_ARGUMENT or NOT_FOUND, never UNKNOWN or INTERNAL, and their
details never show asyncpg, a traceback or an exception class name. Nothing
is changed by a refused call."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

import grpc
import pytest
from google.protobuf import json_format, struct_pb2

from ferrum.v1 import api_pb2 as pb
from ferrum.v1 import api_pb2_grpc as pb_grpc

LEAK = re.compile(r"asyncpg|Traceback|<class |\b[A-Z][a-z]+(?:[A-Z][a-z0-9]*)*(?:Error|Exception)\b|File \"")
NUL = "bad\x00value"
HUGE = "h" * 3_000_000
BAD_UUIDS = ("not-a-uuid", "00000000-0000-0000-0000-00000000000g", "' OR 1=1 --", "../../etc/passwd")
INVALID, NOT_FOUND = grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND
TARGET = "hostile-target"
ABSENT = "00000000-0000-0000-0000-000000000000"


def struct(value: dict[str, Any]) -> struct_pb2.Struct:
    message = struct_pb2.Struct()
    message.update(value)
    return message


def nested(depth: int) -> dict[str, Any]:
    value: dict[str, Any] = {"leaf": 1}
    for _ in range(depth - 1):
        value = {"n": value}
    return value


def listvalue(items: list[Any]) -> struct_pb2.ListValue:
    message = struct_pb2.ListValue()
    message.extend(items)
    return message


def factory(message: Any, **fields: Any) -> Callable[[], Any]:
    """Makes the request when the case runs (each case gets a fresh message)."""
    return lambda: message(**fields)


def cases() -> list[tuple[str, str, Callable[[], Any], set[grpc.StatusCode]]]:
    """(method, what, request factory, acceptable codes)."""
    both = {INVALID, NOT_FOUND}
    table: list[tuple[str, str, Callable[[], Any], set[grpc.StatusCode]]] = []
    for field in ("driver_info", "properties", "instance_info", "extra"):
        for number in ("nan", "inf", "-inf"):
            table.append(
                (
                    "CreateNode",
                    f"{field} {number}",
                    factory(
                        pb.CreateNodeRequest, driver="fake-hardware", **{field: struct({"x": {"y": [float(number)]}})}
                    ),
                    {INVALID},
                )
            )
        table.append(
            (
                "CreateNode",
                f"{field} nested 30",
                factory(pb.CreateNodeRequest, driver="fake-hardware", **{field: struct(nested(30))}),
                {INVALID},
            )
        )
        table.append(
            (
                "CreateNode",
                f"{field} NUL key",
                factory(pb.CreateNodeRequest, driver="fake-hardware", **{field: struct({NUL: 1})}),
                {INVALID},
            )
        )
    for key in ("driver", "name", "uuid", "resource_class", "conductor_group", "owner", "description"):
        for what, value in (("NUL", NUL), ("huge", HUGE)):
            table.append(
                (
                    "CreateNode",
                    f"{key} {what}",
                    factory(pb.CreateNodeRequest, **{"driver": "fake-hardware", key: value}),
                    {INVALID},
                )
            )
    table += [
        (
            "CreateNode",
            "interface NUL",
            lambda: pb.CreateNodeRequest(driver="fake-hardware", interfaces={"boot": NUL}),
            {INVALID},
        ),
        (
            "CreateNode",
            "interface kind NUL",
            lambda: pb.CreateNodeRequest(driver="fake-hardware", interfaces={NUL: "fake"}),
            {INVALID},
        ),
        ("CreateNode", "bad uuid", lambda: pb.CreateNodeRequest(driver="fake-hardware", uuid="not-a-uuid"), {INVALID}),
    ]
    idents = [NUL, HUGE, *BAD_UUIDS, ABSENT]
    for ident in idents:
        label = "NUL" if ident == NUL else "huge" if ident == HUGE else ident
        table += [
            ("GetNode", label, factory(pb.GetNodeRequest, ident=ident), both),
            ("DeleteNode", label, factory(pb.DeleteNodeRequest, ident=ident), both),
            ("PatchNode", label, factory(pb.PatchNodeRequest, ident=ident, patch_json="[]"), both),
            ("SetProvisionState", label, factory(pb.SetProvisionStateRequest, ident=ident, target="manage"), both),
            ("SetPowerState", label, factory(pb.SetPowerStateRequest, ident=ident, target="power on"), both),
            ("SetMaintenance", label, factory(pb.SetMaintenanceRequest, ident=ident, maintenance=True), both),
            (
                "CreatePort",
                label,
                factory(pb.CreatePortRequest, node_ident=ident, address="52:54:00:12:34:56"),
                both,
            ),
            ("GetPort", label, factory(pb.GetPortRequest, ident=ident), both),
            ("DeletePort", label, factory(pb.DeletePortRequest, ident=ident), both),
            ("ListPorts", label, factory(pb.ListPortsRequest, node_ident=ident), both),
            ("ListNodes", f"marker {label}", factory(pb.ListNodesRequest, marker=ident), both),
            ("ListPorts", f"marker {label}", factory(pb.ListPortsRequest, marker=ident), both),
        ]
        if ident != ABSENT:  # watching a node that does not exist (yet) is allowed: nothing comes
            table.append(("WatchNodes", label, factory(pb.WatchNodesRequest, node_uuid=ident), {INVALID}))
    for key in ("provision_state", "driver", "sort_key", "sort_dir", "conductor_group", "owner"):
        for what, value in (("NUL", NUL), ("huge", HUGE)):
            table.append(("ListNodes", f"{key} {what}", factory(pb.ListNodesRequest, **{key: value}), {INVALID}))
    table.append(("ListNodes", "limit -5", lambda: pb.ListNodesRequest(limit=-5), {INVALID}))
    table.append(("ListPorts", "limit -5", lambda: pb.ListPortsRequest(limit=-5), {INVALID}))
    table.append(("ListPorts", "address NUL", lambda: pb.ListPortsRequest(address=NUL), {INVALID}))
    patches = {
        "deep": "[" * 100_000,
        "deep object": '{"a":' * 100_000,
        "NaN": json.dumps([{"op": "add", "path": "/properties/x", "value": 1}]).replace("1", "NaN"),
        "Infinity": '[{"op": "add", "path": "/extra/x", "value": Infinity}]',
        "NUL escaped": json.dumps([{"op": "add", "path": "/extra/x", "value": NUL}]),
        "NUL in path": json.dumps([{"op": "add", "path": "/extra/" + NUL, "value": 1}]),
        "NUL raw": '[{"op": "add", "path": "/extra/x", "value": "a\x00"}]',
        "not json": "[{",
        "nested 30": json.dumps([{"op": "add", "path": "/extra/x", "value": nested(30)}]),
        "huge name": json.dumps([{"op": "replace", "path": "/name", "value": HUGE}]),
        "bad instance_uuid": json.dumps([{"op": "replace", "path": "/instance_uuid", "value": "nope"}]),
        "huge description": json.dumps([{"op": "replace", "path": "/description", "value": HUGE}]),
        "NUL owner": json.dumps([{"op": "replace", "path": "/owner", "value": NUL}]),
    }
    for what, text in patches.items():
        table.append(("PatchNode", what, factory(pb.PatchNodeRequest, ident=TARGET, patch_json=text), {INVALID}))
    table += [
        ("SetProvisionState", "target NUL", lambda: pb.SetProvisionStateRequest(ident=TARGET, target=NUL), {INVALID}),
        ("SetProvisionState", "target huge", lambda: pb.SetProvisionStateRequest(ident=TARGET, target=HUGE), {INVALID}),
        (
            "SetProvisionState",
            "configdrive NaN",
            lambda: pb.SetProvisionStateRequest(
                ident=TARGET, target="active", configdrive_dict=struct({"meta_data": {"x": float("nan")}})
            ),
            {INVALID},
        ),
        (
            "SetProvisionState",
            "configdrive NUL",
            lambda: pb.SetProvisionStateRequest(ident=TARGET, target="active", configdrive_string=NUL),
            {INVALID},
        ),
        (
            "SetProvisionState",
            "clean steps Infinity",
            lambda: pb.SetProvisionStateRequest(
                ident=TARGET, target="clean", clean_steps=listvalue([{"interface": "deploy", "x": float("inf")}])
            ),
            {INVALID},
        ),
        (
            "SetProvisionState",
            "deploy steps nested 30",
            lambda: pb.SetProvisionStateRequest(ident=TARGET, target="active", deploy_steps=listvalue([nested(30)])),
            {INVALID},
        ),
        (
            "SetProvisionState",
            "rescue password NUL",
            lambda: pb.SetProvisionStateRequest(ident=TARGET, target="rescue", rescue_password=NUL),
            {INVALID},
        ),
        ("SetPowerState", "target NUL", lambda: pb.SetPowerStateRequest(ident=TARGET, target=NUL), {INVALID}),
        (
            "SetPowerState",
            "timeout -1",
            lambda: pb.SetPowerStateRequest(ident=TARGET, target="power on", timeout=-1),
            {INVALID},
        ),
        (
            "SetMaintenance",
            "reason NUL",
            lambda: pb.SetMaintenanceRequest(ident=TARGET, maintenance=True, reason=NUL),
            {INVALID},
        ),
        (
            "SetMaintenance",
            "reason huge",
            lambda: pb.SetMaintenanceRequest(ident=TARGET, maintenance=True, reason=HUGE),
            {INVALID},
        ),
        ("CreatePort", "address NUL", lambda: pb.CreatePortRequest(node_ident=TARGET, address=NUL), {INVALID}),
        ("CreatePort", "address huge", lambda: pb.CreatePortRequest(node_ident=TARGET, address=HUGE), {INVALID}),
        (
            "CreatePort",
            "name NUL",
            lambda: pb.CreatePortRequest(node_ident=TARGET, address="52:54:00:12:34:57", name=NUL),
            {INVALID},
        ),
        (
            "CreatePort",
            "name huge",
            lambda: pb.CreatePortRequest(node_ident=TARGET, address="52:54:00:12:34:58", name=HUGE),
            {INVALID},
        ),
        (
            "CreatePort",
            "extra NaN",
            lambda: pb.CreatePortRequest(
                node_ident=TARGET, address="52:54:00:12:34:59", extra=struct({"x": float("nan")})
            ),
            {INVALID},
        ),
        (
            "CreatePort",
            "extra nested 30",
            lambda: pb.CreatePortRequest(node_ident=TARGET, address="52:54:00:12:34:5a", extra=struct(nested(30))),
            {INVALID},
        ),
        ("WatchNodes", "negative sequence", lambda: pb.WatchNodesRequest(node_uuid=NUL, after_sequence=-7), {INVALID}),
    ]
    return table


CASES = cases()


@pytest.fixture(scope="module")
async def channel(stack: Any):
    channel = grpc.aio.insecure_channel(
        stack.endpoints["api gRPC"], options=[("grpc.max_send_message_length", 64 * 1024 * 1024)]
    )
    yield channel
    await channel.close()


@pytest.fixture(scope="module")
async def nodes(channel: grpc.aio.Channel):
    stub = pb_grpc.NodeServiceStub(channel)
    await stub.CreateNode(pb.CreateNodeRequest(driver="fake-hardware", name=TARGET))
    return stub


async def call(nodes: Any, method: str, request: Any) -> Any:
    if method == "WatchNodes":
        stream = nodes.WatchNodes(request)
        try:
            return await stream.read()
        finally:
            stream.cancel()
    return await getattr(nodes, method)(request, timeout=30)


def test_the_table_covers_every_method() -> None:
    methods = {m.name for m in pb.DESCRIPTOR.services_by_name["NodeService"].methods}
    implemented = methods - {"CreateVolumeConnector", "CreateVolumeTarget"}  # not served yet: UNIMPLEMENTED
    assert {case[0] for case in CASES} == implemented


@pytest.mark.parametrize(("method", "what", "make", "codes"), CASES, ids=[f"{c[0]}-{c[1]}" for c in CASES])
async def test_hostile_input(nodes: Any, method: str, what: str, make: Callable[[], Any], codes: set[Any]) -> None:
    before = await nodes.GetNode(pb.GetNodeRequest(ident=TARGET))
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call(nodes, method, make())
    error = caught.value
    details = error.details() or ""
    assert error.code() in codes, (error.code(), details[:300])
    assert not LEAK.search(details), details[:500]
    assert len(details) <= 2048, len(details)
    after = await nodes.GetNode(pb.GetNodeRequest(ident=TARGET))
    assert after.updated_at == before.updated_at and after.name == TARGET
    listed = await nodes.ListNodes(pb.ListNodesRequest())
    assert [n.name for n in listed.nodes] == [TARGET]  # no node was created
    ports = await nodes.ListPorts(pb.ListPortsRequest())
    assert list(ports.ports) == []


@pytest.mark.parametrize("method", ["CreateVolumeConnector", "CreateVolumeTarget"])
async def test_unserved_methods_say_so(nodes: Any, method: str) -> None:
    request = getattr(pb, f"{method}Request")(node_ident=NUL)
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await getattr(nodes, method)(request)
    assert caught.value.code() == grpc.StatusCode.UNIMPLEMENTED


def nested_struct_bytes(depth: int) -> bytes:
    """A Struct nested ``depth`` levels as wire bytes, built by hand: protobuf's
    own encoder refuses to build one past its recursion limit."""

    def length_delimited(number: int, payload: bytes) -> bytes:
        size, varint = len(payload), b""
        while True:
            byte, size = size & 0x7F, size >> 7
            varint += bytes([byte | (0x80 if size else 0)])
            if not size:
                return bytes([number << 3 | 2]) + varint + payload

    struct_bytes = b""
    for _ in range(depth):
        value = length_delimited(5, struct_bytes)  # Value.struct_value
        entry = length_delimited(1, b"n") + length_delimited(2, value)  # map entry: key, value
        struct_bytes = length_delimited(1, entry)  # Struct.fields
    return struct_bytes


def test_the_hand_built_bytes_are_a_struct() -> None:
    parsed = struct_pb2.Struct.FromString(nested_struct_bytes(3))
    assert json_format.MessageToDict(parsed) == {"n": {"n": {"n": {}}}}


@pytest.mark.parametrize("depth", [34, 60, 5000])
async def test_nesting_beyond_protobufs_own_limit(nodes: Any, channel: grpc.aio.Channel, depth: int) -> None:
    """A Struct nested past protobuf's recursion limit (100 messages, 33 JSON levels)
    cannot even be parsed by the server: still INVALID_ARGUMENT, never UNKNOWN or
    INTERNAL, and no node is made."""
    raw = (
        pb.CreateNodeRequest(driver="fake-hardware").SerializeToString()
        + bytes([8 << 3 | 2])  # CreateNodeRequest.extra
        + _varint(len(nested_struct_bytes(depth)))
        + nested_struct_bytes(depth)
    )
    create = channel.unary_unary(
        "/ferrum.v1.NodeService/CreateNode",
        request_serializer=lambda payload: payload,
        response_deserializer=lambda payload: payload,
    )
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await create(raw, timeout=30)
    assert caught.value.code() == INVALID, (caught.value.code(), caught.value.details())
    assert not LEAK.search(caught.value.details() or "")
    listed = await nodes.ListNodes(pb.ListNodesRequest())
    assert [n.name for n in listed.nodes] == [TARGET]


def _varint(size: int) -> bytes:
    out = b""
    while True:
        byte, size = size & 0x7F, size >> 7
        out += bytes([byte | (0x80 if size else 0)])
        if not size:
            return out
