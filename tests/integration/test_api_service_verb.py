"""The ``service`` provision verb over REST (microversion 1.87): checks in
Ironic's order (the state machine before the version, so an old client asking
where ``service`` cannot apply gets 400, not 406), ``service_steps`` required
and shaped like Ironic's schema, steps the node does not offer refused by the
conductor with the offered ones, and the ``service_step`` field from 1.87.

Ferrum does not advertise 1.87 yet (every version below it must be real
first), so requests at 1.87 go to a lab server built from the same handlers
(tests/labapi.py). The flow itself (steps run in order on an active node,
failures) is tests/integration/test_service_steps.py.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from tests.labapi import VersionedApi, versioned_api

V87, V86 = (1, 87), (1, 86)
STEP = {"interface": "management", "step": "apply_bios_settings", "args": {"settings": []}}


@pytest.fixture(scope="module")
async def api(stack: Any) -> AsyncIterator[VersionedApi]:
    async with versioned_api(stack, V87) as api:
        yield api


def fault(body: dict[str, Any]) -> str:
    return str(json.loads(body["error_message"])["faultstring"])


async def node_in(api: VersionedApi, state: str) -> dict[str, Any]:
    """A fake-hardware node driven to ``state`` (available or active) over REST."""
    _, node = await api.call((1, 52), "POST", "/v1/nodes", {"driver": "fake-hardware"}, expect=201)
    path = f"/v1/nodes/{node['uuid']}/states/provision"
    verbs = {"available": ("manage", "provide"), "active": ("manage", "provide", "active")}[state]
    for verb in verbs:
        await api.call((1, 52), "PUT", path, {"target": verb}, expect=202)
        deadline = time.monotonic() + 60
        while True:
            _, current = await api.call((1, 52), "GET", f"/v1/nodes/{node['uuid']}", expect=200)
            if current["target_provision_state"] is None and current["reservation"] is None:
                break
            assert time.monotonic() < deadline, current
            await asyncio.sleep(0.05)
    assert current["provision_state"] == state, current
    return current


async def test_service_is_checked_in_ironics_order(api: VersionedApi) -> None:
    old = min(V86, api.live_max)
    available, active = await node_in(api, "available"), await node_in(api, "active")
    body = {"target": "service", "service_steps": [STEP]}
    # Not actionable from available: 400 at any version, the state is checked first.
    for version in (old, V87):
        status, answer = await api.call(version, "PUT", f"/v1/nodes/{available['uuid']}/states/provision", body)
        assert status == 400 and "can not be performed on node" in fault(answer), answer
    # Actionable from active, but the client is too old: 406.
    status, answer = await api.call(old, "PUT", f"/v1/nodes/{active['uuid']}/states/provision", body)
    assert status == 406, answer
    _, unchanged = await api.call(V87, "GET", f"/v1/nodes/{active['uuid']}", expect=200)
    assert unchanged["provision_state"] == "active"


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ({"target": "service"}, '"service_steps" is required when setting target provision state to service'),
        ({"target": "service", "service_steps": []}, '"service_steps" is required'),
        ({"target": "service", "service_steps": [{**STEP, "priority": 10}]}, "Invalid service_steps"),
        ({"target": "service", "service_steps": [{**STEP, "interface": "network"}]}, "Invalid service_steps"),
        ({"target": "service", "service_steps": [{**STEP, "order": -1}]}, "Invalid service_steps"),
        ({"target": "service", "service_steps": [{**STEP, "execute_on_child_nodes": "yes"}]}, "Invalid service_steps"),
        (
            {"target": "service", "service_steps": [{**STEP, "limit_child_node_execution": "c1"}]},
            "Invalid service_steps",
        ),
        ({"target": "deleted", "service_steps": [STEP]}, '"service_steps" is only valid'),
        ({"target": "service", "service_steps": [STEP]}, "no interface of the node offers this service step"),
    ],
)
async def test_bad_service_requests_are_400_and_change_nothing(
    api: VersionedApi, body: dict[str, Any], words: str
) -> None:
    node = await node_in(api, "active")
    status, answer = await api.call(V87, "PUT", f"/v1/nodes/{node['uuid']}/states/provision", body)
    assert status == 400 and words in fault(answer), answer
    _, after = await api.call(V87, "GET", f"/v1/nodes/{node['uuid']}", expect=200)
    assert after["provision_state"] == "active" and after["last_error"] is None


async def test_service_step_is_a_node_field_from_187(api: VersionedApi) -> None:
    node = await node_in(api, "available")
    _, shown = await api.call(V87, "GET", f"/v1/nodes/{node['uuid']}", expect=200)
    assert shown["service_step"] == {}
    _, old = await api.call(min(V86, api.live_max), "GET", f"/v1/nodes/{node['uuid']}", expect=200)
    assert "service_step" not in old
    status, _ = await api.call(min(V86, api.live_max), "GET", f"/v1/nodes/{node['uuid']}?fields=service_step")
    assert status == 406
    _, some = await api.call(V87, "GET", f"/v1/nodes/{node['uuid']}?fields=uuid,service_step", expect=200)
    assert set(some) == {"uuid", "service_step", "links"}
