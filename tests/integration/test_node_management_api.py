"""Indicators (1.63), deploy_steps (1.69), disable_ramdisk (1.70) and the
boot mode / secure boot verbs (1.76) over real REST.

The live stack still advertises 1.56, so there every one of these is refused
(404 for the endpoints, 406 for the provision fields), as Ironic answers a
client that is too old. The features themselves are exercised through a
second real HTTP server built from the stack's own pool and conductor router
with every route of the api, whose version middleware honours headers up to
1.78: each request names its microversion, so the refusal one version below
and the success at the version are both checked against the same handlers
and the same conductor.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from services.api.context import ApiContext
from services.api.middlewares import error_middleware
from services.api.routes import add_routes

HIGHEST = (1, 78)


def v(minor: int) -> dict[str, str]:
    return {"X-OpenStack-Ironic-API-Version": f"1.{minor}"}


@web.middleware
async def versions_up_to_1_78(request: web.Request, handler: Any) -> web.StreamResponse:
    """The header's version (1.1 when absent), allowed up to 1.78."""
    raw = request.headers.get("X-OpenStack-Ironic-API-Version", "1.1")
    major, minor = (int(x) for x in raw.split("."))
    assert major == 1 and (1, minor) <= HIGHEST
    request["version"] = (1, minor)
    return await handler(request)


@pytest.fixture(scope="module")
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as s:
        yield s


@pytest.fixture(scope="module")
def live(stack: Any) -> str:
    return stack.endpoints["api REST (Ironic v1)"]


@pytest.fixture(scope="module")
async def api(stack: Any) -> AsyncIterator[str]:
    service = next(s for s in stack.services if s.name == "api")
    app = web.Application(middlewares=[error_middleware, versions_up_to_1_78])
    add_routes(app, ApiContext(service.pool, service.router, service.settings, internal_token=service.internal_token))
    server = TestServer(app, host="127.0.0.1", port=0)
    await server.start_server()
    try:
        yield str(server.make_url("")).rstrip("/")
    finally:
        await server.close()


async def call(
    session: aiohttp.ClientSession, method: str, url: str, body: Any = None, headers: dict[str, str] | None = None
) -> tuple[int, Any]:
    async with session.request(method, url, json=body, headers=headers or v(56)) as r:
        text = await r.text()
        return r.status, (json.loads(text) if text else None)


def fault(body: dict[str, Any]) -> str:
    return json.loads(body["error_message"])["faultstring"]


async def make_node(session: aiohttp.ClientSession, base: str, **fields: Any) -> dict[str, Any]:
    status, node = await call(
        session, "POST", f"{base}/v1/nodes", {"driver": "fake-hardware", "name": f"m-{uuid.uuid4().hex[:8]}", **fields}
    )
    assert status == 201, node
    return node


async def wait_for(
    session: aiohttp.ClientSession, base: str, ident: str, check: Any, timeout: float = 30
) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        _, node = await call(session, "GET", f"{base}/v1/nodes/{ident}", headers=v(78))
        if check(node):
            return node
        assert time.monotonic() < deadline, (
            f"{ident}: condition not reached: {node['provision_state']} {node['last_error']}"
        )
        await asyncio.sleep(0.05)


def settled(state: str) -> Any:
    return lambda n: n["provision_state"] == state and n["reservation"] is None


async def provision(
    session: aiohttp.ClientSession, base: str, ident: str, body: dict[str, Any], minor: int = 78
) -> tuple[int, Any]:
    return await call(session, "PUT", f"{base}/v1/nodes/{ident}/states/provision", body, headers=v(minor))


async def available_node(session: aiohttp.ClientSession, base: str) -> dict[str, Any]:
    node = await make_node(session, base)
    assert (await provision(session, base, node["uuid"], {"target": "manage"}))[0] == 202
    await wait_for(session, base, node["uuid"], settled("manageable"))
    assert (await provision(session, base, node["uuid"], {"target": "provide"}))[0] == 202
    return await wait_for(session, base, node["uuid"], settled("available"))


async def history(session: aiohttp.ClientSession, base: str, ident: str) -> list[str]:
    status, body = await call(session, "GET", f"{base}/v1/nodes/{ident}/history?detail=true", headers=v(78))
    assert status == 200, body
    return [h["event"] for h in body["history"]]


# -- the live stack (1.56) refuses them all ------------------------------------------


async def test_live_stack_refuses_features_above_its_maximum(session, live) -> None:
    node = await make_node(session, live)
    ident = node["uuid"]
    for method, path, body in (
        ("GET", "management/indicators", None),
        ("GET", "management/indicators/led@system", None),
        ("PUT", "management/indicators/led@system", {"state": "ON"}),
        ("PUT", "states/boot_mode", {"target": "uefi"}),
        ("PUT", "states/secure_boot", {"target": True}),
    ):
        status, _ = await call(session, method, f"{live}/v1/nodes/{ident}/{path}", body)
        assert status == 404, (method, path, status)
    status, _ = await call(
        session, "PUT", f"{live}/v1/nodes/{ident}/states/provision", {"target": "manage", "disable_ramdisk": True}
    )
    assert status == 406
    _, after = await call(session, "GET", f"{live}/v1/nodes/{ident}")
    assert after["provision_state"] == "enroll" and after["reservation"] is None


# -- indicators (1.63) ---------------------------------------------------------------


async def test_indicators(session, api) -> None:
    node = await make_node(session, api)
    base = f"{api}/v1/nodes/{node['uuid']}/management/indicators"
    assert (await call(session, "GET", base, headers=v(62)))[0] == 404
    status, body = await call(session, "GET", base, headers=v(63))
    assert status == 200, body
    by_name = {i["name"]: i for i in body["indicators"]}
    assert set(by_name) == {"led-0@chassis", "led@system"}
    assert by_name["led@system"]["component"] == "system" and by_name["led@system"]["readonly"] is False
    assert by_name["led@system"]["states"] == ["BLINKING", "OFF", "ON"]
    assert by_name["led-0@chassis"]["readonly"] is True
    assert by_name["led@system"]["links"][0]["href"].endswith(
        f"/v1/nodes/{node['uuid']}/management/indicators/led@system"
    )

    assert await call(session, "GET", f"{base}/led@system", headers=v(63)) == (200, {"state": "ON"})
    assert (await call(session, "PUT", f"{base}/led@system", {"state": "BLINKING"}, headers=v(62)))[0] == 404
    assert (await call(session, "PUT", f"{base}/led@system", {"state": "BLINKING"}, headers=v(63)))[0] == 204
    assert await call(session, "GET", f"{base}/led@system", headers=v(63)) == (200, {"state": "BLINKING"})
    # By node name too.
    assert await call(
        session, "GET", f"{api}/v1/nodes/{node['name']}/management/indicators/led@system", headers=v(63)
    ) == (200, {"state": "BLINKING"})

    for path, body, needle in (
        ("led-0@chassis", {"state": "OFF"}, "read-only"),
        ("led@system", {"state": "PURPLE"}, "Invalid indicator state"),
        ("led@disk", {"state": "ON"}, "Invalid component"),
        ("nope@system", {"state": "ON"}, "Invalid indicator"),
        ("led", {"state": "ON"}, "Malformed indicator name"),
        ("led@system", {}, "state"),
    ):
        status, err = await call(session, "PUT", f"{base}/{path}", body, headers=v(63))
        assert status == 400 and needle in fault(err), (path, status, err)
    assert await call(session, "GET", f"{base}/led@system", headers=v(63)) == (200, {"state": "BLINKING"})


async def test_indicators_unsupported_by_noop_style_management(session, api) -> None:
    """An interface without indicators answers Ironic's 400 'unsupported'."""
    status, drivers = await call(session, "GET", f"{api}/v1/drivers/fake-hardware", headers=v(78))
    managements = drivers["enabled_management_interfaces"]
    others = [m for m in managements if m != "fake"]
    if not others:
        pytest.fail(f"the stack enables only {managements}: cannot check another management interface")
    node = await make_node(session, api, management_interface=others[0])
    status, err = await call(session, "GET", f"{api}/v1/nodes/{node['uuid']}/management/indicators", headers=v(63))
    assert status == 400, err


# -- boot mode and secure boot (1.76) --------------------------------------------------


async def test_boot_mode_and_secure_boot(session, api) -> None:
    node = await make_node(session, api)
    ident = node["uuid"]
    url = f"{api}/v1/nodes/{ident}/states"
    _, node = await call(session, "GET", f"{api}/v1/nodes/{ident}", headers=v(78))
    assert node["boot_mode"] is None and node["secure_boot"] is None
    assert (await call(session, "PUT", f"{url}/boot_mode", {"target": "uefi"}, headers=v(75)))[0] == 404
    assert (await call(session, "PUT", f"{url}/secure_boot", {"target": True}, headers=v(75)))[0] == 404
    for body in ({"target": "efi"}, {"target": None}, {}, {"target": "uefi", "x": 1}):
        status, err = await call(session, "PUT", f"{url}/boot_mode", body, headers=v(76))
        assert status == 400, (body, err)
    for wrong in ({"target": "yes"}, {"target": 1}):
        status, err = await call(session, "PUT", f"{url}/secure_boot", wrong, headers=v(76))
        assert status == 400, (body, err)

    status, _ = await call(session, "PUT", f"{url}/boot_mode", {"target": "bios"}, headers=v(76))
    assert status == 202
    await wait_for(session, api, ident, lambda n: n["boot_mode"] == "bios" and n["reservation"] is None)
    status, err = await call(session, "PUT", f"{url}/secure_boot", {"target": True}, headers=v(76))
    assert status == 400 and "UEFI" in fault(err)  # secure boot needs UEFI
    assert (await call(session, "PUT", f"{url}/boot_mode", {"target": "uefi"}, headers=v(76)))[0] == 202
    await wait_for(session, api, ident, lambda n: n["boot_mode"] == "uefi" and n["reservation"] is None)
    assert (await call(session, "PUT", f"{url}/secure_boot", {"target": True}, headers=v(76)))[0] == 202
    node = await wait_for(session, api, ident, lambda n: n["secure_boot"] is True and n["reservation"] is None)
    assert node["last_error"] is None
    status, states = await call(session, "GET", url, headers=v(76))
    assert states["boot_mode"] == "uefi" and states["secure_boot"] is True
    events = await history(session, api, ident)
    assert (
        "boot mode set to bios" in events and "boot mode set to uefi" in events and "secure boot set to True" in events
    )


# -- deploy_steps (1.69) -----------------------------------------------------------------


async def test_deploy_steps_refused_below_1_69_and_when_unknown(session, api) -> None:
    node = await available_node(session, api)
    ident = node["uuid"]
    step = {"interface": "deploy", "step": "fake_step", "args": {}, "priority": 150}
    assert (await provision(session, api, ident, {"target": "active", "deploy_steps": [step]}, minor=68))[0] == 406
    for bad, needle in (
        ([{"interface": "deploy", "step": "no_such_step", "args": {}, "priority": 10}], "no_such_step"),
        ([{"interface": "console", "step": "x", "args": {}, "priority": 1}], "Invalid deploy step"),
        ([{"interface": "deploy", "step": "fake_step", "priority": 1}], "Invalid deploy step"),
        ([{"interface": "deploy", "step": "fake_step", "args": {}, "priority": -1}], "Invalid deploy step"),
        ([step, step], "Duplicate"),
        ([{"interface": "deploy", "step": "deploy", "args": {}, "priority": 0}], "cannot be disabled"),
        ("deploy.fake_step", "list"),
    ):
        status, err = await provision(session, api, ident, {"target": "active", "deploy_steps": bad}, minor=69)
        assert status == 400 and needle in fault(err), (bad, status, err)
    status, err = await provision(session, api, ident, {"target": "manage", "deploy_steps": [step]}, minor=69)
    assert status == 400 and "only valid" in fault(err)
    after = await wait_for(session, api, ident, settled("available"))
    assert after["last_error"] is None and "deploy_steps" not in after["driver_internal_info"]


async def test_user_deploy_steps_run_in_order_and_show_while_running(session, api) -> None:
    node = await available_node(session, api)
    ident = node["uuid"]
    steps = [{"interface": "deploy", "step": "fake_step", "args": {"delay": 3}, "priority": 150}]
    status, err = await provision(session, api, ident, {"target": "active", "deploy_steps": steps}, minor=69)
    assert status == 202, err
    running = await wait_for(session, api, ident, lambda n: n["deploy_step"].get("step") == "fake_step", timeout=20)
    assert running["deploy_step"] == {"interface": "deploy", "step": "fake_step", "priority": 150, "args": {"delay": 3}}
    assert running["provision_state"] == "deploying"
    done = await wait_for(session, api, ident, settled("active"))
    assert done["deploy_step"] == {} and done["last_error"] is None
    assert [s["step"] for s in done["driver_internal_info"]["deploy_steps"]] == ["fake_step", "deploy"]
    events = [e for e in await history(session, api, ident) if e.startswith("deploy step")]
    assert events == [
        "deploy step deploy.fake_step (priority 150) started",
        "deploy step deploy.deploy (priority 100) started",
    ]

    # Rebuild with the step after deploy.deploy this time.
    steps = [{"interface": "deploy", "step": "fake_step", "args": {}, "priority": 50}]
    assert (await provision(session, api, ident, {"target": "rebuild", "deploy_steps": steps}, minor=69))[0] == 202
    done = await wait_for(session, api, ident, settled("active"))
    events = [e for e in await history(session, api, ident) if e.startswith("deploy step")]
    assert events[2:] == [
        "deploy step deploy.deploy (priority 100) started",
        "deploy step deploy.fake_step (priority 50) started",
    ]


# -- disable_ramdisk (1.70) ---------------------------------------------------------------


async def test_disable_ramdisk_with_manual_cleaning(session, api) -> None:
    node = await make_node(session, api)
    ident = node["uuid"]
    assert (await provision(session, api, ident, {"target": "manage"}))[0] == 202
    await wait_for(session, api, ident, settled("manageable"))
    clean = {
        "target": "clean",
        "clean_steps": [{"interface": "deploy", "step": "erase_devices_metadata"}],
        "disable_ramdisk": True,
    }
    assert (await provision(session, api, ident, clean, minor=69))[0] == 406
    status, err = await provision(session, api, ident, {"target": "provide", "disable_ramdisk": True}, minor=70)
    assert status == 400 and "manual cleaning" in fault(err)
    status, err = await provision(session, api, ident, {**clean, "disable_ramdisk": "yes"}, minor=70)
    assert status == 400 and "boolean" in fault(err)
    await wait_for(session, api, ident, settled("manageable"))
    status, err = await provision(session, api, ident, clean, minor=70)
    assert status == 202, err
    done = await wait_for(session, api, ident, settled("manageable"))
    assert done["last_error"] is None and "cleaning_disable_ramdisk" not in done["driver_internal_info"]
    assert any("manual cleaning finished (ramdisk disabled)" in e for e in await history(session, api, ident))


async def test_direct_deploy_steps_keep_their_place(session, api) -> None:
    """direct's agent-run steps can be named only as they are; moving one is a 400 that changes nothing."""
    node = await make_node(
        session,
        api,
        deploy_interface="direct",
        instance_info={"image_source": "http://images.example/disk.img", "image_checksum": "0" * 64},
        automated_clean=False,  # no machine here: cleaning would wait for its agent
    )
    ident = node["uuid"]
    assert (await provision(session, api, ident, {"target": "manage"}))[0] == 202
    await wait_for(session, api, ident, settled("manageable"))
    assert (await provision(session, api, ident, {"target": "provide"}))[0] == 202
    await wait_for(session, api, ident, settled("available"))
    for step, needle in (
        ({"interface": "deploy", "step": "write_image", "args": {}, "priority": 150}, "fixed place"),
        ({"interface": "deploy", "step": "write_image", "args": {}, "priority": 0}, "fixed place"),
        ({"interface": "deploy", "step": "boot_instance", "args": {"x": 1}, "priority": 20}, "fixed place"),
        ({"interface": "deploy", "step": "fake_step", "args": {}, "priority": 150}, "fake_step"),
    ):
        status, err = await provision(session, api, ident, {"target": "active", "deploy_steps": [step]}, minor=69)
        assert status == 400 and needle in fault(err), (step, status, err)
    after = await wait_for(session, api, ident, settled("available"))
    assert after["last_error"] is None and after["deploy_step"] == {}


async def test_deploy_templates_named_by_instance_traits_add_their_steps(session, api) -> None:
    """Deploy templates (1.55) named by instance_info.traits add their steps to a 1.56 deploy."""
    name = f"CUSTOM_FAKE_{uuid.uuid4().hex[:8].upper()}"
    status, body = await call(
        session,
        "POST",
        f"{api}/v1/deploy_templates",
        {"name": name, "steps": [{"interface": "deploy", "step": "fake_step", "args": {"delay": 0}, "priority": 120}]},
    )
    assert status == 201, body
    bad = f"CUSTOM_BIOS_{uuid.uuid4().hex[:8].upper()}"
    status, body = await call(
        session,
        "POST",
        f"{api}/v1/deploy_templates",
        {"name": bad, "steps": [{"interface": "bios", "step": "apply_configuration", "args": {}, "priority": 110}]},
    )
    assert status == 201, body

    node = await available_node(session, api)
    ident = node["uuid"]
    status, _ = await call(
        session,
        "PATCH",
        f"{api}/v1/nodes/{ident}",
        [{"op": "add", "path": "/instance_info/traits", "value": [name, bad]}],
    )
    assert status == 200
    status, err = await provision(session, api, ident, {"target": "active"}, minor=56)
    assert status == 400 and "bios.apply_configuration" in fault(err) and "deploy template" in fault(err)
    assert (await wait_for(session, api, ident, settled("available")))["last_error"] is None

    status, _ = await call(
        session,
        "PATCH",
        f"{api}/v1/nodes/{ident}",
        [{"op": "replace", "path": "/instance_info/traits", "value": [name, "CUSTOM_NO_TEMPLATE"]}],
    )
    assert status == 200
    assert (await provision(session, api, ident, {"target": "active"}, minor=56))[0] == 202
    done = await wait_for(session, api, ident, settled("active"))
    assert done["last_error"] is None
    assert [e for e in await history(session, api, ident) if e.startswith("deploy step")] == [
        "deploy step deploy.fake_step (priority 120) started",
        "deploy step deploy.deploy (priority 100) started",
    ]
