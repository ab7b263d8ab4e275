"""Ironic's provision state machine, kept as one immutable data table.

Every component that moves a node (API validation, the conductor, the
restart sweeper, the docs generator) asks this module rather than encoding
its own idea of which moves are legal, so the API's 400/409 answers and the
conductor's behaviour can never drift apart. The table mirrors CONTRACT.md
section 2 exactly; ``docs/states.md`` is generated from it by
``scripts/gen_states_doc.py`` so the picture cannot go stale either.

Nothing here is mutable: the table is a tuple of frozen dataclasses and the
lookup indexes are ``MappingProxyType`` views built once at import.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import NamedTuple

# ---------------------------------------------------------------------------
# Provision states (exact wire names)
# ---------------------------------------------------------------------------

NOSTATE = None
"""Lack of a state; pre-1.2 clients see ``available`` reported as this."""

ENROLL = "enroll"
VERIFYING = "verifying"
MANAGEABLE = "manageable"
AVAILABLE = "available"
DEPLOYING = "deploying"
DEPLOYWAIT = "wait call-back"
DEPLOYFAIL = "deploy failed"
DEPLOYHOLD = "deploy hold"
ACTIVE = "active"
DELETING = "deleting"
ERROR = "error"
CLEANING = "cleaning"
CLEANWAIT = "clean wait"
CLEANFAIL = "clean failed"
CLEANHOLD = "clean hold"
INSPECTING = "inspecting"
INSPECTWAIT = "inspect wait"
INSPECTFAIL = "inspect failed"
ADOPTING = "adopting"
ADOPTFAIL = "adopt failed"
RESCUING = "rescuing"
RESCUEWAIT = "rescue wait"
RESCUEFAIL = "rescue failed"
RESCUE = "rescue"
UNRESCUING = "unrescuing"
UNRESCUEFAIL = "unrescue failed"
SERVICING = "servicing"
SERVICEWAIT = "service wait"
SERVICEFAIL = "service failed"
SERVICEHOLD = "service hold"

# Names that exist on the wire but are never a node's provision_state.
DEPLOYDONE = "deploy complete"
"""Only ever a target; kept so callers do not retype the string."""
DELETED = "deleted"
"""Transitory (and the legacy API verb); never stored as provision_state."""

ALL_STATES: frozenset[str] = frozenset(
    (
        ENROLL,
        VERIFYING,
        MANAGEABLE,
        AVAILABLE,
        DEPLOYING,
        DEPLOYWAIT,
        DEPLOYFAIL,
        DEPLOYHOLD,
        ACTIVE,
        DELETING,
        ERROR,
        CLEANING,
        CLEANWAIT,
        CLEANFAIL,
        CLEANHOLD,
        INSPECTING,
        INSPECTWAIT,
        INSPECTFAIL,
        ADOPTING,
        ADOPTFAIL,
        RESCUING,
        RESCUEWAIT,
        RESCUEFAIL,
        RESCUE,
        UNRESCUING,
        UNRESCUEFAIL,
        SERVICING,
        SERVICEWAIT,
        SERVICEFAIL,
        SERVICEHOLD,
    )
)
"""Every value ``provision_state`` may hold; also validates the list filter."""

# ---------------------------------------------------------------------------
# Power states
# ---------------------------------------------------------------------------

POWER_ON = "power on"
POWER_OFF = "power off"
REBOOT = "rebooting"
SOFT_REBOOT = "soft rebooting"
SOFT_POWER_OFF = "soft power off"

POWER_STATES: frozenset[str] = frozenset((POWER_ON, POWER_OFF))
"""Values ``power_state`` can report (besides NOSTATE)."""
POWER_TARGETS: frozenset[str] = frozenset((POWER_ON, POWER_OFF, REBOOT, SOFT_REBOOT, SOFT_POWER_OFF))
"""Values accepted as ``target`` by ``PUT .../states/power``."""
SOFT_POWER_TARGETS: frozenset[str] = frozenset((SOFT_REBOOT, SOFT_POWER_OFF))
"""Power targets that need microversion 1.27."""

# ---------------------------------------------------------------------------
# State groups
# ---------------------------------------------------------------------------

STABLE_STATES: frozenset[str] = frozenset((ENROLL, MANAGEABLE, AVAILABLE, ACTIVE, ERROR, RESCUE))
"""States that only change on request; their target_provision_state is null."""

FAILURE_STATES: frozenset[str] = frozenset(
    (DEPLOYFAIL, CLEANFAIL, INSPECTFAIL, RESCUEFAIL, UNRESCUEFAIL, ADOPTFAIL, SERVICEFAIL)
)
"""Transient states that wait for an operator; they keep their target."""

LOOKUP_ALLOWED_STATES: frozenset[str] = frozenset(
    (
        DEPLOYING,
        DEPLOYWAIT,
        CLEANING,
        CLEANWAIT,
        INSPECTING,
        INSPECTWAIT,
        RESCUING,
        RESCUEWAIT,
        SERVICEWAIT,
    )
)
"""States in which ``/v1/lookup`` answers under ``[api]restrict_lookup``."""

DELETE_ALLOWED_STATES: frozenset[str] = frozenset((MANAGEABLE, ENROLL, ADOPTFAIL, AVAILABLE))
"""States in which ``DELETE /v1/nodes`` works outside maintenance.

``available`` is only allowed while ``[conductor]allow_deleting_available_nodes``
is true (the default); use :func:`delete_allowed` to honour that option.
"""

PATCH_ALLOWED_WITH_TARGET: frozenset[str] = frozenset(
    (
        DEPLOYFAIL,
        INSPECTING,
        INSPECTFAIL,
        INSPECTWAIT,
        CLEANFAIL,
        ERROR,
        VERIFYING,
        ADOPTFAIL,
        RESCUEFAIL,
        UNRESCUEFAIL,
        # Ironic lists the verb "service" (its SERVICE constant), not
        # "servicing"; copied verbatim so PATCH answers 409 exactly as Ironic.
        "service",
        SERVICEHOLD,
        SERVICEFAIL,
    )
)
"""States where PATCH is allowed although target_provision_state is set."""

FAILURE_STATE_OF: Mapping[str, str] = MappingProxyType(
    {
        DEPLOYING: DEPLOYFAIL,
        CLEANING: CLEANFAIL,
        VERIFYING: ENROLL,
        INSPECTING: INSPECTFAIL,
        ADOPTING: ADOPTFAIL,
        RESCUING: RESCUEFAIL,
        UNRESCUING: UNRESCUEFAIL,
        DELETING: ERROR,
        SERVICING: SERVICEFAIL,
    }
)
"""Where a node stuck by a dead conductor is moved (via the ``fail`` event)."""

STUCK_ON_RESTART: frozenset[str] = frozenset(FAILURE_STATE_OF)
"""States whose work dies with the conductor and cannot be resumed."""

# Events that only the conductor raises, never a REST verb on its own.
# ("clean" is also the manual-clean verb; from deleting it is internal.)
INTERNAL_EVENTS: frozenset[str] = frozenset(("done", "fail", "wait", "resume", "hold", "clean"))

# ---------------------------------------------------------------------------
# Transition table
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Transition:
    """One legal move; ``target_provision_state`` is what entering ``target`` records.

    For moves inside one flow (e.g. ``clean wait -> cleaning``) the node's
    current target is kept instead, because only the entry move knows whether
    cleaning is manual (``manageable``) or automated (``available``); see
    :func:`next_target`. The value stored here is then the flow's default.
    """

    source: str
    event: str
    target: str
    target_provision_state: str | None


def _t(source: str, event: str, target: str, tps: str | None) -> Transition:
    return Transition(source, event, target, tps)


_A, _V, _M, _R = ACTIVE, AVAILABLE, MANAGEABLE, RESCUE

TRANSITIONS: tuple[Transition, ...] = (
    # enroll / verify
    _t(ENROLL, "manage", VERIFYING, _M),
    _t(VERIFYING, "done", MANAGEABLE, None),
    _t(VERIFYING, "fail", ENROLL, None),
    # manageable
    _t(MANAGEABLE, "provide", CLEANING, _V),
    _t(MANAGEABLE, "clean", CLEANING, _M),  # manual cleaning returns to manageable
    _t(MANAGEABLE, "inspect", INSPECTING, _M),
    _t(MANAGEABLE, "adopt", ADOPTING, _A),
    # available
    _t(AVAILABLE, "deploy", DEPLOYING, _A),
    _t(AVAILABLE, "manage", MANAGEABLE, None),
    # deploy flow
    _t(DEPLOYING, "wait", DEPLOYWAIT, _A),
    _t(DEPLOYING, "done", ACTIVE, None),
    _t(DEPLOYING, "fail", DEPLOYFAIL, _A),
    _t(DEPLOYING, "hold", DEPLOYHOLD, _A),
    _t(DEPLOYWAIT, "resume", DEPLOYING, _A),
    _t(DEPLOYWAIT, "fail", DEPLOYFAIL, _A),
    _t(DEPLOYWAIT, "abort", DEPLOYFAIL, _A),
    _t(DEPLOYWAIT, "hold", DEPLOYHOLD, _A),
    _t(DEPLOYWAIT, "delete", DELETING, _V),
    _t(DEPLOYHOLD, "unhold", DEPLOYWAIT, _A),
    _t(DEPLOYHOLD, "abort", DEPLOYFAIL, _A),
    _t(DEPLOYFAIL, "deploy", DEPLOYING, _A),
    _t(DEPLOYFAIL, "rebuild", DEPLOYING, _A),
    _t(DEPLOYFAIL, "delete", DELETING, _V),
    # active / error
    _t(ACTIVE, "rebuild", DEPLOYING, _A),
    _t(ACTIVE, "delete", DELETING, _V),
    _t(ACTIVE, "rescue", RESCUING, _R),
    _t(ACTIVE, "service", SERVICING, _A),
    _t(ERROR, "rebuild", DEPLOYING, _A),
    _t(ERROR, "delete", DELETING, _V),
    # teardown
    _t(DELETING, "clean", CLEANING, _V),
    _t(DELETING, "fail", ERROR, None),
    # clean flow (target kept from the node: available or manageable)
    _t(CLEANING, "done", AVAILABLE, None),
    _t(CLEANING, "manage", MANAGEABLE, None),  # end of manual clean
    _t(CLEANING, "wait", CLEANWAIT, _V),
    _t(CLEANING, "hold", CLEANHOLD, _V),
    _t(CLEANING, "fail", CLEANFAIL, _V),
    _t(CLEANWAIT, "resume", CLEANING, _V),
    _t(CLEANWAIT, "fail", CLEANFAIL, _V),
    _t(CLEANWAIT, "abort", CLEANFAIL, _V),
    _t(CLEANWAIT, "hold", CLEANHOLD, _V),
    _t(CLEANHOLD, "unhold", CLEANWAIT, _V),
    _t(CLEANHOLD, "abort", CLEANFAIL, _V),
    _t(CLEANFAIL, "manage", MANAGEABLE, None),
    # inspect flow
    _t(INSPECTING, "done", MANAGEABLE, None),
    _t(INSPECTING, "wait", INSPECTWAIT, _M),
    _t(INSPECTING, "fail", INSPECTFAIL, _M),
    _t(INSPECTWAIT, "done", MANAGEABLE, None),
    _t(INSPECTWAIT, "resume", INSPECTING, _M),
    _t(INSPECTWAIT, "fail", INSPECTFAIL, _M),
    _t(INSPECTWAIT, "abort", INSPECTFAIL, _M),
    _t(INSPECTFAIL, "manage", MANAGEABLE, None),
    _t(INSPECTFAIL, "inspect", INSPECTING, _M),
    # adopt flow
    _t(ADOPTING, "done", ACTIVE, None),
    _t(ADOPTING, "fail", ADOPTFAIL, _A),
    _t(ADOPTFAIL, "adopt", ADOPTING, _A),
    _t(ADOPTFAIL, "manage", MANAGEABLE, None),
    # rescue flow
    _t(RESCUING, "done", RESCUE, None),
    _t(RESCUING, "wait", RESCUEWAIT, _R),
    _t(RESCUING, "fail", RESCUEFAIL, _R),
    _t(RESCUEWAIT, "resume", RESCUING, _R),
    _t(RESCUEWAIT, "fail", RESCUEFAIL, _R),
    _t(RESCUEWAIT, "abort", RESCUEFAIL, _R),
    _t(RESCUEWAIT, "delete", DELETING, _V),
    _t(RESCUE, "rescue", RESCUING, _R),
    _t(RESCUE, "unrescue", UNRESCUING, _A),
    _t(RESCUE, "delete", DELETING, _V),
    _t(RESCUEFAIL, "rescue", RESCUING, _R),
    _t(RESCUEFAIL, "unrescue", UNRESCUING, _A),
    _t(RESCUEFAIL, "delete", DELETING, _V),
    # unrescue flow
    _t(UNRESCUING, "done", ACTIVE, None),
    _t(UNRESCUING, "fail", UNRESCUEFAIL, _A),
    _t(UNRESCUEFAIL, "rescue", RESCUING, _R),
    _t(UNRESCUEFAIL, "unrescue", UNRESCUING, _A),
    _t(UNRESCUEFAIL, "delete", DELETING, _V),
    # service flow
    _t(SERVICING, "done", ACTIVE, None),
    _t(SERVICING, "wait", SERVICEWAIT, _A),
    _t(SERVICING, "hold", SERVICEHOLD, _A),
    _t(SERVICING, "fail", SERVICEFAIL, _A),
    _t(SERVICEWAIT, "resume", SERVICING, _A),
    _t(SERVICEWAIT, "hold", SERVICEHOLD, _A),
    _t(SERVICEWAIT, "fail", SERVICEFAIL, _A),
    _t(SERVICEWAIT, "abort", SERVICEFAIL, _A),
    _t(SERVICEWAIT, "delete", DELETING, _V),
    _t(SERVICEHOLD, "service", SERVICING, _A),
    _t(SERVICEHOLD, "unhold", SERVICEWAIT, _A),
    _t(SERVICEHOLD, "fail", SERVICEFAIL, _A),
    _t(SERVICEHOLD, "abort", SERVICEFAIL, _A),
    _t(SERVICEFAIL, "service", SERVICING, _A),
    _t(SERVICEFAIL, "rescue", RESCUING, _R),
    _t(SERVICEFAIL, "wait", SERVICEWAIT, _A),
    _t(SERVICEFAIL, "hold", SERVICEHOLD, _A),
    _t(SERVICEFAIL, "delete", DELETING, _V),
    _t(SERVICEFAIL, "abort", ACTIVE, None),
)
"""Every legal (source, event) -> target move, in CONTRACT.md section 2 order."""

del _A, _V, _M, _R

ALL_EVENTS: frozenset[str] = frozenset(t.event for t in TRANSITIONS)
"""Every event the machine understands (internal ones included)."""

# Transient states grouped by the operation they belong to. A move between two
# states of the same flow keeps the node's target (see next_target).
_FLOW_OF: Mapping[str, str] = MappingProxyType(
    {
        **dict.fromkeys((VERIFYING,), "verify"),
        **dict.fromkeys((DEPLOYING, DEPLOYWAIT, DEPLOYFAIL, DEPLOYHOLD), "deploy"),
        **dict.fromkeys((DELETING,), "delete"),
        **dict.fromkeys((CLEANING, CLEANWAIT, CLEANFAIL, CLEANHOLD), "clean"),
        **dict.fromkeys((INSPECTING, INSPECTWAIT, INSPECTFAIL), "inspect"),
        **dict.fromkeys((ADOPTING, ADOPTFAIL), "adopt"),
        **dict.fromkeys((RESCUING, RESCUEWAIT, RESCUEFAIL), "rescue"),
        **dict.fromkeys((UNRESCUING, UNRESCUEFAIL), "unrescue"),
        **dict.fromkeys((SERVICING, SERVICEWAIT, SERVICEFAIL, SERVICEHOLD), "service"),
    }
)


def _build_index(
    table: tuple[Transition, ...],
) -> Mapping[str, Mapping[str, Transition]]:
    """Index the table once and refuse to import a contradictory one."""
    index: dict[str, dict[str, Transition]] = {}
    for tr in table:
        for state in (tr.source, tr.target):
            if state not in ALL_STATES:
                raise RuntimeError(f"transition {tr} uses unknown state {state!r}")
        if (tr.target in STABLE_STATES) != (tr.target_provision_state is None):
            raise RuntimeError(
                f"transition {tr}: target provision state must be null exactly when entering a stable state"
            )
        by_event = index.setdefault(tr.source, {})
        if tr.event in by_event:
            raise RuntimeError(f"duplicate transition for ({tr.source!r}, {tr.event!r})")
        by_event[tr.event] = tr
    return MappingProxyType({s: MappingProxyType(e) for s, e in index.items()})


_INDEX: Mapping[str, Mapping[str, Transition]] = _build_index(TRANSITIONS)

# ---------------------------------------------------------------------------
# REST verbs
# ---------------------------------------------------------------------------


class VerbSpec(NamedTuple):
    """A REST verb's event and the microversion that introduced the verb."""

    event: str
    min_version: tuple[int, int]


API_VERBS: Mapping[str, VerbSpec] = MappingProxyType(
    {
        "active": VerbSpec("deploy", (1, 1)),
        "deploy": VerbSpec("deploy", (1, 73)),
        "rebuild": VerbSpec("rebuild", (1, 1)),
        "deleted": VerbSpec("delete", (1, 1)),
        "undeploy": VerbSpec("delete", (1, 73)),
        "manage": VerbSpec("manage", (1, 4)),
        "provide": VerbSpec("provide", (1, 4)),
        "inspect": VerbSpec("inspect", (1, 6)),
        "abort": VerbSpec("abort", (1, 13)),
        "clean": VerbSpec("clean", (1, 15)),
        "adopt": VerbSpec("adopt", (1, 17)),
        "rescue": VerbSpec("rescue", (1, 38)),
        "unrescue": VerbSpec("unrescue", (1, 38)),
        "unhold": VerbSpec("unhold", (1, 85)),
        "service": VerbSpec("service", (1, 87)),
    }
)
"""``PUT .../states/provision`` target -> (event, minimum microversion)."""

_ABORT_MIN_VERSION_FROM: Mapping[str, tuple[int, int]] = MappingProxyType({INSPECTWAIT: (1, 41), DEPLOYWAIT: (1, 110)})

# ---------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------


class InvalidTransition(ValueError):
    """The event is not legal from the state; the API maps this to 400 (or 409 if locked)."""

    def __init__(self, source: str | None, event: str) -> None:
        super().__init__(
            f'The requested action "{event}" can not be performed on a node in the "{source}" provision state.'
        )
        self.source = source
        self.event = event


class UnknownVerb(ValueError):
    """The REST verb does not exist; the API answers 400 with Ironic's wording."""

    def __init__(self, verb: str) -> None:
        super().__init__(f'The requested action "{verb}" could not be understood.')
        self.verb = verb


# ---------------------------------------------------------------------------
# Queries
# ---------------------------------------------------------------------------


def next_state(source: str, event: str) -> Transition:
    """Return the move for ``event`` so callers never hand-code a target state.

    Raises :class:`InvalidTransition` when the contract does not allow it.
    """
    tr = _INDEX.get(source, {}).get(event)
    if tr is None:
        raise InvalidTransition(source, event)
    return tr


def allowed_events(source: str) -> frozenset[str]:
    """Events legal from ``source``; empty for unknown states rather than an error,
    so a corrupt row cannot crash list views that merely describe a node."""
    return frozenset(_INDEX.get(source, {}))


def is_stable(state: str | None) -> bool:
    """Whether the node rests until someone asks; NOSTATE is not a stored state."""
    return state in STABLE_STATES


def preserves_target(transition: Transition) -> bool:
    """Whether the move stays inside one operation and so must keep the node's target.

    Only the move that starts an operation knows its goal (manual vs automated
    cleaning); later moves (wait, resume, fail, hold...) must not overwrite it.
    """
    flow = _FLOW_OF.get(transition.source)
    return (
        transition.target_provision_state is not None and flow is not None and flow == _FLOW_OF.get(transition.target)
    )


def next_target(node_target: str | None, transition: Transition) -> str | None:
    """The ``target_provision_state`` to store after ``transition``.

    Entering a stable state clears the target; starting an operation takes the
    table's value; moving within an operation keeps ``node_target`` (falling
    back to the table's value if the node somehow had none).
    """
    if transition.target_provision_state is None:
        return None
    if node_target is not None and preserves_target(transition):
        return node_target
    return transition.target_provision_state


def verb_to_event(verb: str) -> str:
    """Translate a REST verb, since ``active``/``deploy`` and ``deleted``/``undeploy``
    are aliases for one event each. Raises :class:`UnknownVerb`."""
    try:
        return API_VERBS[verb].event
    except KeyError:
        raise UnknownVerb(verb) from None


def verb_min_version(verb: str) -> tuple[int, int]:
    """Microversion a verb needs, so the API can answer 406 before checking state.

    Raises :class:`UnknownVerb`.
    """
    try:
        return API_VERBS[verb].min_version
    except KeyError:
        raise UnknownVerb(verb) from None


def abort_min_version(source: str) -> tuple[int, int]:
    """Microversion needed to abort from ``source``.

    Abort became possible from some states later than the verb itself (inspect
    wait 1.41, wait call-back 1.110); older clients must get 406 there. For
    states where abort is not legal at all this still returns the verb's
    version: the state-machine check (400) comes after the version check.
    """
    return _ABORT_MIN_VERSION_FROM.get(source, API_VERBS["abort"].min_version)


def delete_allowed(state: str, allow_deleting_available: bool = True) -> bool:
    """Whether ``DELETE /v1/nodes`` may proceed (outside maintenance) from ``state``.

    ``available`` depends on ``[conductor]allow_deleting_available_nodes``.
    """
    if state == AVAILABLE:
        return allow_deleting_available
    return state in DELETE_ALLOWED_STATES


# ---------------------------------------------------------------------------
# Diagram
# ---------------------------------------------------------------------------


def mermaid_id(state: str) -> str:
    """Mermaid node id for a state, since ids cannot hold spaces or dashes."""
    return re.sub(r"[^A-Za-z0-9]", "_", state)


def mermaid_diagram() -> str:
    """Render TRANSITIONS as a Mermaid ``stateDiagram-v2`` so the docs follow the table.

    Output is deterministic (table order) so ``--check`` can diff it.
    """
    order: list[str] = []
    for tr in TRANSITIONS:
        for state in (tr.source, tr.target):
            if state not in order:
                order.append(state)

    lines = ["stateDiagram-v2"]
    for state in order:
        sid = mermaid_id(state)
        if sid != state:
            lines.append(f'    state "{state}" as {sid}')
    lines.append(f"    [*] --> {mermaid_id(ENROLL)}")

    edges: dict[tuple[str, str], list[str]] = {}
    for tr in TRANSITIONS:
        edges.setdefault((tr.source, tr.target), []).append(tr.event)
    for (source, target), events in edges.items():
        lines.append(f"    {mermaid_id(source)} --> {mermaid_id(target)} : {', '.join(events)}")

    stable = ",".join(mermaid_id(s) for s in order if s in STABLE_STATES)
    failed = ",".join(mermaid_id(s) for s in order if s in FAILURE_STATES)
    lines.append("    classDef stable font-weight:bold,stroke-width:3px")
    lines.append("    classDef failure stroke:#c00,stroke-width:2px")
    lines.append(f"    class {stable} stable")
    lines.append(f"    class {failed} failure")
    return "\n".join(lines) + "\n"
