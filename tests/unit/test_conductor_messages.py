"""The typed conductor messages carry what the REST side received, and refuse
what would not fit, before anything reaches a conductor."""

from __future__ import annotations

from typing import Any

import pytest

from ferrum.v1 import conductor_pb2 as pb
from services.api.provision_params import CLEAN_STEP_KEYS, SERVICE_STEP_KEYS, check_clean_steps, check_service_steps
from services.common import errors
from services.common.conductor_messages import (
    STEP_KEYS,
    deploy_progress_dict,
    deploy_progress_message,
    indicators_message,
    step_dicts,
    step_messages,
    vendor_method_message,
    vendor_methods_body,
    virtual_media_list,
    virtual_media_reply,
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


def _over_the_wire(kind: str, steps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """What the conductor reads after the api sent ``steps`` (serialized as on the wire)."""
    sent = pb.ProvisionActionRequest()
    getattr(sent, f"{kind}_steps").extend(step_messages(kind, steps))
    received = pb.ProvisionActionRequest.FromString(sent.SerializeToString())
    return step_dicts(getattr(received, f"{kind}_steps"))


STEP_CASES: dict[str, tuple[str, list[dict[str, Any]]]] = {
    "clean-bare": ("clean", [{"interface": "deploy", "step": "erase_devices_metadata"}]),
    "clean-nested-args": (
        "clean",
        [
            {
                "interface": "bios",
                "step": "apply_configuration",
                "args": {
                    "settings": [{"name": "ProcTurboMode", "value": "Disabled"}, {"name": "N", "value": None}],
                    "big": 2**70,
                    "whole": 1,
                    "float": 1.0,
                    "text": 'caf\u00e9 "quoted" {not: json}',
                    "deep": {"a": {"b": {"c": [1, [2, [3]], {}]}}},
                },
                "order": 0,
            }
        ],
    ),
    "clean-empty-args": ("clean", [{"interface": "deploy", "step": "erase_devices", "args": {}}]),
    "deploy-priority-0": ("deploy", [{"interface": "deploy", "step": "x", "args": {}, "priority": 0}]),
    "deploy-priority-max": ("deploy", [{"interface": "raid", "step": "y", "args": {"n": 1}, "priority": 2**31 - 1}]),
    "deploy-no-priority": ("deploy", [{"interface": "deploy", "step": "x", "args": {}}]),
    "service-order-kinds": (
        "service",
        [
            {"interface": "bios", "step": "a", "order": 3},
            {"interface": "bios", "step": "b", "order": "3"},
            {"interface": "bios", "step": "c", "order": "007"},
            {"interface": "bios", "step": "d", "order": 2**64 - 1},
        ],
    ),
    "clean-children": (
        "clean",
        [{"interface": "power", "step": "p", "execute_on_child_nodes": True, "limit_child_node_execution": ["c1"]}],
    ),
    "service-children": (
        "service",
        [
            {"interface": "power", "step": "p", "execute_on_child_nodes": False, "limit_child_node_execution": []},
            {"interface": "power", "step": "q", "execute_on_child_nodes": True, "limit_child_node_execution": ["c1"]},
            {"interface": "power", "step": "r"},
        ],
    ),
}


@pytest.mark.parametrize("case", sorted(STEP_CASES))
def test_steps_cross_the_wire_unchanged(case: str) -> None:
    """Key presence, integer vs digit-string order, priority 0 vs none, nested args
    with big integers and 1 vs 1.0: the conductor reads exactly what the api sent."""
    kind, steps = STEP_CASES[case]
    received = _over_the_wire(kind, steps)
    assert received == steps
    # == treats 1 and 1.0 alike; the JSON text does not.
    assert [repr(s) for s in received] == [repr(s) for s in steps]


def test_no_steps_is_an_empty_list() -> None:
    assert _over_the_wire("clean", []) == []
    assert step_messages("service", None) == []


@pytest.mark.parametrize(
    ("kind", "bad"),
    [
        ("clean", "not a step"),
        ("clean", {"interface": "deploy", "step": "x", "priority": 1}),  # clean steps take no priority
        ("deploy", {"interface": "deploy", "step": "x", "order": 1}),
        ("clean", {"interface": 1, "step": "x"}),
        ("clean", {"interface": "deploy"}),
        ("clean", {"interface": "deploy", "step": "x", "args": []}),
        ("clean", {"interface": "deploy", "step": "x", "order": -1}),
        ("clean", {"interface": "deploy", "step": "x", "order": "\u00b2"}),
        ("clean", {"interface": "deploy", "step": "x", "order": 2**64}),
        ("clean", {"interface": "deploy", "step": "x", "order": True}),
        ("deploy", {"interface": "deploy", "step": "x", "priority": 2**31}),
        ("deploy", {"interface": "deploy", "step": "x", "priority": False}),
        ("service", {"interface": "power", "step": "x", "execute_on_child_nodes": "yes"}),
        ("service", {"interface": "power", "step": "x", "limit_child_node_execution": "node-1"}),
        ("service", {"interface": "power", "step": "x", "limit_child_node_execution": [1]}),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_steps_the_message_cannot_carry_are_a_400(kind: str, bad: object) -> None:
    with pytest.raises(errors.InvalidParameterValue, match=f"Invalid {kind} step 1"):
        step_messages(kind, [bad])


def test_rest_checks_accept_exactly_what_the_message_carries() -> None:
    """A key REST accepts but the message lacked would be refused (never dropped)
    after the api had checked it; these sets must agree."""
    assert STEP_KEYS["service"] == SERVICE_STEP_KEYS
    assert STEP_KEYS["clean"] == CLEAN_STEP_KEYS == SERVICE_STEP_KEYS


@pytest.mark.parametrize(
    "step",
    [
        {"interface": "deploy", "step": "x", "order": -1},
        {"interface": "deploy", "step": "x", "order": "first"},
        {"interface": "deploy", "step": "x", "order": [1]},
    ],
)
def test_clean_step_order_is_checked_as_ironics_schema(step: dict[str, object]) -> None:
    with pytest.raises(errors.InvalidParameterValue, match="Invalid clean step"):
        check_clean_steps([step], "clean")


@pytest.mark.parametrize(
    "step",
    [
        {"interface": "power", "step": "x", "execute_on_child_nodes": "yes"},
        {"interface": "power", "step": "x", "limit_child_node_execution": "node-1"},
        {"interface": "power", "step": "x", "order": "\u00b2"},
    ],
)
def test_service_step_child_keys_are_checked(step: dict[str, object]) -> None:
    with pytest.raises(errors.InvalidParameterValue, match="Invalid service_steps"):
        check_service_steps([step], "service")


@pytest.mark.parametrize(
    "step",
    [
        {"interface": "power", "step": "x", "execute_on_child_nodes": 1},
        {"interface": "power", "step": "x", "limit_child_node_execution": "node-1"},
        {"interface": "power", "step": "x", "execute_on_child_nodes": True, "limit_child_node_execution": ["c1"]},
    ],
)
def test_child_keys_are_checked_on_clean_and_service_steps(step: dict[str, object]) -> None:
    """As Ironic's step schema: a boolean, and with it true a list of node UUIDs."""
    with pytest.raises(errors.InvalidParameterValue, match="Invalid clean step"):
        check_clean_steps([step], "clean")
    with pytest.raises(errors.InvalidParameterValue, match="Invalid service_steps"):
        check_service_steps([step], "service")


def test_virtual_media_slots_keep_their_shape() -> None:
    """Redfish slots have an id, the fake's none; an empty slot's image is null."""
    slots: list[dict[str, Any]] = [
        {"id": "Cd", "media_types": ["CD", "DVD"], "image": "http://h/boot.iso", "inserted": True},
        {"id": "Floppy", "media_types": ["Floppy"], "image": None, "inserted": False},
    ]
    fake: list[dict[str, Any]] = [{"media_types": ["cdrom"], "image": None, "inserted": False}]
    for sent in (slots, fake, []):
        reply = pb.VirtualMediaReply.FromString(virtual_media_reply(sent).SerializeToString())
        assert virtual_media_list(reply) == sent
        assert [list(s) for s in virtual_media_list(reply)] == [list(s) for s in sent]  # key order too
