"""The native gRPC API: the fake-hardware lifecycle with typed messages,
gRPC status codes for bad input, and WatchNodes delivering every transition
in order, resumable by sequence number."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import grpc
import pytest
from google.protobuf import json_format, struct_pb2

from ferrum.v1 import api_pb2 as pb
from ferrum.v1 import api_pb2_grpc as pb_grpc
from ferrum.v1 import common_pb2 as cpb


@pytest.fixture(scope="module")
async def nodes(stack):
    channel = grpc.aio.insecure_channel(stack.endpoints["api gRPC"])
    yield pb_grpc.NodeServiceStub(channel)
    await channel.close()


def list_value(items: list[dict[str, Any]]) -> struct_pb2.ListValue:
    value = struct_pb2.ListValue()
    for item in items:
        value.add_struct().update(item)
    return value


async def wait_state(nodes, ident: str, state: str) -> cpb.Node:
    for _ in range(400):
        node = await nodes.GetNode(pb.GetNodeRequest(ident=ident))
        if node.provision_state == state and not node.reservation:
            return node
        await asyncio.sleep(0.05)
    raise AssertionError(f"{ident} stuck in {node.provision_state}: {node.last_error}")


async def test_lifecycle_and_watch(nodes) -> None:
    info = struct_pb2.Struct()
    info.update({"bmc_password": "pw", "bmc_address": "10.1.1.1"})
    node = await nodes.CreateNode(pb.CreateNodeRequest(driver="fake-hardware", name="grpc-1", driver_info=info))
    assert node.provision_state == "enroll" and node.interfaces["deploy"] == "fake"
    assert dict(node.driver_info) == {"bmc_password": "******", "bmc_address": "10.1.1.1"}
    watch = nodes.WatchNodes(pb.WatchNodesRequest(after_sequence=-1, node_uuid=node.uuid))
    port = await nodes.CreatePort(pb.CreatePortRequest(node_ident="grpc-1", address="52:54:00:EE:00:01"))
    assert port.address == "52:54:00:ee:00:01" and port.node_uuid == node.uuid
    for verb, state in (("manage", "manageable"), ("provide", "available"), ("active", "active")):
        await nodes.SetProvisionState(pb.SetProvisionStateRequest(ident="grpc-1", target=verb))
        await wait_state(nodes, "grpc-1", state)
    patched = await nodes.PatchNode(
        pb.PatchNodeRequest(
            ident="grpc-1", patch_json=json.dumps([{"op": "add", "path": "/extra/rack", "value": "r7"}])
        )
    )
    assert dict(patched.extra) == {"rack": "r7"}
    await nodes.SetProvisionState(pb.SetProvisionStateRequest(ident="grpc-1", target="deleted"))
    await wait_state(nodes, "grpc-1", "available")

    seen = []
    async for event in watch:
        seen.append(event)
        if event.provision_state == "available" and event.event == "done" and len(seen) > 6:
            break
    watch.cancel()
    sequences = [e.sequence for e in seen]
    assert sequences == sorted(sequences) and len(set(sequences)) == len(sequences)
    # Deploy-step notes ride the same feed; the transitions are the state path.
    path = [e.provision_state for e in seen if e.event not in ("create", "deploy-step")]
    assert any(e.event == "deploy-step" and "deploy.deploy" in e.message for e in seen)
    assert path == [
        "verifying",
        "manageable",
        "cleaning",
        "available",
        "deploying",
        "active",
        "deleting",
        "cleaning",
        "available",
    ], path

    resumed = nodes.WatchNodes(pb.WatchNodesRequest(after_sequence=seen[3].sequence, node_uuid=node.uuid))
    rest = []
    async for event in resumed:
        rest.append(event.sequence)
        if event.sequence == seen[-1].sequence:
            break
    resumed.cancel()
    assert rest == sequences[4:]  # a reconnecting client misses nothing

    await nodes.DeleteNode(pb.DeleteNodeRequest(ident="grpc-1"))
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await nodes.GetNode(pb.GetNodeRequest(ident="grpc-1"))
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND


async def test_bad_input_status_codes(nodes) -> None:
    await nodes.CreateNode(pb.CreateNodeRequest(driver="fake-hardware", name="grpc-err"))
    cases = [
        (
            nodes.CreateNode(pb.CreateNodeRequest(driver="fake-hardware", name="grpc-err")),
            grpc.StatusCode.ALREADY_EXISTS,
        ),
        (nodes.CreateNode(pb.CreateNodeRequest(driver="nope")), grpc.StatusCode.INVALID_ARGUMENT),
        (
            nodes.SetProvisionState(pb.SetProvisionStateRequest(ident="grpc-err", target="active")),
            grpc.StatusCode.FAILED_PRECONDITION,
        ),
        (
            nodes.SetProvisionState(
                pb.SetProvisionStateRequest(ident="grpc-err", target="manage", configdrive_string="abc")
            ),
            grpc.StatusCode.INVALID_ARGUMENT,
        ),
        (
            nodes.PatchNode(pb.PatchNodeRequest(ident="grpc-err", patch_json="not json")),
            grpc.StatusCode.INVALID_ARGUMENT,
        ),
        (nodes.CreatePort(pb.CreatePortRequest(node_ident="grpc-err", address="zz")), grpc.StatusCode.INVALID_ARGUMENT),
        (nodes.GetPort(pb.GetPortRequest(ident="00000000-0000-4000-8000-000000000000")), grpc.StatusCode.NOT_FOUND),
    ]
    for call, code in cases:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await call
        assert caught.value.code() == code, (caught.value.details(), code)
    node = await nodes.GetNode(pb.GetNodeRequest(ident="grpc-err"))
    assert node.provision_state == "enroll"


async def test_newest_rest_features_over_grpc(nodes, stack) -> None:
    """The native API speaks the newest REST semantics: retired (1.61), lessee (1.65),
    network_data (1.66), boot mode fields (1.75), deploy_steps (1.69), disable_ramdisk (1.70)."""
    await nodes.CreateNode(pb.CreateNodeRequest(driver="fake-hardware", name="grpc-new"))
    for verb, state in (("manage", "manageable"), ("provide", "available")):
        await nodes.SetProvisionState(pb.SetProvisionStateRequest(ident="grpc-new", target=verb))
        await wait_state(nodes, "grpc-new", state)
    with pytest.raises(grpc.aio.AioRpcError) as caught:  # an available node is moved to manageable first
        await nodes.PatchNode(
            pb.PatchNodeRequest(
                ident="grpc-new", patch_json=json.dumps([{"op": "replace", "path": "/retired", "value": True}])
            )
        )
    assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION

    # A config drive that does not decode (truncated gzip) is refused as over REST, and changes nothing.
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await nodes.SetProvisionState(
            pb.SetProvisionStateRequest(ident="grpc-new", target="active", configdrive_string="H4sIAAAA")
        )
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT, caught.value.details()
    assert "configdrive" in str(caught.value.details()).lower(), caught.value.details()
    unchanged = await nodes.GetNode(pb.GetNodeRequest(ident="grpc-new"))
    assert unchanged.provision_state == "available" and not unchanged.reservation
    assert "configdrive" not in json_format.MessageToDict(unchanged.instance_info)

    steps = list_value([{"interface": "deploy", "step": "fake_step", "args": {"delay": 0}, "priority": 150}])
    await nodes.SetProvisionState(pb.SetProvisionStateRequest(ident="grpc-new", target="active", deploy_steps=steps))
    node = await wait_state(nodes, "grpc-new", "active")
    ran = [s["step"] for s in json_format.MessageToDict(node.driver_internal_info)["deploy_steps"]]
    assert ran == ["fake_step", "deploy"]

    network = {"links": [], "networks": [], "services": [{"type": "dns", "address": "192.0.2.53"}]}
    patched = await nodes.PatchNode(
        pb.PatchNodeRequest(
            ident="grpc-new",
            patch_json=json.dumps(
                [
                    {"op": "replace", "path": "/lessee", "value": "project-b"},
                    {"op": "replace", "path": "/network_data", "value": network},
                ]
            ),
        )
    )
    assert patched.lessee == "project-b" and patched.network_data["services"][0]["address"] == "192.0.2.53"
    assert not patched.retired and patched.boot_mode == "" and not patched.secure_boot_set

    for bad in (
        pb.SetProvisionStateRequest(ident="grpc-new", target="deleted", deploy_steps=steps),  # active/rebuild only
        pb.SetProvisionStateRequest(ident="grpc-new", target="deleted", disable_ramdisk=True),  # manual clean only
    ):
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await nodes.SetProvisionState(bad)
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT, caught.value.details()
    await nodes.SetProvisionState(pb.SetProvisionStateRequest(ident="grpc-new", target="deleted"))
    await wait_state(nodes, "grpc-new", "available")
    await nodes.SetProvisionState(pb.SetProvisionStateRequest(ident="grpc-new", target="manage"))
    await wait_state(nodes, "grpc-new", "manageable")
    # A step the conductor's Step message cannot carry (not an object, a key clean steps do not take) is
    # refused by the api with the step named, before any conductor sees it.
    bad_cases: list[list[Any]] = [["erase"], [{"interface": "deploy", "step": "erase_devices_metadata", "priority": 5}]]
    for bad_steps in bad_cases:
        listed = struct_pb2.ListValue()
        listed.extend(bad_steps)
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await nodes.SetProvisionState(
                pb.SetProvisionStateRequest(ident="grpc-new", target="clean", clean_steps=listed)
            )
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT, caught.value.details()
        assert "Invalid clean step 1" in (caught.value.details() or "")
    # A step for child nodes naming a node that does not exist: NOT_FOUND, as REST's 404.
    nobody = "9a1c7c9e-8d1e-4a4e-9d53-0c0c2b7f7f01"
    for_children = {"execute_on_child_nodes": True, "limit_child_node_execution": [nobody]}
    missing = list_value([{"interface": "deploy", "step": "erase_devices_metadata", **for_children}])
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await nodes.SetProvisionState(
            pb.SetProvisionStateRequest(ident="grpc-new", target="clean", clean_steps=missing)
        )
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND and nobody in (caught.value.details() or "")
    assert (await nodes.GetNode(pb.GetNodeRequest(ident="grpc-new"))).provision_state == "manageable"
    clean_steps = list_value([{"interface": "deploy", "step": "erase_devices_metadata"}])
    await nodes.SetProvisionState(
        pb.SetProvisionStateRequest(ident="grpc-new", target="clean", clean_steps=clean_steps, disable_ramdisk=True)
    )
    cleaned = await wait_state(nodes, "grpc-new", "manageable")
    assert cleaned.last_error == ""
    retired = await nodes.PatchNode(
        pb.PatchNodeRequest(
            ident="grpc-new",
            patch_json=json.dumps(
                [
                    {"op": "replace", "path": "/retired", "value": True},
                    {"op": "replace", "path": "/retired_reason", "value": "end of lease"},
                ]
            ),
        )
    )
    assert retired.retired and retired.retired_reason == "end of lease"
    # Shards (1.82) and child nodes (1.83) over the native API.
    parent = await nodes.CreateNode(pb.CreateNodeRequest(driver="fake-hardware", name="grpc-parent"))
    child = await nodes.PatchNode(
        pb.PatchNodeRequest(
            ident="grpc-new",
            patch_json=json.dumps(
                [
                    {"op": "add", "path": "/shard", "value": "rack-7"},
                    {"op": "add", "path": "/parent_node", "value": "grpc-parent"},
                ]
            ),
        )
    )
    assert child.shard == "rack-7" and child.parent_node == parent.uuid and not child.console_enabled


async def test_volume_calls_are_unimplemented(nodes) -> None:
    """api.proto declares them; until they are served the status says so, not UNKNOWN."""
    for call, request in (
        (nodes.CreateVolumeConnector, pb.CreateVolumeConnectorRequest()),
        (nodes.CreateVolumeTarget, pb.CreateVolumeTargetRequest()),
    ):
        with pytest.raises(grpc.aio.AioRpcError) as failure:
            await call(request)
        assert failure.value.code() == grpc.StatusCode.UNIMPLEMENTED
        assert "served over REST only" in (failure.value.details() or "")
