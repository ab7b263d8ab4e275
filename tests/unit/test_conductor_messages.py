"""The typed conductor messages carry what the REST side received, and refuse
what would not fit, before anything reaches a conductor."""

from __future__ import annotations

import pytest

from ferrum.v1 import conductor_pb2 as pb
from services.common import errors
from services.common.conductor_messages import (
    deploy_progress_dict,
    deploy_progress_message,
    indicators_message,
    vendor_method_message,
    vendor_methods_body,
)


def test_deploy_progress_round_trips_the_agents_object() -> None:
    sent = {
        "image_id": "img",
        "stage": "writing",
        "bytes_written": 3 * 2**40,
        "bytes_downloaded": 7,
        "total": None,
        "download_total": 2**40,
        "method": "qcow2-stream",
        "rate": 1.5,
        "elapsed": 2,
    }
    message = pb.DeployProgress.FromString(deploy_progress_message(sent).SerializeToString())
    assert deploy_progress_dict(message) == {**sent, "elapsed": 2.0}


def test_deploy_progress_defaults_for_a_partial_object() -> None:
    got = deploy_progress_dict(deploy_progress_message({"bytes_written": 10}))
    assert got["bytes_written"] == 10
    assert got["total"] is None and got["stage"] == ""


@pytest.mark.parametrize(
    "bad",
    [
        {"bytes_written": "10"},
        {"bytes_written": True},
        {"bytes_written": -1},
        {"bytes_written": 2**64},
        {"total": 1.5},
        {"rate": "fast"},
        {"stage": 3},
        {"unknown": 1},
    ],
)
def test_deploy_progress_refuses_wrong_types(bad: dict[str, object]) -> None:
    with pytest.raises(errors.InvalidParameterValue) as caught:
        deploy_progress_message(bad)
    assert "deploy_progress" in str(caught.value)


def test_vendor_methods_keep_ironics_description_shape() -> None:
    description = {
        "http_methods": ["POST", "PUT"],
        "async": True,
        "description": "does a thing",
        "attach": False,
        "require_exclusive_lock": True,
    }
    reply = pb.VendorMethodsReply(
        methods={"b": vendor_method_message(description), "a": vendor_method_message(description)}
    )
    body = vendor_methods_body(pb.VendorMethodsReply.FromString(reply.SerializeToString()))
    assert list(body) == ["a", "b"]
    assert body["a"] == description


def test_indicators_flatten_components() -> None:
    reply = indicators_message(
        {"system": {"led": {"readonly": False, "states": ["ON", "OFF"]}}, "chassis": {"led": {"readonly": True}}}
    )
    assert [(i.component, i.name, i.readonly, list(i.states)) for i in reply.indicators] == [
        ("system", "led", False, ["ON", "OFF"]),
        ("chassis", "led", True, []),
    ]
