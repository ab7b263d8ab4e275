"""Inspection rules over REST (microversion 1.96): CRUD with Ironic's rules and
messages, refused below 1.96 as Ironic refuses it (GET 404, writes 405).

Ferrum does not advertise 1.96 yet (every version below it must be real
first), so requests at 1.96 go to a lab server built from the same handlers
(tests/labapi.py); requests below go to the live api.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from tests.labapi import VersionedApi, versioned_api

V96, V95 = (1, 96), (1, 95)
RULE = "5b3e0a4e-0000-4000-8000-0000000000a1"
ACTIONS = [{"op": "add-trait", "args": {"name": "CUSTOM_MANY_CPUS"}}]
CONDITIONS = [{"op": "gt", "args": {"values": ["{inventory[cpu][count]}", "15"], "force_strings": True}}]


@pytest.fixture(scope="module")
async def api(stack: Any) -> AsyncIterator[VersionedApi]:
    async with versioned_api(stack, V96) as api:
        yield api


def fault(body: dict[str, Any]) -> str:
    return str(json.loads(body["error_message"])["faultstring"])


async def test_below_196_the_resource_does_not_exist(api: VersionedApi) -> None:
    old = min(V95, api.live_max)
    for method, path, status in (
        ("GET", "/v1/inspection_rules", 404),
        ("GET", f"/v1/inspection_rules/{RULE}", 404),
        ("POST", "/v1/inspection_rules", 405),
        ("PATCH", f"/v1/inspection_rules/{RULE}", 405),
        ("DELETE", f"/v1/inspection_rules/{RULE}", 405),
    ):
        body: Any = {"actions": ACTIONS} if method == "POST" else [] if method == "PATCH" else None
        got, _ = await api.call(old, method, path, body)
        assert got == status, (method, path, got)
    _, root = await api.call(old, "GET", "/v1/", expect=200)
    assert "inspection_rules" not in root
    _, root = await api.call(V96, "GET", "/v1/", expect=200)
    assert root["inspection_rules"][0]["href"].endswith("/v1/inspection_rules/")


async def test_a_rule_is_created_listed_read_patched_and_deleted(api: VersionedApi) -> None:
    rule = {"uuid": RULE, "description": "tag big machines", "priority": 50, "conditions": CONDITIONS}
    _, created = await api.call(V96, "POST", "/v1/inspection_rules", {**rule, "actions": ACTIONS}, expect=201)
    assert created["uuid"] == RULE and created["phase"] == "main" and created["sensitive"] is False
    assert created["conditions"] == CONDITIONS and created["actions"] == ACTIONS
    assert created["links"][0]["href"].endswith(f"/v1/inspection_rules/{RULE}")
    _, second = await api.call(V96, "POST", "/v1/inspection_rules", {"actions": ACTIONS}, expect=201)
    assert second["uuid"] != RULE and second["priority"] == 0 and second["description"] is None

    _, listed = await api.call(V96, "GET", "/v1/inspection_rules?sort_key=priority&sort_dir=desc", expect=200)
    assert [r["uuid"] for r in listed["inspection_rules"]] == [RULE, second["uuid"]]
    assert set(listed["inspection_rules"][0]) == {"uuid", "priority", "phase", "description", "links"}
    _, detailed = await api.call(V96, "GET", "/v1/inspection_rules?detail=true&limit=1", expect=200)
    assert detailed["inspection_rules"][0]["actions"] == ACTIONS and "next" in detailed
    _, some = await api.call(V96, "GET", f"/v1/inspection_rules/{RULE}?fields=uuid,actions", expect=200)
    assert set(some) == {"uuid", "actions", "links"}
    _, none = await api.call(V96, "GET", "/v1/inspection_rules?phase=other", expect=200)
    assert none["inspection_rules"] == []

    patch = [{"op": "replace", "path": "/priority", "value": 70}, {"op": "remove", "path": "/conditions"}]
    _, patched = await api.call(V96, "PATCH", f"/v1/inspection_rules/{RULE}", patch, expect=200)
    assert patched["priority"] == 70 and patched["conditions"] == [] and patched["updated_at"] is not None
    # A patch that leaves an invalid rule is refused, and changes nothing.
    status, body = await api.call(
        V96, "PATCH", f"/v1/inspection_rules/{RULE}", [{"op": "replace", "path": "/actions", "value": []}]
    )
    assert status == 400 and "actions is required" in fault(body)
    status, body = await api.call(
        V96, "PATCH", f"/v1/inspection_rules/{RULE}", [{"op": "replace", "path": "/created_at", "value": "x"}]
    )
    assert status == 400 and "internal attribute" in fault(body)
    _, kept = await api.call(V96, "GET", f"/v1/inspection_rules/{RULE}", expect=200)
    assert kept["actions"] == ACTIONS and kept["priority"] == 70

    for ident in (RULE, second["uuid"]):
        await api.call(V96, "DELETE", f"/v1/inspection_rules/{ident}", expect=204)
    status, body = await api.call(V96, "GET", f"/v1/inspection_rules/{RULE}")
    assert status == 404 and fault(body) == f"Rule {RULE} could not be found."
    status, _ = await api.call(V96, "DELETE", f"/v1/inspection_rules/{RULE}")
    assert status == 404


async def test_a_sensitive_rule_hides_its_operations_and_stays_sensitive(api: VersionedApi) -> None:
    secret = [{"op": "set-attribute", "args": {"path": "/driver_info/redfish_password", "value": "s3cret"}}]
    _, rule = await api.call(V96, "POST", "/v1/inspection_rules", {"sensitive": True, "actions": secret}, expect=201)
    assert rule["sensitive"] is True and rule["actions"] is None and rule["conditions"] is None
    _, shown = await api.call(V96, "GET", "/v1/inspection_rules?detail=true", expect=200)
    assert "s3cret" not in json.dumps(shown)
    for value in (False, None):
        op = {"op": "replace", "path": "/sensitive", "value": value}
        status, body = await api.call(V96, "PATCH", f"/v1/inspection_rules/{rule['uuid']}", [op])
        assert status == 400 and fault(body) == "Inspection rules cannot have the sensitive flag unset.", body
    status, body = await api.call(
        V96, "PATCH", f"/v1/inspection_rules/{rule['uuid']}", [{"op": "remove", "path": "/sensitive"}]
    )
    assert status == 400
    await api.call(V96, "DELETE", f"/v1/inspection_rules/{rule['uuid']}", expect=204)


@pytest.mark.parametrize(
    ("body", "status", "words"),
    [
        ({}, 400, "actions is required"),
        ({"actions": []}, 400, "actions is required"),
        ({"actions": [{"op": "reboot"}]}, 400, "Unsupported action operator: reboot"),
        ({"actions": ACTIONS, "conditions": [{"op": "!!eq", "args": {"values": []}}]}, 400, "exclamation"),
        ({"actions": ACTIONS, "priority": 10000}, 400, "Priority must be between 0 and 9999"),
        ({"actions": ACTIONS, "phase": "early"}, 400, "Invalid phase: early. Valid phases are: main"),
        ({"actions": ACTIONS, "scope": "x"}, 400, "Additional properties are not allowed"),
        ({"actions": [{"op": "add-trait", "args": {}}]}, 400, "Invalid parameters for action operator add-trait"),
        ({"actions": ACTIONS, "uuid": "not-a-uuid"}, 400, "Expected a UUID"),
    ],
)
async def test_bad_rules_are_refused_with_ironics_message(
    api: VersionedApi, body: dict[str, Any], status: int, words: str
) -> None:
    got, answer = await api.call(V96, "POST", "/v1/inspection_rules", body)
    assert got == status and words in fault(answer), (got, answer)
    _, listed = await api.call(V96, "GET", "/v1/inspection_rules", expect=200)
    assert listed["inspection_rules"] == []  # nothing was stored


async def test_bad_queries_and_identifiers_are_400_and_duplicates_409(api: VersionedApi) -> None:
    for query, words in (
        ("?sort_key=actions", "invalid field for sorting"),
        ("?detail=true&fields=uuid", "Can not specify ?detail=True and fields"),
        ("?fields=uuid,bogus", "bogus"),
        ("?colour=blue", "Unknown query parameter(s): colour"),
        ("?marker=5b3e0a4e-0000-4000-8000-0000000000ff", "Marker"),
    ):
        status, body = await api.call(V96, "GET", f"/v1/inspection_rules{query}")
        assert status == 400 and words in fault(body), (query, body)
    status, body = await api.call(V96, "GET", "/v1/inspection_rules/not-a-uuid")
    assert status == 400 and "Expected a UUID" in fault(body)
    await api.call(V96, "POST", "/v1/inspection_rules", {"uuid": RULE, "actions": ACTIONS}, expect=201)
    status, body = await api.call(V96, "POST", "/v1/inspection_rules", {"uuid": RULE, "actions": ACTIONS})
    assert status == 409 and fault(body) == f"A rule with UUID {RULE} already exists."
    await api.call(V96, "DELETE", f"/v1/inspection_rules/{RULE}", expect=204)
