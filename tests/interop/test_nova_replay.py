"""Nova's ironic virt driver, replayed call by call against a fresh Ferrum (issue 22, item 6).

Nova talks to Ironic only through openstacksdk's ``baremetal`` proxy
(``utils.get_sdk_adapter('baremetal')``), so these tests make the same
openstacksdk calls with the same arguments, in the order Nova makes them from
``spawn`` to ``destroy``, and check every answer for the fields Nova reads.

Followed: Nova master at commit 00a0304 (August 2026, after the 33.0.2 tag),
``nova/virt/ironic/driver.py`` and ``patcher.py``. That driver requires API
1.46 (``IRONIC_API_VERSION``) and pins no microversion of its own: the SDK
negotiates the highest version both sides know, which is what happens here.
Nova waits with a 2 s ``FixedIntervalLoopingCall`` (``api_retry_interval``);
the polls below make the same call every 20 ms.

The calls, in Nova's order:

- ``_refresh_cache``: ``nodes(fields=_NODE_FIELDS)`` (and the
  ``associated``/``provision_state`` filters that operators and older Novas
  use to find free nodes);
- ``prepare_for_spawn``: ``get_node(id, fields=...)``, then
  ``update_node(node, retry_on_conflict=False, instance_id=...)``;
- ``prepare_networks_before_block_device_mapping``: ``attach_vif_to_node``
  with a Neutron port UUID;
- ``spawn``: ``get_node``; ``patch_node`` with ``patcher.get_deploy_patch``
  (every value a string, ``traits`` a list); ``ports``/``port_groups``
  (``_get_network_metadata``); ``validate_node(required=None)`` with
  ``deploy``, ``power`` and ``storage`` read; ``set_node_provision_state(
  'active', config_drive=base64(gzip(ISO9660 config-2)))``; then
  ``_wait_for_active`` polls ``nodes(instance_id=..., fields=...)``;
- ``power_off``/``power_on``: ``set_node_power_state`` then
  ``_wait_for_power_state`` until ``target_power_state`` is None;
- ``destroy`` of an active node: ``set_node_provision_state('deleted')`` and
  polls until the instance is gone or the node is cleaning or available;
- ``_cleanup_deploy`` (failed spawn): ``volume_targets``,
  ``detach_vif_from_node``, ``update_node(instance_id=None, instance_info={})``.

Nodes are fake-hardware with noop network and storage (Ironic's defaults for a
standalone conductor); undeploy goes through automated cleaning.
"""

from __future__ import annotations

import asyncio
import base64
import gzip
import json
import subprocess
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import openstack
import pytest

# nova/virt/ironic/driver.py
NODE_FIELDS = (
    "uuid",
    "power_state",
    "target_power_state",
    "provision_state",
    "target_provision_state",
    "last_error",
    "maintenance",
    "properties",
    "instance_uuid",
    "traits",
    "resource_class",
)
UNPROVISIONED = ("cleaning", "clean wait", "clean failed", "available", None)
POLL = 0.02
TIMEOUT = 30.0
MAC = "52:54:00:6e:00:01"


def connect(endpoint: str) -> Any:
    """What ``nova.utils.get_sdk_adapter('baremetal')`` returns, unauthenticated."""
    return openstack.connection.Connection(auth_type="none", baremetal_endpoint_override=endpoint).baremetal


def nova_config_drive(workdir: Path, instance_uuid: str) -> str:
    """A config drive built the way Nova's ``ConfigDriveBuilder`` builds it (genisoimage,
    volume label ``config-2``), gzipped and base64-encoded as ``_generate_configdrive`` sends it."""
    tree = workdir / "cd"
    for version in ("2012-08-10", "latest"):
        folder = tree / "openstack" / version
        folder.mkdir(parents=True)
        (folder / "meta_data.json").write_text(json.dumps({"uuid": instance_uuid, "hostname": "nova-replay"}))
        (folder / "network_data.json").write_text(json.dumps({"links": [], "networks": [], "services": []}))
    iso = workdir / "configdrive.iso"
    subprocess.run(
        [
            *("genisoimage", "-o", str(iso), "-ldots", "-allow-lowercase", "-allow-multidot", "-l"),
            *("-publisher", "nova-replay", "-quiet", "-J", "-r", "-V", "config-2", str(tree)),
        ],
        check=True,
    )
    return base64.b64encode(gzip.compress(iso.read_bytes())).decode()


def deploy_patch(node: Any, instance_uuid: str) -> list[dict[str, Any]]:
    """``patcher.GenericDriverFields.get_deploy_patch`` for a 10 GB flavor with a trait."""
    values: dict[str, Any] = {
        "image_source": str(uuid.uuid4()),
        "root_gb": "10",
        "swap_mb": "0",
        "display_name": "nova-replay",
        "vcpus": "2",
        "nova_host_id": "compute-1",
        "memory_mb": "2048",
        "local_gb": str(node.properties.get("local_gb", 0)),
        "project_id": "6d1f7b3a0f4b4a8c9a1d6c2e5b7f8a90",
        "project_name": "demo",
        "user_id": "0c4e3a1f2b5d4e6f8a9b0c1d2e3f4a5b",
        "user_name": "demo",
        "flavor_name": "baremetal",
        "fixed_ips": "[]",
        "floating_ips": "[]",
        "capabilities": json.dumps({"boot_mode": "uefi"}),
        "traits": ["CUSTOM_GOLD"],
    }
    return [{"path": f"/instance_info/{key}", "op": "add", "value": value} for key, value in values.items()]


def poll(fetch: Callable[[], Any], done: Callable[[Any], bool], what: str) -> Any:
    """Nova's FixedIntervalLoopingCall, at 20 ms instead of 2 s."""
    deadline = time.monotonic() + TIMEOUT
    while True:
        got = fetch()
        if done(got):
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: still {got!r} after {TIMEOUT}s")
        time.sleep(POLL)


def by_instance(bm: Any, instance_uuid: str) -> list[Any]:
    """``_validate_instance_and_node``: at most one node carries the instance."""
    nodes = list(bm.nodes(instance_id=instance_uuid, fields=NODE_FIELDS))
    assert len(nodes) <= 1, nodes
    return nodes


def enroll(bm: Any, name: str, mac: str) -> Any:
    """The operator's part, before Nova sees the node: enrol, port, manage, provide."""
    node = bm.create_node(
        driver="fake-hardware",
        name=name,
        resource_class="baremetal",
        properties={"cpus": 2, "memory_mb": 2048, "local_gb": 20, "cpu_arch": "x86_64"},
        network_interface="noop",
        storage_interface="noop",
    )
    bm.create_port(node_id=node.id, address=mac)
    bm.set_node_provision_state(node, "manage", wait=True, timeout=TIMEOUT)
    bm.add_node_trait(node, "CUSTOM_GOLD")
    return bm.set_node_provision_state(node, "provide", wait=True, timeout=TIMEOUT)


def spawn_to_destroy(endpoint: str, workdir: Path) -> dict[str, Any]:
    bm = connect(endpoint)
    node_id = enroll(bm, "nova-replay-1", MAC).id
    instance_uuid = str(uuid.uuid4())
    vif_id = str(uuid.uuid4())  # a Neutron port UUID

    # _refresh_cache: every node with Nova's fields; the free-node filters.
    listed = {n.id: n for n in bm.nodes(fields=NODE_FIELDS)}
    free = listed[node_id]
    assert (free.provision_state, free.power_state, free.instance_id) == ("available", "power off", None)
    assert free.is_maintenance is False and free.resource_class == "baremetal"
    assert free.properties["local_gb"] == 20 and free.traits == ["CUSTOM_GOLD"]
    assert free.target_provision_state is None and free.target_power_state is None
    assert free.driver is None  # not asked for: `fields` is honoured
    assert node_id in [n.id for n in bm.nodes(associated=False, provision_state="available", fields=NODE_FIELDS)]
    assert node_id not in [n.id for n in bm.nodes(associated=True, fields=NODE_FIELDS)]

    # prepare_for_spawn
    node = bm.get_node(node_id, fields=NODE_FIELDS)
    assert node.id == node_id and node.instance_id is None and node.provision_state == "available"
    bm.update_node(node, retry_on_conflict=False, instance_id=instance_uuid)
    assert [n.id for n in bm.nodes(associated=True, fields=NODE_FIELDS)] == [node_id]
    assert node_id not in [n.id for n in bm.nodes(associated=False, provision_state="available")]

    # prepare_networks_before_block_device_mapping -> _plug_vif
    bm.attach_vif_to_node(node_id, vif_id, retry_on_conflict=False)
    assert bm.list_node_vifs(node_id) == [vif_id]

    # spawn: instance_info, network metadata, validate
    node = bm.get_node(node_id, fields=NODE_FIELDS)
    patch = deploy_patch(node, instance_uuid)
    bm.patch_node(node, patch)
    info = bm.get_node(node_id).instance_info
    for op in patch:
        key = op["path"].rsplit("/", 1)[1]
        assert info[key] == op["value"], key  # strings stay strings, the traits list stays a list
    ports = list(bm.ports(node=node_id, details=True))
    assert [(p.address, p.internal_info.get("tenant_vif_port_id")) for p in ports] == [(MAC, vif_id)]
    assert list(bm.port_groups(node=node_id, details=True)) == []
    checks = bm.validate_node(node_id, required=None)
    for interface in ("deploy", "power", "storage"):
        assert checks[interface].result is True, (interface, checks[interface].reason)

    # spawn: deploy with the config drive string, then _wait_for_active
    bm.set_node_provision_state(node_id, "active", config_drive=nova_config_drive(workdir, instance_uuid))
    active = poll(lambda: by_instance(bm, instance_uuid), lambda ns: ns[0].provision_state == "active", "deploy")[0]
    assert active.id == node_id and active.instance_id == instance_uuid and active.last_error is None
    shown = bm.get_node(node_id)
    assert shown.instance_info["configdrive"] == "******" and shown.instance_info["display_name"] == "nova-replay"

    # power_off / power_on: _wait_for_power_state until no target
    for action in ("power off", "power on"):
        bm.set_node_power_state(node_id, action)
        settled = poll(lambda: by_instance(bm, instance_uuid), lambda ns: ns[0].target_power_state is None, action)[0]
        assert settled.power_state == action

    # destroy: the node is active, so _unprovision
    bm.set_node_provision_state(node_id, "deleted")
    poll(
        lambda: by_instance(bm, instance_uuid),
        lambda ns: not ns or ns[0].provision_state in UNPROVISIONED,
        "unprovision",
    )
    # Nova is done here; the node itself finishes cleaning and is free again.
    final = poll(lambda: bm.get_node(node_id), lambda n: n.provision_state == "available", "cleaning")
    history = [e["event"] for e in bm.get(f"/nodes/{node_id}/history", microversion="1.78").json()["history"]]
    return {
        "final": final,
        "vifs": bm.list_node_vifs(node_id),
        "history": history,
        "associated": [n.id for n in bm.nodes(associated=True)],
    }


@pytest.fixture(scope="module")
def endpoint(stack: Any) -> str:
    return str(stack.endpoints["api REST (Ironic v1)"])


@pytest.mark.timeout(60)
async def test_spawn_to_destroy(endpoint: str, tmp_path: Path) -> None:
    got = await asyncio.to_thread(spawn_to_destroy, endpoint, tmp_path)
    final = got["final"]
    # What Ironic's tear-down clears, so that Nova's destroy need not.
    assert (final.instance_id, final.instance_info, final.last_error) == (None, {}, None)
    assert got["vifs"] == [] and got["associated"] == []
    assert any("clean" in event for event in got["history"]), got["history"]


def failed_spawn_cleanup(endpoint: str) -> dict[str, Any]:
    """A spawn that fails after the node was reserved, wired and patched: Nova's
    ``_cleanup_deploy``, and ``_plug_vif``'s handling of a VIF attached twice."""
    bm = connect(endpoint)
    node = enroll(bm, "nova-replay-2", "52:54:00:6e:00:02")
    instance_uuid, vif_id = str(uuid.uuid4()), str(uuid.uuid4())
    bm.update_node(node, retry_on_conflict=False, instance_id=instance_uuid)
    bm.attach_vif_to_node(node.id, vif_id, retry_on_conflict=False)
    again: str = "accepted"
    try:
        bm.attach_vif_to_node(node.id, vif_id, retry_on_conflict=False)
    except openstack.exceptions.ConflictException:
        again = "conflict"  # Nova reads 409 as "already attached"
    bm.patch_node(node, deploy_patch(node, instance_uuid))
    # A second instance cannot take a reserved node (prepare_for_spawn's race).
    try:
        bm.update_node(node, retry_on_conflict=False, instance_id=str(uuid.uuid4()))
        second = "accepted"
    except openstack.exceptions.ConflictException:
        second = "conflict"

    # _cleanup_deploy
    targets = list(bm.volume_targets(details=True, node=node.id))
    bm.detach_vif_from_node(node.id, vif_id)
    bm.update_node(node, instance_id=None, instance_info={})
    shown = bm.get_node(node.id)
    return {
        "again": again,
        "second": second,
        "targets": targets,
        "vifs": bm.list_node_vifs(node.id),
        "node": (shown.instance_id, shown.instance_info, shown.provision_state),
        "found": by_instance(bm, instance_uuid),
    }


@pytest.mark.timeout(60)
async def test_failed_spawn_cleanup(endpoint: str) -> None:
    got = await asyncio.to_thread(failed_spawn_cleanup, endpoint)
    assert got["again"] == "conflict" and got["second"] == "conflict"
    assert got["targets"] == [] and got["vifs"] == []
    assert got["node"] == (None, {}, "available")
    assert got["found"] == []
