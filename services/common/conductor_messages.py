"""Typed conductor.proto messages to and from the plain values both sides use.

The api builds these messages from REST bodies and the conductor reads them back
(or the other way round for replies). Keeping both directions in one module
means a field added to a message is converted in one place, and a REST body
with a wrong type is refused with a 400 here rather than failing inside the
protobuf constructor with an opaque TypeError.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ferrum.v1 import conductor_pb2 as pb
from services.common import errors
from services.common.jsonutil import dumps

_PROGRESS_STRINGS = ("image_id", "stage", "method")
_PROGRESS_INTEGERS = ("bytes_written", "bytes_downloaded")
_PROGRESS_OPTIONAL_INTEGERS = ("total", "download_total")
_PROGRESS_NUMBERS = ("rate", "elapsed")
PROGRESS_FIELDS = frozenset((*_PROGRESS_STRINGS, *_PROGRESS_INTEGERS, *_PROGRESS_OPTIONAL_INTEGERS, *_PROGRESS_NUMBERS))


def _is_integer(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def deploy_progress_message(progress: Mapping[str, Any]) -> pb.DeployProgress:
    """The agent's ``deploy_progress`` heartbeat object as a message; unknown keys
    or wrongly typed values are a 400, since the conductor stores what it gets."""
    unknown = sorted(set(progress) - PROGRESS_FIELDS)
    if unknown:
        raise errors.InvalidParameterValue(f"deploy_progress has unknown fields: {', '.join(unknown)}")
    message = pb.DeployProgress()
    for name, value in progress.items():
        if value is None and name in _PROGRESS_OPTIONAL_INTEGERS:
            continue
        if name in _PROGRESS_STRINGS:
            valid = isinstance(value, str)
        elif name in _PROGRESS_NUMBERS:
            valid = (_is_integer(value) or isinstance(value, float)) and value >= 0
        else:
            valid = _is_integer(value) and 0 <= value < 2**63
        if not valid:
            raise errors.InvalidParameterValue(f"deploy_progress.{name} has an invalid value {value!r}")
        setattr(message, name, value)
    return message


def deploy_progress_dict(message: pb.DeployProgress) -> dict[str, Any]:
    """The stored shape of ``driver_internal_info.deploy_progress`` (what the agent sent)."""
    progress: dict[str, Any] = {name: getattr(message, name) for name in (*_PROGRESS_STRINGS, *_PROGRESS_INTEGERS)}
    for name in _PROGRESS_OPTIONAL_INTEGERS:
        progress[name] = getattr(message, name) if message.HasField(name) else None
    for name in _PROGRESS_NUMBERS:
        progress[name] = getattr(message, name)
    return progress


def vendor_method_message(description: Mapping[str, Any]) -> pb.VendorMethod:
    """A vendor method's description (``MethodSpec.describe()``) as a message."""
    return pb.VendorMethod(
        http_methods=list(description["http_methods"]),
        is_async=bool(description["async"]),
        description=str(description.get("description") or ""),
        attach=bool(description["attach"]),
        require_exclusive_lock=bool(description["require_exclusive_lock"]),
    )


def vendor_methods_body(reply: pb.VendorMethodsReply) -> dict[str, dict[str, Any]]:
    """Ironic's body for GET .../vendor_passthru/methods, sorted by method name."""
    return {
        name: {
            "http_methods": list(method.http_methods),
            "async": method.is_async,
            "description": method.description,
            "attach": method.attach,
            "require_exclusive_lock": method.require_exclusive_lock,
        }
        for name, method in sorted(reply.methods.items())
    }


def indicators_message(supported: Mapping[str, Mapping[str, Mapping[str, Any]]]) -> pb.IndicatorsReply:
    """A management interface's ``{component: {indicator: {readonly, states}}}`` as a reply."""
    return pb.IndicatorsReply(
        indicators=[
            pb.Indicator(
                component=component,
                name=name,
                readonly=bool(fields.get("readonly")),
                states=list(fields.get("states") or []),
            )
            for component, names in supported.items()
            for name, fields in names.items()
        ]
    )


def deploy_info_message(report: Mapping[str, Any]) -> pb.DeployInfo:
    """An iSCSI deploy ramdisk's report (``pass_deploy_info`` or a heartbeat's
    ``deploy_info``) as a message. The api checked the types: strings, and a
    port number (0 when absent: the iSCSI default)."""
    return pb.DeployInfo(
        address=str(report.get("address") or ""),
        port=int(report.get("port") or 0),
        key=str(report.get("key") or ""),
        iqn=str(report.get("iqn") or ""),
        error=str(report.get("error") or ""),
    )


def deploy_info_dict(message: pb.DeployInfo) -> dict[str, Any]:
    """The report as the conductor checks it: absent fields are None."""
    return {
        "address": message.address or None,
        "port": message.port or None,
        "key": message.key or None,
        "iqn": message.iqn or None,
        "error": message.error or None,
    }


# The keys each step kind accepts (services/api/provision_params.py checks them
# on REST bodies); the conversion refuses any other, so nothing is dropped.
STEP_KEYS: Mapping[str, frozenset[str]] = {
    "clean": frozenset({"interface", "step", "args", "order", "execute_on_child_nodes", "limit_child_node_execution"}),
    "deploy": frozenset({"interface", "step", "args", "priority"}),
    "service": frozenset(
        {"interface", "step", "args", "order", "execute_on_child_nodes", "limit_child_node_execution"}
    ),
}
_UINT64_LIMIT = 2**64
_INT32_LIMIT = 2**31


def is_step_order(value: Any) -> bool:
    """A runbook step's ``order`` as Ironic's step schema takes it (an integer >= 0
    or a string of digits) and as :class:`pb.Step` carries it (below 2**64)."""
    if _is_integer(value):
        return bool(0 <= value < _UINT64_LIMIT)
    return isinstance(value, str) and value.isascii() and value.isdigit()


def _step_message(kind: str, step: Any) -> pb.Step:
    if not isinstance(step, Mapping):
        raise ValueError("not an object")
    unknown = sorted(set(step) - STEP_KEYS[kind])
    if unknown:
        raise ValueError(f"unexpected keys {', '.join(unknown)}")
    interface, name = step.get("interface"), step.get("step")
    if not isinstance(interface, str) or not isinstance(name, str):
        raise ValueError("interface and step must be strings")
    message = pb.Step(interface=interface, step=name)
    if "args" in step:
        if not isinstance(step["args"], Mapping):
            raise ValueError("args must be an object")
        message.args_json = dumps(step["args"])
    if "priority" in step:
        priority = step["priority"]
        if not (_is_integer(priority) and 0 <= priority < _INT32_LIMIT):
            raise ValueError("priority must be an integer from 0 to 2147483647")
        message.priority = priority
    if "order" in step:
        order = step["order"]
        if not is_step_order(order):
            raise ValueError("order must be an integer >= 0 or a string of digits")
        if isinstance(order, str):
            message.order_digits = order
        else:
            message.order_number = order
    if "execute_on_child_nodes" in step:
        if not isinstance(step["execute_on_child_nodes"], bool):
            raise ValueError("execute_on_child_nodes must be a boolean")
        message.execute_on_child_nodes = step["execute_on_child_nodes"]
    if "limit_child_node_execution" in step:
        idents = step["limit_child_node_execution"]
        if not isinstance(idents, list) or not all(isinstance(i, str) for i in idents):
            raise ValueError("limit_child_node_execution must be a list of node UUIDs or names")
        message.limit_child_node_execution.SetInParent()
        message.limit_child_node_execution.idents.extend(idents)
    return message


def step_messages(kind: str, steps: Sequence[Any] | None) -> list[pb.Step]:
    """Requested ``kind`` steps (clean, deploy or service) as messages.

    The REST checks have already refused malformed steps with their own 400s;
    this is the guard for every other caller (the public gRPC API's free-form
    ``ListValue``): a step the message cannot carry exactly is a 400 here,
    never silently trimmed."""
    if kind not in STEP_KEYS:
        raise ValueError(f"unknown step kind {kind!r}")
    messages = []
    for position, step in enumerate(steps or (), 1):
        try:
            messages.append(_step_message(kind, step))
        except ValueError as exc:
            raise errors.InvalidParameterValue(f"Invalid {kind} step {position} {step!r}: {exc}") from None
    return messages


def step_dicts(messages: Iterable[pb.Step]) -> list[dict[str, Any]]:
    """The steps as the api received them: the same keys, the same values."""
    steps = []
    for message in messages:
        step: dict[str, Any] = {"interface": message.interface, "step": message.step}
        if message.HasField("args_json"):
            step["args"] = json.loads(message.args_json)
        if message.HasField("priority"):
            step["priority"] = message.priority
        which = message.WhichOneof("order")
        if which is not None:
            step["order"] = getattr(message, which)
        if message.HasField("execute_on_child_nodes"):
            step["execute_on_child_nodes"] = message.execute_on_child_nodes
        if message.HasField("limit_child_node_execution"):
            step["limit_child_node_execution"] = list(message.limit_child_node_execution.idents)
        steps.append(step)
    return steps


def virtual_media_reply(slots: Iterable[Mapping[str, Any]]) -> pb.VirtualMediaReply:
    """A management interface's ``get_virtual_media`` list as a reply."""
    reply = pb.VirtualMediaReply()
    for slot in slots:
        message = reply.slots.add(media_types=list(slot.get("media_types") or ()), inserted=bool(slot.get("inserted")))
        if slot.get("id") is not None:
            message.id = str(slot["id"])
        if slot.get("image") is not None:
            message.image = str(slot["image"])
    return reply


def virtual_media_list(reply: pb.VirtualMediaReply) -> list[dict[str, Any]]:
    """Ironic's body for GET .../vmedia (1.93): each slot's id (where the BMC has
    one), media types, image (null when empty) and whether it is inserted."""
    slots = []
    for message in reply.slots:
        slot: dict[str, Any] = {"id": message.id} if message.HasField("id") else {}
        slot.update(
            media_types=list(message.media_types),
            image=message.image if message.HasField("image") else None,
            inserted=message.inserted,
        )
        slots.append(slot)
    return slots
