"""http_basic auth as Ironic standalone does it: bcrypt htpasswd, public
discovery routes, 401 with WWW-Authenticate otherwise."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import sys
from pathlib import Path

import aiohttp
import bcrypt
import pytest

from services.runtime import ALL_SERVICES_ORDER, RunningStack
from tests.conftest import test_settings

V = {"X-OpenStack-Ironic-API-Version": "1.56"}


@pytest.fixture(scope="module")
async def secured(database_url: str, tmp_path_factory: pytest.TempPathFactory):
    state = tmp_path_factory.mktemp("auth")
    htpasswd = state / "htpasswd"
    htpasswd.write_text(
        "admin:" + bcrypt.hashpw(b"s3cret", bcrypt.gensalt(rounds=4)).decode().replace("$2b$", "$2y$") + "\n"
    )
    settings = test_settings(
        database_url,
        state,
        api={"port": 0, "grpc_port": 0, "auth_strategy": "http_basic", "htpasswd_file": str(htpasswd)},
        conductor={"hostname": "auth-conductor", "grpc_port": 0, "metrics_port": 0},
    )
    stack = RunningStack()
    await stack.start(settings, list(ALL_SERVICES_ORDER))
    yield stack.endpoints["api REST (Ironic v1)"]
    await stack.close()


def basic(user: str, password: str) -> dict[str, str]:
    return {**V, "Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


async def test_public_and_protected_routes(secured: str) -> None:
    async with aiohttp.ClientSession() as session:
        for path in ("/", "/v1"):
            async with session.get(secured + path) as r:
                assert r.status == 200, path
        for headers in (V, basic("admin", "wrong"), basic("nobody", "s3cret"), {**V, "Authorization": "Basic !!!"}):
            async with session.get(secured + "/v1/nodes", headers=headers) as r:
                assert r.status == 401
                assert r.headers["WWW-Authenticate"].startswith("Basic")
                assert "faultstring" in json.loads((await r.json())["error_message"])
        async with session.post(
            secured + "/v1/nodes", json={"driver": "fake-hardware", "name": "nope"}, headers=V
        ) as r:
            assert r.status == 401
        async with session.post(
            secured + "/v1/nodes", json={"driver": "fake-hardware", "name": "auth-1"}, headers=basic("admin", "s3cret")
        ) as r:
            assert r.status == 201
        async with session.get(secured + "/v1/nodes", headers=basic("admin", "s3cret")) as r:
            assert [n["name"] for n in (await r.json())["nodes"]] == ["auth-1"]  # the 401 create changed nothing


async def test_baremetal_cli_with_http_basic(secured: str) -> None:
    env = {
        **os.environ,
        "OS_AUTH_TYPE": "http_basic",
        "OS_ENDPOINT": secured,
        "OS_USERNAME": "admin",
        "OS_PASSWORD": "s3cret",
    }
    process = await asyncio.create_subprocess_exec(
        str(Path(sys.executable).with_name("baremetal")),
        "node",
        "list",
        "-f",
        "json",
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), 90)
    assert process.returncode == 0, err.decode()
    assert [{k.lower(): v for k, v in n.items()}["name"] for n in json.loads(out)] == ["auth-1"]
    env["OS_PASSWORD"] = "wrong"
    process = await asyncio.create_subprocess_exec(
        str(Path(sys.executable).with_name("baremetal")),
        "node",
        "list",
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), 90)
    assert process.returncode != 0


async def test_openstacksdk_with_http_basic(secured: str) -> None:
    """openstacksdk's http_basic plugin: a lifecycle with the right password, 401 with a wrong one."""
    import openstack
    from openstack import exceptions

    def run(password: str) -> str:
        conn = openstack.connection.Connection(
            auth_type="http_basic",
            auth={"username": "admin", "password": password, "endpoint": secured},
            baremetal_endpoint_override=secured,
        )
        bm = conn.baremetal
        node = bm.create_node(driver="fake-hardware", name=f"sdk-basic-{password}")
        node = bm.set_node_provision_state(node, "manage", wait=True, timeout=30)
        node = bm.set_node_provision_state(node, "provide", wait=True, timeout=30)
        node = bm.set_node_provision_state(node, "active", wait=True, timeout=30)
        assert node.provision_state == "active"
        node = bm.set_node_provision_state(node, "deleted", wait=True, timeout=30)
        bm.delete_node(node)
        return node.provision_state

    assert await asyncio.to_thread(run, "s3cret") == "available"
    with pytest.raises(exceptions.HttpException) as caught:
        await asyncio.to_thread(run, "wrong")
    assert caught.value.status_code == 401
