"""The Ironic-compatible REST API against a live in-process stack: a full
fake-hardware lifecycle and the contract's error paths."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import aiohttp
import pytest
from multidict import CIMultiDictProxy

from services.common.images.configdrive import build_configdrive, encode_configdrive

V = {"X-OpenStack-Ironic-API-Version": "1.56"}


class Client:
    def __init__(self, session: aiohttp.ClientSession, base: str) -> None:
        self.session, self.base = session, base

    async def call(
        self, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None, expect: int | None = None
    ) -> tuple[int, Any, CIMultiDictProxy[str]]:
        async with self.session.request(
            method, self.base + path, json=body, headers=V if headers is None else headers
        ) as r:
            text = await r.text()
            data = json.loads(text) if text else None
            if expect is not None:
                assert r.status == expect, f"{method} {path}: {r.status} {text}"
            return r.status, data, r.headers

    async def wait_state(self, ident: str, state: str, timeout: float = 20) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            _, node, _ = await self.call("GET", f"/v1/nodes/{ident}", expect=200)
            if node["provision_state"] == state and node["reservation"] is None:
                return node
            assert time.monotonic() < deadline, f"{ident} stuck in {node['provision_state']}: {node['last_error']}"
            await asyncio.sleep(0.05)


@pytest.fixture(scope="module")
async def client(stack):
    async with aiohttp.ClientSession() as session:
        yield Client(session, stack.endpoints["api REST (Ironic v1)"])


def fault(body: dict[str, Any]) -> str:
    inner = json.loads(body["error_message"])
    assert set(inner) == {"faultcode", "faultstring", "debuginfo"}
    return inner["faultstring"]


async def test_discovery_and_versions(client: Client) -> None:
    status, root, headers = await client.call("GET", "/", headers={})
    assert status == 200 and root["default_version"]["min_version"] == "1.1"
    assert headers["X-OpenStack-Ironic-API-Version"] == "1.1"  # no header = minimum
    assert headers["X-OpenStack-Ironic-API-Maximum-Version"] == root["default_version"]["version"]
    _, v1, headers = await client.call("GET", "/v1", headers={"OpenStack-API-Version": "baremetal latest"})
    assert headers["X-OpenStack-Ironic-API-Version"] == root["default_version"]["version"]
    assert "nodes" in v1 and "volume" in v1
    status, body, headers = await client.call("GET", "/v1/nodes", headers={"X-OpenStack-Ironic-API-Version": "1.999"})
    assert status == 406 and "supported version range" in fault(body)
    assert headers["X-OpenStack-Ironic-API-Minimum-Version"] == "1.1"
    status, body, _ = await client.call("GET", "/v1/nodes", headers={"X-OpenStack-Ironic-API-Version": "bogus"})
    assert status == 406 and "Invalid value" in fault(body)
    status, _, _ = await client.call("POST", "/v1/", {})
    assert status == 405


async def test_full_lifecycle(client: Client) -> None:
    _, node, headers = await client.call(
        "POST",
        "/v1/nodes",
        {
            "driver": "fake-hardware",
            "name": "life-1",
            "driver_info": {"ipmi_password": "s3cret", "ipmi_address": "10.0.0.1"},
        },
        expect=201,
    )
    assert headers["Location"].endswith(f"/v1/nodes/{node['uuid']}")
    assert node["provision_state"] == "enroll" and node["deploy_interface"] == "fake"
    assert node["driver_info"] == {"ipmi_password": "******", "ipmi_address": "10.0.0.1"}
    assert node["storage_interface"] == "fake"
    await client.call("POST", "/v1/ports", {"node_uuid": node["uuid"], "address": "52:54:00:AB:CD:01"}, expect=201)
    _, ports, _ = await client.call("GET", "/v1/nodes/life-1/ports", expect=200)
    assert [p["address"] for p in ports["ports"]] == ["52:54:00:ab:cd:01"]

    await client.call("PUT", "/v1/nodes/life-1/states/provision", {"target": "manage"}, expect=202)
    await client.wait_state("life-1", "manageable")
    await client.call("PUT", "/v1/nodes/life-1/states/provision", {"target": "provide"}, expect=202)
    await client.wait_state("life-1", "available")
    await client.call(
        "PATCH",
        "/v1/nodes/life-1",
        [
            {"op": "add", "path": "/instance_info/image_source", "value": "http://images/x.img"},
            {"op": "add", "path": "/instance_uuid", "value": "5a5a5a5a-0000-4000-8000-000000000001"},
        ],
        expect=200,
    )
    drive = encode_configdrive(
        build_configdrive({"uuid": "x", "name": "life-1"}, [], {"meta_data": {"hostname": "life-1"}})
    )
    status, body, _ = await client.call(
        "PUT", "/v1/nodes/life-1/states/provision", {"target": "active", "configdrive": "H4sIAAAA"}
    )
    assert status == 400 and "configdrive" in fault(body).lower()  # truncated gzip: refused, nothing changes
    _, still, _ = await client.call("GET", "/v1/nodes/life-1", expect=200)
    assert still["provision_state"] == "available" and "configdrive" not in still["instance_info"]
    await client.call(
        "PUT", "/v1/nodes/life-1/states/provision", {"target": "active", "configdrive": drive}, expect=202
    )
    node = await client.wait_state("life-1", "active")
    assert node["instance_info"]["configdrive"] == "******"
    assert node["target_provision_state"] is None and node["last_error"] is None

    await client.call("PUT", "/v1/nodes/life-1/states/power", {"target": "power off"}, expect=202)
    for _ in range(200):
        _, node, _ = await client.call("GET", "/v1/nodes/life-1", expect=200)
        if node["power_state"] == "power off" and node["target_power_state"] is None:
            break
        await asyncio.sleep(0.05)
    assert node["power_state"] == "power off"

    _, validate, _ = await client.call("GET", "/v1/nodes/life-1/validate", expect=200)
    assert validate["power"] == {"result": True}
    _, states_doc, _ = await client.call("GET", "/v1/nodes/life-1/states", expect=200)
    assert states_doc["provision_state"] == "active"

    await client.call("PUT", "/v1/nodes/life-1/states/provision", {"target": "deleted"}, expect=202)
    node = await client.wait_state("life-1", "available")
    assert node["instance_uuid"] is None and node["instance_info"] == {}
    await client.call("DELETE", "/v1/nodes/life-1", expect=204)
    status, body, _ = await client.call("GET", "/v1/nodes/life-1")
    assert status == 404 and "could not be found" in fault(body)
    _, ports, _ = await client.call("GET", "/v1/ports?address=52:54:00:ab:cd:01", expect=200)
    assert ports["ports"] == []  # the node's ports went with it


async def test_error_paths_change_nothing(client: Client) -> None:
    _, node, _ = await client.call("POST", "/v1/nodes", {"driver": "fake-hardware", "name": "err-1"}, expect=201)
    await client.call("POST", "/v1/ports", {"node_uuid": node["uuid"], "address": "52:54:00:00:00:99"}, expect=201)
    status, body, _ = await client.call(
        "POST", "/v1/ports", {"node_uuid": node["uuid"], "address": "52-54-00-00-00-99"}
    )
    assert status == 409 and "already exists" in fault(body)
    status, body, _ = await client.call(
        "PUT", "/v1/nodes/err-1/states/provision", {"target": "manage", "configdrive": "abc"}
    )
    assert status == 400 and "only supported when setting provision state to active" in fault(body)
    status, body, _ = await client.call("PUT", "/v1/nodes/err-1/states/provision", {"target": "active"})
    assert status == 400 and "can not be performed" in fault(body)
    status, body, _ = await client.call("PUT", "/v1/nodes/err-1/states/provision", {"target": "fly"})
    assert status == 400 and "could not be understood" in fault(body)
    status, body, _ = await client.call(
        "PATCH", "/v1/nodes/err-1", [{"op": "replace", "path": "/provision_state", "value": "active"}]
    )
    assert status == 400
    status, body, _ = await client.call("PATCH", "/v1/nodes/err-1", [{"op": "add", "path": "/nonsense", "value": 1}])
    assert status == 400
    status, body, _ = await client.call("PATCH", "/v1/nodes/err-1", {"not": "a list"})
    assert status == 400
    status, body, _ = await client.call(
        "GET", "/v1/nodes/err-1?fields=owner", headers={"X-OpenStack-Ironic-API-Version": "1.40"}
    )
    assert status == 406
    status, body, _ = await client.call("GET", "/v1/nodes/err-1?fields=bogus")
    assert status == 400
    status, body, _ = await client.call("POST", "/v1/nodes", {"driver": "no-such-driver"})
    assert status == 400 and "No valid host" in fault(body)
    status, body, _ = await client.call("POST", "/v1/nodes", {"driver": "fake-hardware", "name": "err-1"})
    assert status == 409
    status, body, _ = await client.call("POST", "/v1/nodes", {"driver": "fake-hardware", "power_interface": "ipmi"})
    assert status == 400
    deep: Any = {}
    for _ in range(40):
        deep = {"a": deep}
    status, body, _ = await client.call("POST", "/v1/nodes", {"driver": "fake-hardware", "extra": deep})
    assert status == 400 and "deeper" in fault(body)
    status, body, _ = await client.call(
        "POST", "/v1/nodes", {"driver": "fake-hardware", "extra": {"x": "y" * (2 * 1024 * 1024)}}
    )
    assert status == 413
    _, after, _ = await client.call("GET", "/v1/nodes/err-1", expect=200)
    assert after["provision_state"] == "enroll" and after["updated_at"] == node["updated_at"]
    _, listing, _ = await client.call("GET", "/v1/nodes?fields=uuid,name", expect=200)
    assert sum(1 for n in listing["nodes"] if n["name"] == "err-1") == 1  # failed creates left nothing


async def test_locked_node_gives_409_at_once(client: Client, stack) -> None:
    _, node, _ = await client.call("POST", "/v1/nodes", {"driver": "fake-hardware", "name": "lock-1"}, expect=201)
    pool = stack.pool
    await pool.execute(
        "UPDATE nodes SET reservation = 'other-host', reservation_expires_at = now() + interval '1 hour' WHERE uuid = $1::uuid",
        node["uuid"],
    )
    started = time.monotonic()
    status, body, _ = await client.call("PUT", "/v1/nodes/lock-1/states/provision", {"target": "manage"})
    assert status == 409 and "locked by host other-host" in fault(body)
    assert time.monotonic() - started < 2
    status, _, _ = await client.call("PATCH", "/v1/nodes/lock-1", [{"op": "add", "path": "/extra/a", "value": 1}])
    assert status == 409
    await pool.execute(
        "UPDATE nodes SET reservation = NULL, reservation_expires_at = NULL WHERE uuid = $1::uuid", node["uuid"]
    )
    _, after, _ = await client.call("GET", "/v1/nodes/lock-1", expect=200)
    assert after["provision_state"] == "enroll" and after["extra"] == {}


async def test_pagination_and_filters(client: Client) -> None:
    for i in range(7):
        await client.call(
            "POST", "/v1/nodes", {"driver": "fake-hardware", "name": f"page-{i}", "owner": "pager"}, expect=201
        )
    seen, path = [], "/v1/nodes?owner=pager&limit=3&sort_key=name&sort_dir=desc"
    while path:
        _, page, _ = await client.call("GET", path, expect=200)
        seen += [n["name"] for n in page["nodes"]]
        path = page["next"].split(client.base, 1)[1] if "next" in page else ""
    assert seen == [f"page-{i}" for i in reversed(range(7))]
    _, detail, _ = await client.call("GET", "/v1/nodes/detail?owner=pager&provision_state=enroll", expect=200)
    assert len(detail["nodes"]) == 7 and "driver_info" in detail["nodes"][0]
    status, _, _ = await client.call("GET", "/v1/nodes?limit=0")
    assert status == 400
    status, _, _ = await client.call("GET", "/v1/nodes?provision_state=flying")
    assert status == 400


async def test_vifs(client: Client) -> None:
    _, node, _ = await client.call("POST", "/v1/nodes", {"driver": "fake-hardware", "name": "vif-1"}, expect=201)
    await client.call("POST", "/v1/ports", {"node_uuid": node["uuid"], "address": "52:54:00:0f:00:01"}, expect=201)
    status, _, _ = await client.call("GET", "/v1/nodes/vif-1/vifs", headers={"X-OpenStack-Ironic-API-Version": "1.27"})
    assert status == 404  # endpoint too new for the version
    await client.call("POST", "/v1/nodes/vif-1/vifs", {"id": "vif-a"}, expect=204)
    _, vifs, _ = await client.call("GET", "/v1/nodes/vif-1/vifs", expect=200)
    assert vifs == {"vifs": [{"id": "vif-a"}]}
    # No free port left: Ironic's noop network accepts the VIF and keeps nothing.
    await client.call("POST", "/v1/nodes/vif-1/vifs", {"id": "vif-b"}, expect=204)
    _, vifs, _ = await client.call("GET", "/v1/nodes/vif-1/vifs", expect=200)
    assert vifs == {"vifs": [{"id": "vif-a"}]}
    status, _, _ = await client.call("POST", "/v1/nodes/vif-1/vifs", {"id": "vif-a"})
    assert status == 409
    # Detaching a VIF that is not attached is a no-op on Ironic's noop network (204).
    await client.call("DELETE", "/v1/nodes/vif-1/vifs/vif-zzz", expect=204)
    _, vifs, _ = await client.call("GET", "/v1/nodes/vif-1/vifs", expect=200)
    assert vifs == {"vifs": [{"id": "vif-a"}]}
    await client.call("DELETE", "/v1/nodes/vif-1/vifs/vif-a", expect=204)
    _, vifs, _ = await client.call("GET", "/v1/nodes/vif-1/vifs", expect=200)
    assert vifs == {"vifs": []}


async def test_drivers(client: Client) -> None:
    _, drivers, _ = await client.call("GET", "/v1/drivers", expect=200)
    assert [d["name"] for d in drivers["drivers"]] == ["fake-hardware", "ipmi", "redfish"]
    _, driver, _ = await client.call("GET", "/v1/drivers/fake-hardware", expect=200)
    assert driver["default_deploy_interface"] == "fake"
    status, _, _ = await client.call("GET", "/v1/drivers/nope")
    assert status == 404


async def test_volume_connectors_and_targets(client: Client) -> None:
    _, node, _ = await client.call("POST", "/v1/nodes", {"driver": "fake-hardware", "name": "bfv-1"}, expect=201)
    status, _, _ = await client.call("GET", "/v1/volume/connectors", headers={"X-OpenStack-Ironic-API-Version": "1.31"})
    assert status == 404
    _, conn, headers = await client.call(
        "POST",
        "/v1/volume/connectors",
        {"node_uuid": node["uuid"], "type": "iqn", "connector_id": "iqn.2026-11.org.ferrum:bfv-1"},
        expect=201,
    )
    assert headers["Location"].endswith(conn["uuid"])
    status, body, _ = await client.call(
        "POST",
        "/v1/volume/connectors",
        {"node_uuid": node["uuid"], "type": "iqn", "connector_id": "iqn.2026-11.org.ferrum:bfv-1"},
    )
    assert status == 409 and "already exists" in fault(body)
    target = {
        "node_uuid": node["uuid"],
        "volume_type": "iscsi",
        "boot_index": 0,
        "volume_id": "vol-1",
        "properties": {"target_iqn": "iqn.2026-11.org.ferrum:vol-1", "target_lun": 0, "target_portal": "10.0.0.5:3260"},
    }
    _, tgt, _ = await client.call("POST", "/v1/volume/targets", target, expect=201)
    status, body, _ = await client.call("POST", "/v1/volume/targets", {**target, "volume_id": "vol-2"})
    assert status == 409
    status, _, _ = await client.call("POST", "/v1/volume/targets", {**target, "boot_index": -1})
    assert status == 400
    status, _, _ = await client.call("POST", "/v1/nodes/bfv-1/volume/targets", target)
    assert status == 400
    _, listing, _ = await client.call("GET", "/v1/nodes/bfv-1/volume/targets", expect=200)
    assert [t["volume_id"] for t in listing["targets"]] == ["vol-1"] and "properties" not in listing["targets"][0]
    _, listing, _ = await client.call("GET", f"/v1/volume/connectors?node={node['uuid']}&detail=true", expect=200)
    assert listing["connectors"][0]["extra"] == {}
    # enroll is a "free" state: updates are allowed even when not powered off
    _, patched, _ = await client.call(
        "PATCH",
        f"/v1/volume/targets/{tgt['uuid']}",
        [{"op": "replace", "path": "/volume_id", "value": "vol-9"}],
        expect=200,
    )
    assert patched["volume_id"] == "vol-9"
    await client.call("DELETE", f"/v1/volume/connectors/{conn['uuid']}", expect=204)
    status, _, _ = await client.call("GET", f"/v1/volume/connectors/{conn['uuid']}")
    assert status == 404
    await client.call("DELETE", "/v1/nodes/bfv-1", expect=204)
    status, _, _ = await client.call("GET", f"/v1/volume/targets/{tgt['uuid']}")
    assert status == 404  # targets go with their node


async def test_traits(client: Client) -> None:
    await client.call("POST", "/v1/nodes", {"driver": "fake-hardware", "name": "tr-1"}, expect=201)
    status, _, _ = await client.call("GET", "/v1/nodes/tr-1/traits", headers={"X-OpenStack-Ironic-API-Version": "1.36"})
    assert status == 406  # Ironic: below 1.37 the node controller reads "traits" as a field it does not know
    await client.call("PUT", "/v1/nodes/tr-1/traits", {"traits": ["CUSTOM_GPU", "HW_CPU_X86_AVX2"]}, expect=204)
    await client.call("PUT", "/v1/nodes/tr-1/traits/CUSTOM_FAST", expect=204)
    _, traits, _ = await client.call("GET", "/v1/nodes/tr-1/traits", expect=200)
    assert traits == {"traits": ["CUSTOM_FAST", "CUSTOM_GPU", "HW_CPU_X86_AVX2"]}
    _, node, _ = await client.call("GET", "/v1/nodes/tr-1", expect=200)
    assert sorted(node["traits"]) == traits["traits"]
    status, _, _ = await client.call("PUT", "/v1/nodes/tr-1/traits/lower-case")
    assert status == 400
    status, _, _ = await client.call("PUT", "/v1/nodes/tr-1/traits", {"traits": [f"CUSTOM_{i}" for i in range(51)]})
    assert status == 400
    status, _, _ = await client.call("DELETE", "/v1/nodes/tr-1/traits/CUSTOM_NOPE")
    assert status == 404
    await client.call("DELETE", "/v1/nodes/tr-1/traits/CUSTOM_GPU", expect=204)
    status, _, _ = await client.call("PATCH", "/v1/nodes/tr-1", [{"op": "add", "path": "/traits", "value": []}])
    assert status == 400  # traits have their own API
    await client.call("DELETE", "/v1/nodes/tr-1/traits", expect=204)
    _, traits, _ = await client.call("GET", "/v1/nodes/tr-1/traits", expect=200)
    assert traits == {"traits": []}


async def test_configdrive_refusals_change_nothing(client: Client) -> None:
    """Issue 8's error paths at the API: wrong verb, undecodable, not an ISO, too big."""
    import base64
    import gzip

    _, node, _ = await client.call("POST", "/v1/nodes", {"driver": "fake-hardware", "name": "cd-err"}, expect=201)
    await client.call("PUT", "/v1/nodes/cd-err/states/provision", {"target": "manage"}, expect=202)
    await client.wait_state("cd-err", "manageable")
    good = encode_configdrive(build_configdrive({"uuid": node["uuid"]}, [], {"meta_data": {}}))
    status, body, _ = await client.call(
        "PUT", "/v1/nodes/cd-err/states/provision", {"target": "provide", "configdrive": good}
    )
    assert status == 400 and "only supported when setting provision state to active" in fault(body)
    await client.call("PUT", "/v1/nodes/cd-err/states/provision", {"target": "provide"}, expect=202)
    await client.wait_state("cd-err", "available")
    huge = base64.b64encode(gzip.compress(b"\0" * (65 * 1024 * 1024), compresslevel=1)).decode()
    cases = {
        "not base64 at all": "!!!not-base64!!!",
        "base64 of no gzip and no ISO": base64.b64encode(b"hello world, not an image").decode(),
        "gzip of no ISO": base64.b64encode(gzip.compress(b"plain text")).decode(),
        "65 MiB": huge,
    }
    for label, value in cases.items():
        status, body, _ = await client.call(
            "PUT", "/v1/nodes/cd-err/states/provision", {"target": "active", "configdrive": value}
        )
        assert status == 400, (label, body)
        if label == "65 MiB":
            assert "64" in fault(body) and "MiB" in fault(body), fault(body)
    _, after, _ = await client.call("GET", "/v1/nodes/cd-err", expect=200)
    assert after["provision_state"] == "available" and "configdrive" not in after["instance_info"]
