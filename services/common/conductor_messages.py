"""Typed conductor.proto messages to and from the plain values both sides use.

The api builds these messages from REST bodies and the conductor reads them back
(or the other way round for replies). Keeping both directions in one module
means a field added to a message is converted in one place, and a REST body
with a wrong type is refused with a 400 here rather than failing inside the
protobuf constructor with an opaque TypeError.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ferrum.v1 import conductor_pb2 as pb
from services.common import errors

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
