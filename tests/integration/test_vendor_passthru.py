"""Vendor passthru (API 1.1) over real REST on the live stack: node and
driver methods of the fake vendor interface (Ironic's FakeVendorB), the
no-vendor refusals, and Ferrum's ipxe_config driver passthru still served."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from typing import Any

import aiohttp
import pytest

V = {"X-OpenStack-Ironic-API-Version": "1.56"}


@pytest.fixture(scope="module")
async def session():
    async with aiohttp.ClientSession() as s:
        yield s


@pytest.fixture(scope="module")
def api(stack: Any) -> str:
    return stack.endpoints["api REST (Ironic v1)"]


async def call(
    session: aiohttp.ClientSession, method: str, url: str, body: Any = None, headers: dict[str, str] | None = None
) -> tuple[int, Any, str]:
    async with session.request(method, url, json=body, headers=V if headers is None else headers) as r:
        text = await r.text()
        try:
            data = json.loads(text) if text else None
        except ValueError:
            data = None
        return r.status, data, text


def fault(body: dict[str, Any]) -> str:
    return json.loads(body["error_message"])["faultstring"]


async def make_node(session: aiohttp.ClientSession, api: str, **fields: Any) -> dict[str, Any]:
    status, node, text = await call(
        session, "POST", f"{api}/v1/nodes", {"driver": "fake-hardware", "name": f"v-{uuid.uuid4().hex[:8]}", **fields}
    )
    assert status == 201, text
    return node


async def wait_unlocked(session: aiohttp.ClientSession, api: str, ident: str, timeout: float = 20) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        _, node, _ = await call(session, "GET", f"{api}/v1/nodes/{ident}")
        if node["reservation"] is None:
            return node
        assert time.monotonic() < deadline, f"{ident} still locked"
        await asyncio.sleep(0.05)


async def test_node_methods_are_listed(session, api) -> None:
    node = await make_node(session, api, vendor_interface="fake")
    status, methods, text = await call(session, "GET", f"{api}/v1/nodes/{node['uuid']}/vendor_passthru/methods")
    assert status == 200, text
    assert set(methods) == {"second_method", "third_method_sync", "fourth_method_shared_lock", "log_passthrough"}
    assert methods["third_method_sync"] == {
        "http_methods": ["POST"],
        "async": False,
        "description": "Test if the value of bar is meow",
        "attach": False,
        "require_exclusive_lock": True,
    }
    assert methods["second_method"]["async"] is True
    assert methods["fourth_method_shared_lock"]["require_exclusive_lock"] is False
    # By name too (1.5+).
    status, by_name, _ = await call(session, "GET", f"{api}/v1/nodes/{node['name']}/vendor_passthru/methods")
    assert status == 200 and by_name == methods


async def test_sync_method_returns_its_value(session, api) -> None:
    node = await make_node(session, api, vendor_interface="fake")
    url = f"{api}/v1/nodes/{node['uuid']}/vendor_passthru"
    status, value, text = await call(session, "POST", f"{url}?method=third_method_sync", {"bar": "meow"})
    assert (status, value) == (200, True), text
    status, value, _ = await call(session, "POST", f"{url}?method=third_method_sync", {"bar": "woof"})
    assert (status, value) == (200, False)
    # The method as the last path part, as python-ironicclient sends it.
    status, value, _ = await call(session, "POST", f"{url}/third_method_sync", {"bar": "meow"})
    assert (status, value) == (200, True)
    status, value, _ = await call(session, "PUT", f"{url}/third_method_sync", {"bar": "meow"})
    assert status == 400 and "does not support HTTP PUT" in fault(value)
    # A shared-lock synchronous-free method: async, answered 202 at once.
    status, value, text = await call(session, "POST", f"{url}?method=fourth_method_shared_lock", {"bar": "woof"})
    assert status == 202, text
    await wait_unlocked(session, api, node["uuid"])


async def test_async_method_is_accepted_and_runs_under_the_lock(session, api) -> None:
    node = await make_node(session, api, vendor_interface="fake")
    url = f"{api}/v1/nodes/{node['uuid']}/vendor_passthru?method=second_method"
    status, value, text = await call(session, "POST", url, {"bar": "kazoo"})
    assert status == 202 and value is None, text
    after = await wait_unlocked(session, api, node["uuid"])
    assert after["last_error"] is None


async def test_bad_calls_are_400(session, api) -> None:
    node = await make_node(session, api, vendor_interface="fake")
    url = f"{api}/v1/nodes/{node['uuid']}/vendor_passthru"
    status, body, _ = await call(session, "POST", url, {"bar": "x"})
    assert status == 400 and "Method not specified" in fault(body)
    status, body, _ = await call(session, "POST", f"{url}?method=no_such_method", {"bar": "x"})
    assert status == 400 and "No handler for method no_such_method" in fault(body)
    for verb in ("GET", "PUT", "PATCH", "DELETE"):
        status, body, _ = await call(session, verb, f"{url}?method=third_method_sync", {"bar": "meow"})
        assert status == 400 and f"does not support HTTP {verb}" in fault(body), (verb, body)
    status, body, _ = await call(session, "POST", f"{url}?method=third_method_sync", {})
    assert status == 400 and "Parameter 'bar' not passed" in fault(body)
    status, _, _ = await call(session, "POST", f"{api}/v1/nodes/{uuid.uuid4()}/vendor_passthru?method=x", {})
    assert status == 404
    # Nothing was locked or changed by the refusals.
    after = await wait_unlocked(session, api, node["uuid"])
    assert after["last_error"] is None and after["reservation"] is None


async def test_no_vendor_is_unsupported(session, api) -> None:
    node = await make_node(session, api, vendor_interface="no-vendor")
    status, methods, _ = await call(session, "GET", f"{api}/v1/nodes/{node['uuid']}/vendor_passthru/methods")
    assert (status, methods) == (200, {})
    status, body, _ = await call(
        session, "POST", f"{api}/v1/nodes/{node['uuid']}/vendor_passthru?method=second_method", {"bar": "kazoo"}
    )
    assert status == 400 and "Unsupported" in fault(body) and "no-vendor" in fault(body)


async def test_driver_level_passthru(session, api) -> None:
    # Ironic's fake vendor interface has node methods only.
    status, methods, text = await call(session, "GET", f"{api}/v1/drivers/fake-hardware/vendor_passthru/methods")
    assert (status, methods) == (200, {}), text
    status, body, _ = await call(session, "POST", f"{api}/v1/drivers/fake-hardware/vendor_passthru?method=lookup", {})
    assert status == 400 and "lookup" in fault(body)
    status, body, _ = await call(session, "POST", f"{api}/v1/drivers/fake-hardware/vendor_passthru", {})
    assert status == 400 and "Method not specified" in fault(body)
    status, body, _ = await call(session, "POST", f"{api}/v1/drivers/fake-hardware/vendor_passthru/lookup", {})
    assert status == 400 and "No handler for method lookup" in fault(body)
    status, _, _ = await call(session, "GET", f"{api}/v1/drivers/no-such-driver/vendor_passthru/methods")
    assert status == 404
    status, _, _ = await call(session, "GET", f"{api}/v1/drivers/no-such-driver/vendor_passthru?method=x")
    assert status == 404


async def test_ipxe_config_passthru_still_served(session, api) -> None:
    """The dedicated public route answers a plain-text iPXE script, not the generic passthru."""
    async with session.get(f"{api}/v1/drivers/fake-hardware/vendor_passthru/ipxe_config") as r:
        text = await r.text()
        assert r.status == 400 and text.startswith("#!ipxe") and "node_uuid" in text


async def test_unmodified_clients_use_vendor_passthru(session, api) -> None:
    """python-ironicclient's `baremetal` CLI and openstacksdk read and call the methods."""
    import os
    import sys
    from pathlib import Path

    import openstack

    node = await make_node(session, api, vendor_interface="fake")
    env = {**os.environ, "OS_AUTH_TYPE": "none", "OS_ENDPOINT": api}

    async def baremetal(*args: str) -> tuple[int, str, str]:
        process = await asyncio.create_subprocess_exec(
            str(Path(sys.executable).with_name("baremetal")),
            *args,
            env=env,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(process.communicate(), 90)
        return process.returncode or 0, out.decode(), err.decode()

    rc, out, err = await baremetal("node", "passthru", "list", node["uuid"], "-f", "json")
    assert rc == 0, err
    listed = {row["Name"]: row for row in json.loads(out)}
    assert set(listed) == {"second_method", "third_method_sync", "fourth_method_shared_lock", "log_passthrough"}
    # The CLI shows a dict result only (a bare True is not printable there, with Ironic too): call the async one.
    rc, out, err = await baremetal("node", "passthru", "call", "--arg", "bar=kazoo", node["uuid"], "second_method")
    assert rc == 0, (out, err)
    await wait_unlocked(session, api, node["uuid"])
    rc, out, err = await baremetal("node", "passthru", "call", "--arg", "bar=x", node["uuid"], "nope")
    assert rc != 0 and "No handler for method nope" in (out + err)
    rc, out, err = await baremetal("driver", "passthru", "list", "fake-hardware", "-f", "json")
    assert rc == 0 and json.loads(out) == [], (out, err)

    def sdk() -> tuple[Any, Any]:
        conn = openstack.connection.Connection(auth_type="none", baremetal_endpoint_override=api)
        try:
            methods = conn.baremetal.list_node_vendor_passthru(node["uuid"])
            value = conn.baremetal.call_node_vendor_passthru(node["uuid"], "POST", "third_method_sync", {"bar": "meow"})
            return methods, value
        finally:
            conn.close()

    methods, value = await asyncio.to_thread(sdk)
    assert "third_method_sync" in methods
    assert value.status_code == 200 and value.json() is True  # the SDK hands back the HTTP response
