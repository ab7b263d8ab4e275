"""Driver composition over the real REST API (issue 15, part 5): nodes get
every interface kind Ironic has, the no-* defaults refuse their verbs with a
400 and change nothing, /validate reports each kind from its implementation,
and a boot volume the boot interface cannot boot stops a deploy."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

V78 = {"X-OpenStack-Ironic-API-Version": "1.78"}
# The redfish hardware type's defaults; bios is its own redfish interface, as in Ironic.
NEW_KINDS = {"console": "no-console", "raid": "no-raid", "bios": "redfish", "rescue": "no-rescue"}


@pytest.fixture(scope="module")
async def api(stack: Any) -> AsyncIterator[Any]:
    async with aiohttp.ClientSession() as session:

        async def call(method: str, path: str, body: Any = None, expect: int | None = None) -> tuple[int, Any]:
            url = stack.endpoints["api REST (Ironic v1)"] + path
            async with session.request(method, url, json=body, headers=V78) as r:
                text = await r.text()
                assert expect is None or r.status == expect, f"{method} {path}: {r.status} {text}"
                return r.status, (json.loads(text) if text else None)

        yield call


def faultstring(body: dict[str, Any]) -> str:
    return json.loads(body["error_message"])["faultstring"]


async def test_nodes_get_every_kind_with_the_hardware_types_defaults(api: Any) -> None:
    _, node = await api("POST", "/v1/nodes", {"driver": "redfish", "name": "dc-redfish"}, expect=201)
    for kind, default in NEW_KINDS.items():
        assert node[f"{kind}_interface"] == default, kind
    assert (node["vendor_interface"], node["inspect_interface"]) == ("no-vendor", "no-inspect")
    _, fetched = await api("GET", "/v1/nodes/dc-redfish", expect=200)
    assert {k: fetched[f"{k}_interface"] for k in NEW_KINDS} == NEW_KINDS
    _, fake = await api("POST", "/v1/nodes", {"driver": "fake-hardware", "name": "dc-fake"}, expect=201)
    assert fake["rescue_interface"] == "fake" and fake["console_interface"] == "no-console"
    assert fake["bios_interface"] == "no-bios"  # fake bios is not enabled by default

    # Set explicitly, each new field is checked like the old ones, and bad names change nothing.
    status, body = await api(
        "PATCH", "/v1/nodes/dc-fake", [{"op": "replace", "path": "/raid_interface", "value": "idrac"}]
    )
    assert status == 400 and "ferrum.hardware.interfaces.raid" in faultstring(body) and "no-raid" in faultstring(body)
    status, body = await api("POST", "/v1/nodes", {"driver": "redfish", "name": "dc-bad", "rescue_interface": "fake"})
    assert status == 400 and "Valid interfaces are ['no-rescue', 'agent']" in faultstring(body)
    assert (await api("GET", "/v1/nodes/dc-bad"))[0] == 404
    _, patched = await api(
        "PATCH", "/v1/nodes/dc-fake", [{"op": "replace", "path": "/rescue_interface", "value": "no-rescue"}], expect=200
    )
    assert patched["rescue_interface"] == "no-rescue"
    # Changing the driver keeps what the new type supports and resets the rest to its defaults.
    _, moved = await api(
        "PATCH", "/v1/nodes/dc-fake", [{"op": "replace", "path": "/driver", "value": "redfish"}], expect=200
    )
    assert moved["rescue_interface"] == "no-rescue" and moved["power_interface"] == "redfish"


async def test_validate_reports_each_kind_from_its_implementation(api: Any) -> None:
    await api("POST", "/v1/nodes", {"driver": "fake-hardware", "name": "dc-validate"}, expect=201)
    _, report = await api("GET", "/v1/nodes/dc-validate/validate", expect=200)
    assert set(report) == {
        "bios",
        "boot",
        "console",
        "deploy",
        "firmware",
        "inspect",
        "management",
        "network",
        "power",
        "raid",
        "rescue",
        "storage",
    }
    for kind in ("power", "management", "boot", "deploy", "inspect", "rescue", "network", "storage"):
        assert report[kind] == {"result": True}, kind
    for kind, name in (
        ("console", "no-console"),
        ("raid", "no-raid"),
        ("bios", "no-bios"),
        ("firmware", "no-firmware"),
    ):
        assert report[kind]["result"] is False
        assert f"the {kind} interface '{name}' does not support" in report[kind]["reason"]


async def test_no_rescue_and_no_inspect_refuse_their_verbs_and_change_nothing(api: Any, stack: Any) -> None:
    _, node = await api("POST", "/v1/nodes", {"driver": "redfish", "name": "dc-refuse"}, expect=201)
    await stack.pool.execute("UPDATE nodes SET provision_state = 'active' WHERE uuid = $1::uuid", node["uuid"])
    status, body = await api(
        "PUT", "/v1/nodes/dc-refuse/states/provision", {"target": "rescue", "rescue_password": "pw"}
    )
    assert status == 400, body
    assert "rescue interface 'no-rescue' does not support rescue" in faultstring(body)
    await stack.pool.execute("UPDATE nodes SET provision_state = 'manageable' WHERE uuid = $1::uuid", node["uuid"])
    status, body = await api("PUT", "/v1/nodes/dc-refuse/states/provision", {"target": "inspect"})
    assert status == 400 and "inspect interface 'no-inspect'" in faultstring(body)
    _, after = await api("GET", "/v1/nodes/dc-refuse", expect=200)
    assert after["provision_state"] == "manageable" and after["target_provision_state"] is None
    assert after["reservation"] is None and after["last_error"] is None
    # fake-hardware has a fake rescue: the same verb is accepted there.
    _, fake = await api("POST", "/v1/nodes", {"driver": "fake-hardware", "name": "dc-rescue"}, expect=201)
    await stack.pool.execute("UPDATE nodes SET provision_state = 'active' WHERE uuid = $1::uuid", fake["uuid"])
    await api("PUT", "/v1/nodes/dc-rescue/states/provision", {"target": "rescue", "rescue_password": "pw"}, expect=202)


async def test_a_boot_volume_needs_a_boot_interface_that_can_boot_it(api: Any, stack: Any) -> None:
    _, node = await api(
        "POST",
        "/v1/nodes",
        {
            "driver": "fake-hardware",
            "name": "dc-bfv",
            "driver_info": {"deploy_kernel": "http://192.0.2.1/k", "deploy_ramdisk": "http://192.0.2.1/r"},
        },
        expect=201,
    )
    await api("POST", "/v1/ports", {"node_uuid": node["uuid"], "address": "52:54:00:dc:00:01"}, expect=201)
    await stack.pool.execute("UPDATE nodes SET provision_state = 'available' WHERE uuid = $1::uuid", node["uuid"])
    _, target = await api(
        "POST",
        "/v1/volume/targets",
        {"node_uuid": node["uuid"], "volume_type": "iscsi", "boot_index": 0, "volume_id": "vol-dc"},
        expect=201,
    )
    status, body = await api("PUT", "/v1/nodes/dc-bfv/states/provision", {"target": "active"})
    assert status == 400, body
    assert faultstring(body) == (
        f"The boot interface 'fake' of node {node['uuid']} lacks the capability 'iscsi_volume_boot', which the "
        f"node needs: its boot volume (volume target {target['uuid']}) is of type 'iscsi'. Boot interfaces of "
        "hardware type fake-hardware that have it: ipxe."
    )
    _, after = await api("GET", "/v1/nodes/dc-bfv", expect=200)
    assert after["provision_state"] == "available" and after["target_provision_state"] is None
    _, report = await api("GET", "/v1/nodes/dc-bfv/validate", expect=200)
    assert report["boot"]["result"] is False and "'iscsi_volume_boot'" in report["boot"]["reason"]

    # The ipxe boot interface can SAN-boot iSCSI: the capability check passes and the deploy starts.
    await api("PATCH", "/v1/nodes/dc-bfv", [{"op": "replace", "path": "/boot_interface", "value": "ipxe"}], expect=200)
    _, report = await api("GET", "/v1/nodes/dc-bfv/validate", expect=200)
    assert report["boot"] == {"result": True}
    await api("PUT", "/v1/nodes/dc-bfv/states/provision", {"target": "active"}, expect=202)
    deadline = time.monotonic() + 20
    while True:
        _, current = await api("GET", "/v1/nodes/dc-bfv", expect=200)
        if current["provision_state"] == "active" and current["reservation"] is None:
            break
        assert time.monotonic() < deadline, current
        await asyncio.sleep(0.05)


async def test_driver_documents_show_the_new_kinds_defaults(api: Any) -> None:
    _, doc = await api("GET", "/v1/drivers/redfish", expect=200)
    for kind, default in NEW_KINDS.items():
        assert doc[f"default_{kind}_interface"] == default
        # redfish also offers the agent rescue and RAID (the ramdisk), and no-bios; fake implementations never
        others = {"rescue": ["agent"], "raid": ["agent"], "bios": ["no-bios"]}.get(kind, [])
        assert doc[f"enabled_{kind}_interfaces"] == [default, *others]
    # Firmware interfaces arrive with API 1.86, above Ferrum's maximum: not shown.
    assert not any("firmware" in key for key in doc)
    _, fake = await api("GET", "/v1/drivers/fake-hardware", expect=200)
    assert fake["default_rescue_interface"] == "fake" and fake["enabled_rescue_interfaces"] == [
        "fake",
        "agent",
        "no-rescue",
    ]
