"""Unmodified OpenStack clients against Ferrum: python-ironicclient's
`baremetal` CLI and openstacksdk drive a fake-hardware lifecycle."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

import openstack

BAREMETAL = str(Path(sys.executable).with_name("baremetal"))


async def baremetal(endpoint: str, *args: str) -> tuple[int, str, str]:
    env = {**os.environ, "OS_AUTH_TYPE": "none", "OS_ENDPOINT": endpoint}
    process = await asyncio.create_subprocess_exec(
        BAREMETAL, *args, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, err = await asyncio.wait_for(process.communicate(), 90)
    assert process.returncode is not None  # communicate() waited for the exit
    return process.returncode, out.decode(), err.decode()


async def test_baremetal_cli_lifecycle(stack) -> None:
    api = stack.endpoints["api REST (Ironic v1)"]
    rc, out, err = await baremetal(api, "node", "create", "--driver", "fake-hardware", "--name", "cli-1", "-f", "json")
    assert rc == 0, err
    node = json.loads(out)
    assert node["provision_state"] == "enroll"
    rc, _, err = await baremetal(api, "port", "create", "52:54:00:cc:00:01", "--node", node["uuid"])
    assert rc == 0, err
    for verb, extra in (
        ("manage", []),
        ("provide", []),
        ("deploy", ["--config-drive", '{"meta_data": {"hostname": "cli-1"}}']),
    ):
        rc, _, err = await baremetal(api, "node", verb, "cli-1", "--wait", "30", *extra)
        assert rc == 0, (verb, err)
    rc, out, _ = await baremetal(api, "node", "show", "cli-1", "-f", "json")
    shown = json.loads(out)
    assert shown["provision_state"] == "active" and shown["instance_info"]["configdrive"] == "******"
    rc, out, err = await baremetal(api, "node", "show", "no-such-node")
    assert rc != 0 and "could not be found" in (out + err)
    rc, out, err = await baremetal(api, "port", "create", "52:54:00:cc:00:01", "--node", node["uuid"])
    assert rc != 0 and "already exists" in (out + err)
    rc, out, err = await baremetal(api, "node", "manage", "cli-1")
    assert rc != 0 and "can not be performed" in (out + err)
    for verb in ("undeploy",):
        rc, _, err = await baremetal(api, "node", verb, "cli-1", "--wait", "30")
        assert rc == 0, err
    rc, _, err = await baremetal(api, "node", "delete", "cli-1")
    assert rc == 0, err


async def test_openstacksdk_lifecycle(stack) -> None:
    api = stack.endpoints["api REST (Ironic v1)"]

    def run() -> str:
        conn = openstack.connection.Connection(auth_type="none", baremetal_endpoint_override=api)
        bm = conn.baremetal
        node = bm.create_node(driver="fake-hardware", name="sdk-1")
        bm.create_port(node_id=node.id, address="52:54:00:dd:00:01")
        node = bm.set_node_provision_state(node, "manage", wait=True, timeout=30)
        node = bm.set_node_provision_state(node, "provide", wait=True, timeout=30)
        node = bm.set_node_provision_state(
            node, "active", config_drive={"meta_data": {"hostname": "sdk"}}, wait=True, timeout=30
        )
        assert node.provision_state == "active"
        bm.set_node_power_state(node, "power off", wait=True, timeout=30)
        assert bm.get_node("sdk-1").power_state == "power off"
        bm.update_node(node, extra={"rack": "r1"})
        assert bm.get_node("sdk-1").extra == {"rack": "r1"}
        node = bm.set_node_provision_state(node, "deleted", wait=True, timeout=30)
        assert node.provision_state == "available"
        assert [n.name for n in bm.nodes() if n.name == "sdk-1"] == ["sdk-1"]
        bm.delete_node(node)
        return "ok"

    assert await asyncio.to_thread(run) == "ok"
