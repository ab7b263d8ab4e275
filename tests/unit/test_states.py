"""The provision state table must match CONTRACT.md section 2 exactly.

The expected transitions below are an independent literal copy of the
contract's list (one block per contract line), not derived from the module, so
a typo in either place fails the exhaustive state x event check.
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest

from services.common import states

ROOT = Path(__file__).resolve().parents[2]

CONTRACT_STATES = [
    "enroll",
    "verifying",
    "manageable",
    "available",
    "deploying",
    "wait call-back",
    "deploy failed",
    "deploy hold",
    "active",
    "deleting",
    "error",
    "cleaning",
    "clean wait",
    "clean failed",
    "clean hold",
    "inspecting",
    "inspect wait",
    "inspect failed",
    "adopting",
    "adopt failed",
    "rescuing",
    "rescue wait",
    "rescue failed",
    "rescue",
    "unrescuing",
    "unrescue failed",
    "servicing",
    "service wait",
    "service failed",
    "service hold",
]

# (source, event) -> (target, target_provision_state on entry; None = stable)
CONTRACT_TRANSITIONS: dict[tuple[str, str], tuple[str, str | None]] = {
    # enroll -manage-> verifying -done-> manageable ; verifying -fail-> enroll
    ("enroll", "manage"): ("verifying", "manageable"),
    ("verifying", "done"): ("manageable", None),
    ("verifying", "fail"): ("enroll", None),
    # manageable -provide-> cleaning | -clean-> cleaning(target manageable) | -inspect-> | -adopt->
    ("manageable", "provide"): ("cleaning", "available"),
    ("manageable", "clean"): ("cleaning", "manageable"),
    ("manageable", "inspect"): ("inspecting", "manageable"),
    ("manageable", "adopt"): ("adopting", "active"),
    # available -deploy-> deploying | -manage-> manageable
    ("available", "deploy"): ("deploying", "active"),
    ("available", "manage"): ("manageable", None),
    # deploying -wait-> wait call-back | -done-> active | -fail-> | -hold-> deploy hold
    ("deploying", "wait"): ("wait call-back", "active"),
    ("deploying", "done"): ("active", None),
    ("deploying", "fail"): ("deploy failed", "active"),
    ("deploying", "hold"): ("deploy hold", "active"),
    # wait call-back -resume-> deploying | -fail/abort-> deploy failed | -hold-> | -delete->
    ("wait call-back", "resume"): ("deploying", "active"),
    ("wait call-back", "fail"): ("deploy failed", "active"),
    ("wait call-back", "abort"): ("deploy failed", "active"),
    ("wait call-back", "hold"): ("deploy hold", "active"),
    ("wait call-back", "delete"): ("deleting", "available"),
    # deploy hold -unhold-> wait call-back | -abort-> deploy failed
    ("deploy hold", "unhold"): ("wait call-back", "active"),
    ("deploy hold", "abort"): ("deploy failed", "active"),
    # deploy failed -deploy/rebuild-> deploying | -delete-> deleting
    ("deploy failed", "deploy"): ("deploying", "active"),
    ("deploy failed", "rebuild"): ("deploying", "active"),
    ("deploy failed", "delete"): ("deleting", "available"),
    # active -rebuild-> deploying | -delete-> deleting | -rescue-> rescuing | -service-> servicing
    ("active", "rebuild"): ("deploying", "active"),
    ("active", "delete"): ("deleting", "available"),
    ("active", "rescue"): ("rescuing", "rescue"),
    ("active", "service"): ("servicing", "active"),
    # error -rebuild-> deploying | -delete-> deleting
    ("error", "rebuild"): ("deploying", "active"),
    ("error", "delete"): ("deleting", "available"),
    # deleting -clean-> cleaning | -fail-> error
    ("deleting", "clean"): ("cleaning", "available"),
    ("deleting", "fail"): ("error", None),
    # cleaning -done-> available | -manage-> manageable | -wait-> | -hold-> | -fail->
    ("cleaning", "done"): ("available", None),
    ("cleaning", "manage"): ("manageable", None),
    ("cleaning", "wait"): ("clean wait", "available"),
    ("cleaning", "hold"): ("clean hold", "available"),
    ("cleaning", "fail"): ("clean failed", "available"),
    # clean wait -resume-> cleaning | -fail/abort-> clean failed | -hold-> clean hold
    ("clean wait", "resume"): ("cleaning", "available"),
    ("clean wait", "fail"): ("clean failed", "available"),
    ("clean wait", "abort"): ("clean failed", "available"),
    ("clean wait", "hold"): ("clean hold", "available"),
    # clean hold -unhold-> clean wait | -abort-> clean failed
    ("clean hold", "unhold"): ("clean wait", "available"),
    ("clean hold", "abort"): ("clean failed", "available"),
    # clean failed -manage-> manageable
    ("clean failed", "manage"): ("manageable", None),
    # inspecting -done-> manageable | -wait-> inspect wait | -fail-> inspect failed
    ("inspecting", "done"): ("manageable", None),
    ("inspecting", "wait"): ("inspect wait", "manageable"),
    ("inspecting", "fail"): ("inspect failed", "manageable"),
    # inspect wait -done-> manageable | -resume-> inspecting | -fail/abort-> inspect failed
    ("inspect wait", "done"): ("manageable", None),
    ("inspect wait", "resume"): ("inspecting", "manageable"),
    ("inspect wait", "fail"): ("inspect failed", "manageable"),
    ("inspect wait", "abort"): ("inspect failed", "manageable"),
    # inspect failed -manage-> manageable | -inspect-> inspecting
    ("inspect failed", "manage"): ("manageable", None),
    ("inspect failed", "inspect"): ("inspecting", "manageable"),
    # adopting -done-> active | -fail-> adopt failed ; adopt failed -adopt-> | -manage->
    ("adopting", "done"): ("active", None),
    ("adopting", "fail"): ("adopt failed", "active"),
    ("adopt failed", "adopt"): ("adopting", "active"),
    ("adopt failed", "manage"): ("manageable", None),
    # rescuing -done-> rescue | -wait-> rescue wait | -fail-> rescue failed
    ("rescuing", "done"): ("rescue", None),
    ("rescuing", "wait"): ("rescue wait", "rescue"),
    ("rescuing", "fail"): ("rescue failed", "rescue"),
    # rescue wait -resume-> rescuing | -fail/abort-> rescue failed | -delete-> deleting
    ("rescue wait", "resume"): ("rescuing", "rescue"),
    ("rescue wait", "fail"): ("rescue failed", "rescue"),
    ("rescue wait", "abort"): ("rescue failed", "rescue"),
    ("rescue wait", "delete"): ("deleting", "available"),
    # rescue -rescue-> rescuing | -unrescue-> unrescuing | -delete-> deleting
    ("rescue", "rescue"): ("rescuing", "rescue"),
    ("rescue", "unrescue"): ("unrescuing", "active"),
    ("rescue", "delete"): ("deleting", "available"),
    # rescue failed -rescue-> rescuing | -unrescue-> unrescuing | -delete-> deleting
    ("rescue failed", "rescue"): ("rescuing", "rescue"),
    ("rescue failed", "unrescue"): ("unrescuing", "active"),
    ("rescue failed", "delete"): ("deleting", "available"),
    # unrescuing -done-> active | -fail-> unrescue failed
    ("unrescuing", "done"): ("active", None),
    ("unrescuing", "fail"): ("unrescue failed", "active"),
    # unrescue failed -rescue/unrescue/delete-> rescuing/unrescuing/deleting
    ("unrescue failed", "rescue"): ("rescuing", "rescue"),
    ("unrescue failed", "unrescue"): ("unrescuing", "active"),
    ("unrescue failed", "delete"): ("deleting", "available"),
    # servicing -done-> active | -wait-> service wait | -hold-> | -fail-> service failed
    ("servicing", "done"): ("active", None),
    ("servicing", "wait"): ("service wait", "active"),
    ("servicing", "hold"): ("service hold", "active"),
    ("servicing", "fail"): ("service failed", "active"),
    # service wait -resume-> servicing | -hold-> | -fail/abort-> service failed | -delete->
    ("service wait", "resume"): ("servicing", "active"),
    ("service wait", "hold"): ("service hold", "active"),
    ("service wait", "fail"): ("service failed", "active"),
    ("service wait", "abort"): ("service failed", "active"),
    ("service wait", "delete"): ("deleting", "available"),
    # service hold -service-> servicing | -unhold-> service wait | -fail/abort-> service failed
    ("service hold", "service"): ("servicing", "active"),
    ("service hold", "unhold"): ("service wait", "active"),
    ("service hold", "fail"): ("service failed", "active"),
    ("service hold", "abort"): ("service failed", "active"),
    # service failed -service-> | -rescue-> | -wait/hold-> ... | -delete-> | -abort-> active
    ("service failed", "service"): ("servicing", "active"),
    ("service failed", "rescue"): ("rescuing", "rescue"),
    ("service failed", "wait"): ("service wait", "active"),
    ("service failed", "hold"): ("service hold", "active"),
    ("service failed", "delete"): ("deleting", "available"),
    ("service failed", "abort"): ("active", None),
}

ALL_TEST_EVENTS = sorted(
    {event for _, event in CONTRACT_TRANSITIONS}
    | {"done", "fail", "wait", "resume", "hold", "clean", "abort", "unhold"}
    # verbs / names that are not events, to prove they are rejected
    | {"active", "deleted", "undeploy", "bogus", ""}
)


def test_every_contract_state_is_known() -> None:
    assert frozenset(CONTRACT_STATES) == states.ALL_STATES
    assert len(CONTRACT_STATES) == 30
    constants = {value for name, value in vars(states).items() if name.isupper() and isinstance(value, str)}
    for state in CONTRACT_STATES:
        assert state in constants, state
    used = {t.source for t in states.TRANSITIONS} | {t.target for t in states.TRANSITIONS}
    assert used == frozenset(CONTRACT_STATES)
    # Names that are never a provision_state.
    assert "deploy complete" not in states.ALL_STATES
    assert "deleted" not in states.ALL_STATES
    assert states.NOSTATE is None


def test_power_constants() -> None:
    assert {"power on", "power off", "rebooting", "soft rebooting", "soft power off"} == states.POWER_TARGETS
    assert {"power on", "power off"} == states.POWER_STATES


def test_table_matches_contract_exactly() -> None:
    actual = {(t.source, t.event): (t.target, t.target_provision_state) for t in states.TRANSITIONS}
    assert len(actual) == len(states.TRANSITIONS), "duplicate (source, event)"
    missing = CONTRACT_TRANSITIONS.keys() - actual.keys()
    extra = actual.keys() - CONTRACT_TRANSITIONS.keys()
    assert not missing, f"missing transitions: {sorted(missing)}"
    assert not extra, f"transitions not in the contract: {sorted(extra)}"
    wrong = {k: (actual[k], v) for k, v in CONTRACT_TRANSITIONS.items() if actual[k] != v}
    assert not wrong, f"wrong target or target_provision_state: {wrong}"


@pytest.mark.parametrize("source", [*CONTRACT_STATES, "deploy complete", "deleted", "nope"])
def test_every_state_event_pair(source: str) -> None:
    for event in ALL_TEST_EVENTS:
        expected = CONTRACT_TRANSITIONS.get((source, event))
        if expected is None:
            with pytest.raises(states.InvalidTransition) as info:
                states.next_state(source, event)
            assert isinstance(info.value, ValueError)
            assert info.value.source == source
            assert info.value.event == event
        else:
            tr = states.next_state(source, event)
            assert (tr.source, tr.event) == (source, event)
            assert (tr.target, tr.target_provision_state) == expected
    expected_events = {e for (s, e) in CONTRACT_TRANSITIONS if s == source}
    assert states.allowed_events(source) == expected_events


def test_transition_is_frozen() -> None:
    tr = states.next_state("available", "deploy")
    with pytest.raises(dataclasses.FrozenInstanceError):
        tr.target = "error"  # type: ignore[misc]
    assert isinstance(states.TRANSITIONS, tuple)


def test_spot_checks() -> None:
    tr = states.next_state("available", "deploy")
    assert (tr.target, tr.target_provision_state) == ("deploying", "active")
    tr = states.next_state("manageable", "clean")
    assert (tr.target, tr.target_provision_state) == ("cleaning", "manageable")
    tr = states.next_state("manageable", "provide")
    assert (tr.target, tr.target_provision_state) == ("cleaning", "available")
    assert states.next_state("active", "delete").target == "deleting"
    assert states.next_state("wait call-back", "resume").target == "deploying"


def _walk(start: str, target: str | None, events: list[str]) -> list[tuple[str, str | None]]:
    path = []
    state = start
    for event in events:
        tr = states.next_state(state, event)
        state, target = tr.target, states.next_target(target, tr)
        path.append((state, target))
    return path


def test_manual_clean_keeps_manageable_target() -> None:
    assert _walk("manageable", None, ["clean", "wait", "hold", "unhold", "resume", "manage"]) == [
        ("cleaning", "manageable"),
        ("clean wait", "manageable"),
        ("clean hold", "manageable"),
        ("clean wait", "manageable"),
        ("cleaning", "manageable"),
        ("manageable", None),
    ]
    assert _walk("manageable", None, ["clean", "wait", "abort"])[-1] == ("clean failed", "manageable")


def test_undeploy_and_deploy_targets() -> None:
    assert _walk("active", None, ["delete", "clean", "wait", "resume", "done"]) == [
        ("deleting", "available"),
        ("cleaning", "available"),
        ("clean wait", "available"),
        ("cleaning", "available"),
        ("available", None),
    ]
    assert _walk("available", None, ["deploy", "wait", "resume", "done"]) == [
        ("deploying", "active"),
        ("wait call-back", "active"),
        ("deploying", "active"),
        ("active", None),
    ]
    # Leaving a flow takes the new operation's target, not the old one.
    assert _walk("wait call-back", "active", ["delete"]) == [("deleting", "available")]
    assert _walk("rescue failed", "rescue", ["unrescue"]) == [("unrescuing", "active")]
    assert _walk("unrescue failed", "active", ["rescue"]) == [("rescuing", "rescue")]
    assert _walk("service failed", "active", ["abort"]) == [("active", None)]


def test_state_groups() -> None:
    assert {"enroll", "manageable", "available", "active", "error", "rescue"} == states.STABLE_STATES
    for state in CONTRACT_STATES:
        assert states.is_stable(state) == (state in states.STABLE_STATES)
    assert not states.is_stable(None)
    assert {
        "deploying",
        "wait call-back",
        "cleaning",
        "clean wait",
        "inspecting",
        "inspect wait",
        "rescuing",
        "rescue wait",
        "service wait",
    } == states.LOOKUP_ALLOWED_STATES
    assert {"manageable", "enroll", "adopt failed", "available"} == states.DELETE_ALLOWED_STATES
    assert states.delete_allowed("available")
    assert not states.delete_allowed("available", allow_deleting_available=False)
    assert states.delete_allowed("enroll", allow_deleting_available=False)
    assert not states.delete_allowed("active")
    assert {
        "deploy failed",
        "inspecting",
        "inspect failed",
        "inspect wait",
        "clean failed",
        "error",
        "verifying",
        "adopt failed",
        "rescue failed",
        "unrescue failed",
        "service",
        "service hold",
        "service failed",
    } == states.PATCH_ALLOWED_WITH_TARGET
    assert {
        "deploy failed",
        "clean failed",
        "inspect failed",
        "rescue failed",
        "unrescue failed",
        "adopt failed",
        "service failed",
    } == states.FAILURE_STATES


def test_stuck_on_restart() -> None:
    expected = {
        "deploying": "deploy failed",
        "cleaning": "clean failed",
        "verifying": "enroll",
        "inspecting": "inspect failed",
        "adopting": "adopt failed",
        "rescuing": "rescue failed",
        "unrescuing": "unrescue failed",
        "deleting": "error",
        "servicing": "service failed",
    }
    assert frozenset(expected) == states.STUCK_ON_RESTART
    assert dict(states.FAILURE_STATE_OF) == expected
    # The sweeper reaches the failure state through the table's fail event.
    for state, failed in expected.items():
        assert states.next_state(state, "fail").target == failed
    with pytest.raises(TypeError):
        states.FAILURE_STATE_OF["active"] = "error"  # type: ignore[index]


def test_api_verbs() -> None:
    expected = {
        "active": ("deploy", (1, 1)),
        "deploy": ("deploy", (1, 73)),
        "rebuild": ("rebuild", (1, 1)),
        "deleted": ("delete", (1, 1)),
        "undeploy": ("delete", (1, 73)),
        "manage": ("manage", (1, 4)),
        "provide": ("provide", (1, 4)),
        "inspect": ("inspect", (1, 6)),
        "abort": ("abort", (1, 13)),
        "clean": ("clean", (1, 15)),
        "adopt": ("adopt", (1, 17)),
        "rescue": ("rescue", (1, 38)),
        "unrescue": ("unrescue", (1, 38)),
        "unhold": ("unhold", (1, 85)),
        "service": ("service", (1, 87)),
    }
    assert {k: tuple(v) for k, v in states.API_VERBS.items()} == expected
    for verb, (event, version) in expected.items():
        assert states.verb_to_event(verb) == event
        assert states.verb_min_version(verb) == version
        assert event in states.ALL_EVENTS
    for bad in ("done", "fail", "wait", "resume", "hold", "bogus", "deploying"):
        with pytest.raises(states.UnknownVerb) as info:
            states.verb_to_event(bad)
        assert isinstance(info.value, ValueError)
        assert info.value.verb == bad
        assert "could not be understood" in str(info.value)


def test_abort_min_version() -> None:
    assert states.abort_min_version("inspect wait") == (1, 41)
    assert states.abort_min_version("wait call-back") == (1, 110)
    assert states.abort_min_version("clean wait") == (1, 13)
    assert states.abort_min_version("rescue wait") == (1, 13)


def test_mermaid_diagram() -> None:
    text = states.mermaid_diagram()
    assert text.startswith("stateDiagram-v2\n")
    assert 'state "wait call-back" as wait_call_back' in text
    for state in CONTRACT_STATES:
        if " " in state:
            assert f'state "{state}" as {state.replace(" ", "_").replace("-", "_")}' in text
    assert "available --> deploying : deploy" in text
    assert "wait_call_back --> deploy_failed : fail, abort" in text
    edges = sum(1 for line in text.splitlines() if "-->" in line and "[*]" not in line)
    pairs = {(s, CONTRACT_TRANSITIONS[(s, e)][0]) for (s, e) in CONTRACT_TRANSITIONS}
    assert edges == len(pairs)


def _run_generator(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gen_states_doc.py"), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_docs_up_to_date() -> None:
    result = _run_generator("--check")
    assert result.returncode == 0, "docs/states.md is stale; run scripts/gen_states_doc.py\n" + result.stderr


def test_docs_check_detects_stale(tmp_path: Path) -> None:
    out = tmp_path / "states.md"
    assert _run_generator("--check", "--output", str(out)).returncode == 1  # missing
    assert _run_generator("--output", str(out)).returncode == 0
    assert _run_generator("--check", "--output", str(out)).returncode == 0
    out.write_text(out.read_text() + "edited\n")
    assert _run_generator("--check", "--output", str(out)).returncode == 1
    text = (ROOT / "docs" / "states.md").read_text()
    assert "```mermaid\nstateDiagram-v2\n" in text
    assert "| `manageable` | `clean` | `cleaning` | `manageable` |" in text
