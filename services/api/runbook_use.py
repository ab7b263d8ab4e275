"""Using a runbook in a provision request (REST 1.92): ``{"target": "clean",
"runbook": "<name or UUID>"}`` runs the runbook's steps as the manual clean
steps, and ``{"target": "service", "runbook": ...}`` as the service steps.

One function, shared by REST ``PUT .../states/provision`` and gRPC
``SetProvisionState``, so every verb that takes steps resolves a runbook the
same way. As Ironic's ``_handle_runbook``:

- the runbook must exist (404) and the caller may use it: system scope any,
  a project (``X-Project-Id``) its own or a public one (403 otherwise);
- the node must be approved for it: below 1.112 it has a trait equal to the
  runbook's name; from 1.112 it shares a trait with the runbook's traits,
  and a runbook without traits runs nowhere (400 either way);
- the runbook replaces the request's steps, never joins them (steps and a
  runbook together are a 400), and its ``disable_ramdisk`` is the request's;
- steps run in their ``order`` (a stable sort: equal orders keep their
  place), which the conductor then checks like any requested steps.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from services.common import errors
from services.common.db.records import NodeRecord, RunbookRecord, RunbookStep
from services.common.db.runbooks import RunbookRepository

SINCE = (1, 92)
TRAITS_SINCE = (1, 112)
VERBS = ("clean", "service")
STEPS_KEY = {"clean": "clean_steps", "service": "service_steps"}


@dataclass(frozen=True)
class RunbookSteps:
    """What a runbook puts into a provision request."""

    steps: list[dict[str, Any]]  # the clean_steps or service_steps, in order
    disable_ramdisk: bool
    runbook_uuid: str


def ordered_steps(steps: list[RunbookStep]) -> list[dict[str, Any]]:
    """The runbook's steps as requested steps, sorted by ``order`` (stable)."""
    converted = [
        {"interface": s["interface"], "step": s["step"], "args": dict(s.get("args") or {}), "order": s["order"]}
        for s in steps
    ]
    return sorted(converted, key=lambda s: int(s["order"]))


def check_node_approved(runbook: RunbookRecord, node: NodeRecord, version: tuple[int, int]) -> None:
    """Ironic's trait rule for running ``runbook`` on ``node`` at ``version``."""
    node_traits = set(node.get("traits") or [])
    if version >= TRAITS_SINCE:
        runbook_traits = set(runbook["traits"])
        if not runbook_traits:
            raise errors.InvalidParameterValue(
                f"Runbook {runbook['uuid']} has no traits configured. "
                "Please ask an administrator to add traits to the runbook."
            )
        if not runbook_traits & node_traits:
            raise errors.InvalidParameterValue(
                f"This runbook has not been approved for use on this node {node['uuid']}. The node does not have "
                f"any of the runbook's traits {sorted(runbook_traits)}. Please ask an administrator to add a "
                "matching trait to your node."
            )
    elif runbook["name"] not in node_traits:
        raise errors.InvalidParameterValue(
            f"This runbook has not been approved for use on this node {node['uuid']}. "
            "Please ask an administrator to add it to your node traits."
        )


async def resolve_runbook(
    runbooks: RunbookRepository,
    node: NodeRecord,
    ident: Any,
    *,
    verb: str,
    version: tuple[int, int],
    project: str | None,
    given_steps: Any,
) -> RunbookSteps:
    """The steps and ``disable_ramdisk`` the runbook ``ident`` gives ``verb`` on ``node``.

    ``given_steps`` is what the request itself put under ``clean_steps`` or
    ``service_steps`` (None when nothing): a runbook replaces them, so both
    is a 400. Refusals are Ironic's: 406 below 1.92, 400 for a verb without
    steps, 404 for an unknown runbook, 403 for one the project may not use.
    """
    if version < SINCE:
        raise errors.NotAcceptable("Request not acceptable. The minimal required API version should be 1.92")
    if not isinstance(ident, str) or not ident:
        raise errors.InvalidParameterValue("runbook must be the name or UUID of a runbook")
    if verb not in VERBS:
        raise errors.InvalidParameterValue(
            f'"runbooks" is only valid when setting target provision state to any of {list(VERBS)}'
        )
    runbook = await runbooks.get(ident)
    if project is not None and runbook["owner"] != project and not runbook["public"]:
        raise errors.Forbidden(f"Access was denied to runbook {runbook['uuid']}.")
    check_node_approved(runbook, node, version)
    if given_steps:
        raise errors.InvalidParameterValue(f'Please provide either "{STEPS_KEY[verb]}" or a runbook, but not both.')
    return RunbookSteps(
        steps=ordered_steps(runbook["steps"]),
        disable_ramdisk=bool(runbook["disable_ramdisk"]),
        runbook_uuid=str(runbook["uuid"]),
    )
