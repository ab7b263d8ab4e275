"""REST resources of Ironic microversions up to the advertised 1.56 that
Ferrum first lacked, against a live stack: port groups (1.23-1.26), BIOS settings
(1.40), conductors (1.49), allocations (1.52), events (1.54), deploy
templates (1.55)."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import aiohttp
import pytest

from services.api import views
from services.common.db.bios import BiosRepository
from services.common.db.conductors import ConductorRepository
from services.common.db.rows import row_to_dict

LATEST = {"X-OpenStack-Ironic-API-Version": "latest"}


@pytest.fixture(scope="module")
def api(stack: Any) -> str:
    return stack.endpoints["api REST (Ironic v1)"]


async def call(method: str, url: str, body: Any = None, version: str = "latest") -> tuple[int, Any]:
    async with (
        aiohttp.ClientSession() as s,
        s.request(method, url, json=body, headers={"X-OpenStack-Ironic-API-Version": version}) as r,
    ):
        text = await r.text()
        return r.status, (json.loads(text) if text else None)


def fault(body: dict[str, Any]) -> str:
    return json.loads(body["error_message"])["faultstring"]


# -- conductors (1.49) ------------------------------------------------------------------


@pytest.fixture(scope="module")
async def dead_conductor(stack: Any) -> str:
    """A registered conductor that went offline; it drives nothing, so no ring includes it."""
    repo = ConductorRepository(stack.pool)
    await repo.register(
        hostname="gone-conductor", grpc_address="127.0.0.1:1", conductor_group="rack9", hardware_types=[], interfaces={}
    )
    await repo.mark_offline("gone-conductor")
    return "gone-conductor"


async def test_conductor_list_detail_and_show(api: str, dead_conductor: str) -> None:
    status, body = await call("GET", f"{api}/v1/conductors")
    assert status == 200 and "next" not in body
    by_host = {c["hostname"]: c for c in body["conductors"]}
    assert set(by_host) == {"test-conductor", dead_conductor}
    assert all(set(c) == {"hostname", "conductor_group", "alive", "links"} for c in body["conductors"])
    assert by_host["test-conductor"]["alive"] is True and by_host[dead_conductor]["alive"] is False
    assert by_host[dead_conductor]["conductor_group"] == "rack9"
    assert by_host["test-conductor"]["links"][0] == {"href": f"{api}/v1/conductors/test-conductor", "rel": "self"}

    status, body = await call("GET", f"{api}/v1/conductors?detail=true")
    live = next(c for c in body["conductors"] if c["hostname"] == "test-conductor")
    assert {"drivers", "created_at", "updated_at"} <= set(live) and "fake-hardware" in live["drivers"]

    status, one = await call("GET", f"{api}/v1/conductors/test-conductor")
    assert status == 200 and one["alive"] is True and "fake-hardware" in one["drivers"]
    status, one = await call("GET", f"{api}/v1/conductors/test-conductor?fields=hostname,alive")
    assert status == 200 and set(one) == {"hostname", "alive", "links"}


async def test_conductor_pagination_and_errors(api: str, dead_conductor: str) -> None:
    status, page = await call("GET", f"{api}/v1/conductors?limit=1&sort_key=hostname")
    assert status == 200 and [c["hostname"] for c in page["conductors"]] == [dead_conductor]
    assert page["next"].endswith(f"marker={dead_conductor}")
    status, page = await call("GET", page["next"])
    assert [c["hostname"] for c in page["conductors"]] == ["test-conductor"]
    status, page = await call("GET", f"{api}/v1/conductors?sort_key=hostname&sort_dir=desc")
    assert [c["hostname"] for c in page["conductors"]] == ["test-conductor", dead_conductor]

    for url, expected in (
        (f"{api}/v1/conductors/nope", 404),
        (f"{api}/v1/conductors?sort_key=alive", 400),
        (f"{api}/v1/conductors?marker=nope", 400),
        (f"{api}/v1/conductors?detail=true&fields=hostname", 400),
        (f"{api}/v1/conductors?fields=bogus", 400),
        (f"{api}/v1/conductors?limit=0", 400),
    ):
        status, body = await call("GET", url)
        assert status == expected, (url, status, body)
        assert fault(body)


async def test_conductors_are_404_below_1_49_and_linked_from_v1(api: str) -> None:
    for path in ("/v1/conductors", "/v1/conductors/test-conductor"):
        status, _ = await call("GET", api + path, version="1.48")
        assert status == 404
    _, v1 = await call("GET", f"{api}/v1", version="1.49")
    assert v1["conductors"][0]["href"] == f"{api}/v1/conductors/"
    _, v1 = await call("GET", f"{api}/v1", version="1.48")
    assert "conductors" not in v1
    status, node = await call("POST", f"{api}/v1/nodes", {"driver": "fake-hardware"})
    assert status == 201 and node["conductor"] == "test-conductor"


# -- events (1.54) ------------------------------------------------------------------------

EVENT = {
    "event": "network.bind_port",
    "port_id": "11111111-2222-3333-4444-555555555555",
    "mac_address": "52:54:00:12:34:56",
    "status": "ACTIVE",
}


async def test_events_accepts_valid_network_events(api: str) -> None:
    full = {
        **EVENT,
        "device_id": "11111111-2222-3333-4444-666666666666",
        "binding:host_id": "11111111-2222-3333-4444-777777777777",
        "binding:vnic_type": "baremetal",
    }
    status, body = await call("POST", f"{api}/v1/events", {"events": [EVENT, full]})
    assert status == 204 and body is None
    status, _ = await call("POST", f"{api}/v1/events", {"events": []})
    assert status == 204


async def test_events_rejects_bad_input_and_old_versions(api: str) -> None:
    bad = [
        {"events": [{**EVENT, "event": "network.explode"}]},
        {"events": [{**EVENT, "port_id": "nope"}]},
        {"events": [{**EVENT, "mac_address": "zz:zz"}]},
        {"events": [{k: v for k, v in EVENT.items() if k != "status"}]},
        {"events": [{**EVENT, "surprise": 1}]},
        {"events": [{**EVENT, "device_id": "nope"}]},
        {"events": "x"},
        {"events": [EVENT], "more": 1},
        [EVENT],
    ]
    for body in bad:
        status, reply = await call("POST", f"{api}/v1/events", body)
        assert status == 400, (body, reply)
    status, _ = await call("POST", f"{api}/v1/events", {"events": [EVENT]}, version="1.53")
    assert status == 404


# -- deploy templates (1.55) -----------------------------------------------------------------

STEP = {"interface": "raid", "step": "create_configuration", "args": {"level": "1"}, "priority": 10}


async def test_deploy_template_lifecycle(api: str) -> None:
    status, created = await call(
        "POST", f"{api}/v1/deploy_templates", {"name": "CUSTOM_RAID1", "steps": [STEP], "extra": {"team": "a"}}
    )
    assert status == 201, created
    assert created["name"] == "CUSTOM_RAID1" and created["steps"] == [STEP] and created["extra"] == {"team": "a"}
    ident = created["uuid"]
    assert created["links"][0]["href"] == f"{api}/v1/deploy_templates/{ident}"

    status, by_name = await call("GET", f"{api}/v1/deploy_templates/CUSTOM_RAID1")
    assert status == 200 and by_name["uuid"] == ident
    status, page = await call("GET", f"{api}/v1/deploy_templates")
    assert status == 200 and [set(t) for t in page["deploy_templates"]] == [{"uuid", "name", "links"}]
    status, page = await call("GET", f"{api}/v1/deploy_templates?detail=true")
    assert page["deploy_templates"][0]["steps"] == [STEP]
    status, one = await call("GET", f"{api}/v1/deploy_templates/{ident}?fields=steps")
    assert set(one) == {"steps", "links"}

    bios = {"interface": "bios", "step": "apply_configuration", "args": {}, "priority": 5}
    status, patched = await call(
        "PATCH",
        f"{api}/v1/deploy_templates/{ident}",
        [
            {"op": "add", "path": "/steps/-", "value": bios},
            {"op": "replace", "path": "/name", "value": "CUSTOM_RAID1_BIOS"},
            {"op": "remove", "path": "/extra/team"},
        ],
    )
    assert status == 200, patched
    assert patched["steps"] == [STEP, bios] and patched["name"] == "CUSTOM_RAID1_BIOS" and patched["extra"] == {}
    assert patched["updated_at"] is not None

    status, _ = await call("DELETE", f"{api}/v1/deploy_templates/CUSTOM_RAID1_BIOS")
    assert status == 204
    status, _ = await call("GET", f"{api}/v1/deploy_templates/{ident}")
    assert status == 404


async def test_deploy_template_errors_change_nothing(api: str) -> None:
    status, first = await call("POST", f"{api}/v1/deploy_templates", {"name": "CUSTOM_KEEP", "steps": [STEP]})
    assert status == 201
    bad_creates = [
        ({"name": "lowercase", "steps": [STEP]}, 400),
        ({"name": "CUSTOM_X", "steps": []}, 400),
        ({"name": "CUSTOM_X", "steps": [{**STEP, "interface": "power"}]}, 400),
        ({"name": "CUSTOM_X", "steps": [{**STEP, "priority": -1}]}, 400),
        ({"name": "CUSTOM_X", "steps": [{k: v for k, v in STEP.items() if k != "args"}]}, 400),
        ({"name": "CUSTOM_X", "steps": [STEP, STEP]}, 400),
        ({"name": "CUSTOM_X", "steps": [STEP], "uuid": "nope"}, 400),
        ({"name": "CUSTOM_X", "steps": [STEP], "color": "red"}, 400),
        ({"steps": [STEP]}, 400),
        ({"name": "CUSTOM_KEEP", "steps": [STEP]}, 409),
        ({"name": "CUSTOM_X", "steps": [STEP], "uuid": first["uuid"]}, 409),
    ]
    for body, expected in bad_creates:
        status, reply = await call("POST", f"{api}/v1/deploy_templates", body)
        assert status == expected, (body, status, reply)
    _, other = await call("POST", f"{api}/v1/deploy_templates", {"name": "CUSTOM_OTHER", "steps": [STEP]})
    bad_patches = [
        ([{"op": "replace", "path": "/name", "value": "CUSTOM_OTHER"}], 409),
        ([{"op": "replace", "path": "/uuid", "value": other["uuid"]}], 400),
        ([{"op": "remove", "path": "/steps"}], 400),
        ([{"op": "replace", "path": "/steps/0/priority", "value": "high"}], 400),
        ([{"op": "add", "path": "/color", "value": "red"}], 400),
    ]
    for patch, expected in bad_patches:
        status, reply = await call("PATCH", f"{api}/v1/deploy_templates/CUSTOM_KEEP", patch)
        assert status == expected, (patch, status, reply)
    _, kept = await call("GET", f"{api}/v1/deploy_templates/CUSTOM_KEEP")
    assert kept == first
    for url, expected in (
        (f"{api}/v1/deploy_templates?sort_key=steps", 400),
        (f"{api}/v1/deploy_templates?marker=nope", 400),
        (f"{api}/v1/deploy_templates/CUSTOM_NOPE", 404),
    ):
        status, _ = await call("GET", url)
        assert status == expected, url
    status, _ = await call("GET", f"{api}/v1/deploy_templates", version="1.54")
    assert status == 404
    status, _ = await call(
        "POST", f"{api}/v1/deploy_templates", {"name": "CUSTOM_OLD", "steps": [STEP]}, version="1.54"
    )
    assert status == 405  # Ironic refuses writes below 1.55 as a method it does not allow


async def test_deploy_template_pages(api: str) -> None:
    names = [f"CUSTOM_PAGE_{i}" for i in range(5)]
    for name in names:
        status, _ = await call("POST", f"{api}/v1/deploy_templates", {"name": name, "steps": [STEP]})
        assert status == 201
    seen: list[str] = []
    url = f"{api}/v1/deploy_templates?limit=2&sort_key=name&sort_dir=desc"
    for _ in range(20):
        status, page = await call("GET", url)
        assert status == 200 and len(page["deploy_templates"]) <= 2
        seen += [t["name"] for t in page["deploy_templates"]]
        if "next" not in page:
            break
        url = page["next"]
    page_names = [n for n in seen if n.startswith("CUSTOM_PAGE_")]
    assert page_names == sorted(names, reverse=True)
    assert seen == sorted(seen, reverse=True) and len(seen) == len(set(seen))


# -- BIOS settings (1.40) -------------------------------------------------------------------


async def test_bios_settings_read_from_the_cache(api: str, stack: Any) -> None:
    status, node = await call("POST", f"{api}/v1/nodes", {"driver": "fake-hardware", "name": "bios-node"})
    assert status == 201
    status, body = await call("GET", f"{api}/v1/nodes/bios-node/bios")
    assert status == 200 and body == {"bios": []}  # fake hardware caches nothing, as in Ironic

    row = await stack.pool.fetchrow("SELECT id FROM nodes WHERE uuid = $1::uuid", node["uuid"])
    repo = BiosRepository(stack.pool)
    await repo.replace(row["id"], {"ProcVirtualization": "Enabled", "BootMode": "Uefi"})
    status, body = await call("GET", f"{api}/v1/nodes/{node['uuid']}/bios")
    assert [s["name"] for s in body["bios"]] == ["BootMode", "ProcVirtualization"]
    setting = body["bios"][1]
    assert setting["value"] == "Enabled" and set(setting) == {"name", "value", "created_at", "updated_at", "links"}
    assert setting["links"][0]["href"] == f"{api}/v1/nodes/{node['uuid']}/bios/ProcVirtualization"

    status, one = await call("GET", f"{api}/v1/nodes/bios-node/bios/BootMode")
    assert status == 200 and list(one) == ["BootMode"] and one["BootMode"]["value"] == "Uefi"

    await repo.replace(row["id"], {"ProcVirtualization": "Disabled"})
    _, body = await call("GET", f"{api}/v1/nodes/bios-node/bios")
    assert [(s["name"], s["value"]) for s in body["bios"]] == [("ProcVirtualization", "Disabled")]
    assert body["bios"][0]["created_at"] == setting["created_at"] and body["bios"][0]["updated_at"] is not None

    for url, version in (
        (f"{api}/v1/nodes/bios-node/bios/BootMode", "latest"),
        (f"{api}/v1/nodes/no-such-node/bios", "latest"),
        (f"{api}/v1/nodes/bios-node/bios", "1.39"),
        (f"{api}/v1/nodes/bios-node/bios/ProcVirtualization", "1.39"),
    ):
        status, reply = await call("GET", url, version=version)
        assert status == 404, (url, version, reply)


# -- port groups (1.23, 1.24, 1.26) ---------------------------------------------------------


async def test_portgroup_lifecycle_with_ports(api: str) -> None:
    _, node = await call("POST", f"{api}/v1/nodes", {"driver": "fake-hardware", "name": "bonded"})
    status, group = await call(
        "POST",
        f"{api}/v1/portgroups",
        {"node_uuid": node["uuid"], "name": "bond0", "address": "52:54:00:BB:00:10", "properties": {"miimon": "100"}},
    )
    assert status == 201, group
    assert group["address"] == "52:54:00:bb:00:10" and group["mode"] == "active-backup"
    assert group["standalone_ports_supported"] is True and group["properties"] == {"miimon": "100"}
    assert group["ports"][0]["href"] == f"{api}/v1/portgroups/{group['uuid']}/ports"

    status, port = await call(
        "POST",
        f"{api}/v1/ports",
        {"node_uuid": node["uuid"], "address": "52:54:00:bb:00:11", "portgroup_uuid": group["uuid"]},
    )
    assert status == 201 and port["portgroup_uuid"] == group["uuid"]
    status, loose = await call("POST", f"{api}/v1/ports", {"node_uuid": node["uuid"], "address": "52:54:00:bb:00:12"})
    assert status == 201 and loose["portgroup_uuid"] is None
    status, joined = await call(
        "PATCH",
        f"{api}/v1/ports/{loose['uuid']}",
        [{"op": "replace", "path": "/portgroup_uuid", "value": group["uuid"]}],
    )
    assert status == 200 and joined["portgroup_uuid"] == group["uuid"]

    _, members = await call("GET", f"{api}/v1/portgroups/bond0/ports")
    assert sorted(p["uuid"] for p in members["ports"]) == sorted([port["uuid"], loose["uuid"]])
    _, members = await call("GET", f"{api}/v1/portgroups/bond0/ports/detail")
    assert {p["portgroup_uuid"] for p in members["ports"]} == {group["uuid"]}
    _, shown = await call("GET", f"{api}/v1/ports/{port['uuid']}")
    assert shown["portgroup_uuid"] == group["uuid"]
    _, on_node = await call("GET", f"{api}/v1/nodes/bonded/portgroups")
    assert [g["name"] for g in on_node["portgroups"]] == ["bond0"]
    assert set(on_node["portgroups"][0]) == {"uuid", "address", "name", "links"}
    _, detail = await call("GET", f"{api}/v1/nodes/{node['uuid']}/portgroups/detail")
    assert detail["portgroups"][0]["node_uuid"] == node["uuid"]
    _, by_address = await call("GET", f"{api}/v1/portgroups?address=52:54:00:bb:00:10")
    assert [g["uuid"] for g in by_address["portgroups"]] == [group["uuid"]]

    status, patched = await call(
        "PATCH",
        f"{api}/v1/portgroups/bond0",
        [{"op": "replace", "path": "/mode", "value": "802.3ad"}, {"op": "add", "path": "/extra/rack", "value": "r1"}],
    )
    assert status == 200 and patched["mode"] == "802.3ad" and patched["extra"] == {"rack": "r1"}

    _, filtered = await call("GET", f"{api}/v1/ports?portgroup=bond0")
    assert sorted(p["uuid"] for p in filtered["ports"]) == sorted([port["uuid"], loose["uuid"]])
    status, _ = await call("GET", f"{api}/v1/ports?portgroup=bond0&node=bonded")
    assert status == 400
    status, _ = await call("GET", f"{api}/v1/ports?portgroup=bond0", version="1.23")
    assert status == 406
    cli = await baremetal(api, "port", "list", "--port-group", "bond0", "-f", "json")
    assert sorted(p["uuid"] for p in cli) == sorted([port["uuid"], loose["uuid"]])

    status, body = await call("DELETE", f"{api}/v1/portgroups/bond0")
    assert status == 409 and "contains ports" in fault(body)
    for member in (port, loose):
        status, left = await call(
            "PATCH", f"{api}/v1/ports/{member['uuid']}", [{"op": "remove", "path": "/portgroup_uuid"}]
        )
        assert status == 200 and left["portgroup_uuid"] is None
    status, _ = await call("DELETE", f"{api}/v1/portgroups/bond0")
    assert status == 204
    status, _ = await call("GET", f"{api}/v1/portgroups/{group['uuid']}")
    assert status == 404


async def test_portgroup_versions_and_errors(api: str) -> None:
    _, node = await call("POST", f"{api}/v1/nodes", {"driver": "fake-hardware"})
    _, other = await call("POST", f"{api}/v1/nodes", {"driver": "fake-hardware"})
    status, group = await call(
        "POST", f"{api}/v1/portgroups", {"node_uuid": node["uuid"], "name": "bond-v"}, version="1.23"
    )
    assert status == 201 and "mode" not in group and "properties" not in group and "ports" not in group
    status, _ = await call(
        "POST", f"{api}/v1/portgroups", {"node_uuid": node["uuid"], "mode": "balance-rr"}, version="1.25"
    )
    assert status == 406
    for path, version in (
        ("/v1/portgroups", "1.22"),
        (f"/v1/portgroups/{group['uuid']}", "1.22"),
        (f"/v1/nodes/{node['uuid']}/portgroups", "1.23"),
        (f"/v1/portgroups/{group['uuid']}/ports", "1.23"),
    ):
        status, _ = await call("GET", api + path, version=version)
        assert status == 404, (path, version)
    _, v1 = await call("GET", f"{api}/v1", version="1.23")
    assert "portgroups" in v1

    bad = [
        ({"name": "bond-x"}, 400),
        ({"node_uuid": node["uuid"], "address": "not-a-mac"}, 400),
        ({"node_uuid": node["uuid"], "name": group["uuid"]}, 400),
        ({"node_uuid": node["uuid"], "standalone_ports_supported": "yes"}, 400),
        ({"node_uuid": node["uuid"], "color": "red"}, 400),
        ({"node_uuid": "11111111-2222-3333-4444-555555555555"}, 404),
        ({"node_uuid": node["uuid"], "name": "bond-v"}, 409),
    ]
    for body, expected in bad:
        status, reply = await call("POST", f"{api}/v1/portgroups", body)
        assert status == expected, (body, status, reply)
    status, _ = await call("POST", f"{api}/v1/portgroups", {"node_uuid": node["uuid"], "address": "52:54:00:bb:00:20"})
    assert status == 201
    status, _ = await call("POST", f"{api}/v1/portgroups", {"node_uuid": other["uuid"], "address": "52:54:00:bb:00:20"})
    assert status == 409

    # A port joins only a group of its own node, and nothing changes when it is refused.
    status, body = await call(
        "POST",
        f"{api}/v1/ports",
        {"node_uuid": other["uuid"], "address": "52:54:00:bb:00:21", "portgroup_uuid": group["uuid"]},
    )
    assert status == 400 and "another node" in fault(body)
    _, ports = await call("GET", f"{api}/v1/ports?address=52:54:00:bb:00:21")
    assert ports["ports"] == []
    status, _ = await call(
        "POST",
        f"{api}/v1/ports",
        {
            "node_uuid": node["uuid"],
            "address": "52:54:00:bb:00:22",
            "portgroup_uuid": "11111111-2222-3333-4444-555555555555",
        },
    )
    assert status == 400
    status, member = await call(
        "POST",
        f"{api}/v1/ports",
        {"node_uuid": node["uuid"], "address": "52:54:00:bb:00:23", "portgroup_uuid": group["uuid"]},
    )
    assert status == 201
    status, body = await call(
        "PATCH", f"{api}/v1/ports/{member['uuid']}", [{"op": "replace", "path": "/node_uuid", "value": other["uuid"]}]
    )
    assert status == 400
    status, body = await call(
        "PATCH",
        f"{api}/v1/portgroups/{group['uuid']}",
        [{"op": "replace", "path": "/node_uuid", "value": other["uuid"]}],
    )
    assert status == 409
    status, _ = await call(
        "PATCH", f"{api}/v1/portgroups/{group['uuid']}", [{"op": "replace", "path": "/uuid", "value": other["uuid"]}]
    )
    assert status == 400
    _, still = await call("GET", f"{api}/v1/ports/{member['uuid']}")
    assert still["node_uuid"] == node["uuid"] and still["portgroup_uuid"] == group["uuid"]

    # Deleting the node takes its groups (and their ports) with it.
    status, _ = await call("DELETE", f"{api}/v1/nodes/{node['uuid']}")
    assert status == 204
    status, _ = await call("GET", f"{api}/v1/portgroups/{group['uuid']}")
    assert status == 404


async def test_portgroup_pages(api: str) -> None:
    _, node = await call("POST", f"{api}/v1/nodes", {"driver": "fake-hardware"})
    names = [f"page-bond-{i}" for i in range(5)]
    for name in names:
        status, _ = await call("POST", f"{api}/v1/portgroups", {"node_uuid": node["uuid"], "name": name})
        assert status == 201
    seen: list[str] = []
    url = f"{api}/v1/nodes/{node['uuid']}/portgroups?limit=2&sort_key=name&sort_dir=desc"
    for _ in range(10):
        status, page = await call("GET", url)
        assert status == 200
        seen += [g["name"] for g in page["portgroups"]]
        if "next" not in page:
            break
        url = page["next"]
    assert seen == sorted(names, reverse=True)


# -- node fields newer than the advertised maximum -------------------------------------------


async def test_fields_newer_than_the_client_are_hidden_and_refused(api: str, stack: Any) -> None:
    """retired (1.61), lessee (1.65), network_data (1.66), boot_mode/secure_boot (1.75): stored,
    but a 1.56 client neither sees nor sets them (406), as Ironic answers for too-new fields."""
    old = "1.56"
    status, node = await call(
        "POST", f"{api}/v1/nodes", {"driver": "fake-hardware", "name": "future-fields"}, version=old
    )
    assert status == 201
    assert not {"retired", "retired_reason", "lessee", "network_data", "boot_mode", "secure_boot"} & set(node)
    for body in (
        {"driver": "fake-hardware", "lessee": "p1"},
        {"driver": "fake-hardware", "retired": True},
        {"driver": "fake-hardware", "network_data": {"links": []}},
    ):
        status, reply = await call("POST", f"{api}/v1/nodes", body, version=old)
        assert status == 406, (body, reply)
    for patch, expected in (
        ([{"op": "replace", "path": "/lessee", "value": "p1"}], 406),
        ([{"op": "replace", "path": "/boot_mode", "value": "uefi"}], 400),
    ):  # read only
        status, reply = await call("PATCH", f"{api}/v1/nodes/future-fields", patch, version=old)
        assert status == expected, (patch, reply)
    status, _ = await call("GET", f"{api}/v1/nodes/future-fields?fields=lessee", version=old)
    assert status == 406
    _, states = await call("GET", f"{api}/v1/nodes/future-fields/states", version=old)
    assert "boot_mode" not in states
    row = await stack.pool.fetchrow("SELECT * FROM nodes WHERE uuid = $1::uuid", node["uuid"])
    assert row["lessee"] is None and row["retired"] is False
    future = views.node_document(row_to_dict(row), base=api, version=(1, 78))
    assert future["retired"] is False and future["lessee"] is None and future["network_data"] == {}
    assert "boot_mode" in future and "secure_boot" in future


# -- allocations (1.52) ---------------------------------------------------------------------


async def wait_for(api: str, ident: str, state: str) -> dict[str, Any]:
    deadline = time.monotonic() + 30
    while True:
        _, node = await call("GET", f"{api}/v1/nodes/{ident}")
        if node["provision_state"] == state and node["reservation"] is None:
            return node
        assert time.monotonic() < deadline, node
        await asyncio.sleep(0.05)


async def allocate(api: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    """POST an allocation; Ironic answers ``allocating`` at once, so poll until it settles."""
    status, alloc = await call("POST", f"{api}/v1/allocations", body)
    if status != 201:
        return status, alloc
    assert alloc["state"] == "allocating" and alloc["node_uuid"] is None, alloc
    deadline = time.monotonic() + 30
    while alloc["state"] == "allocating":
        assert time.monotonic() < deadline, alloc
        await asyncio.sleep(0.02)
        _, alloc = await call("GET", f"{api}/v1/allocations/{alloc['uuid']}")
    return status, alloc


async def available_node(api: str, name: str, resource_class: str, traits: list[str]) -> dict[str, Any]:
    status, node = await call(
        "POST", f"{api}/v1/nodes", {"driver": "fake-hardware", "name": name, "resource_class": resource_class}
    )
    assert status == 201, node
    if traits:
        assert (await call("PUT", f"{api}/v1/nodes/{name}/traits", {"traits": traits}))[0] == 204
    for verb, state in (("manage", "manageable"), ("provide", "available")):
        assert (await call("PUT", f"{api}/v1/nodes/{name}/states/provision", {"target": verb}))[0] == 202
        node = await wait_for(api, name, state)
    return node


async def test_allocation_claims_a_matching_node_and_releases_it(api: str) -> None:
    gold = await available_node(api, "alloc-gold", "gold", ["CUSTOM_GPU"])
    await available_node(api, "alloc-silver", "silver", [])
    status, alloc = await allocate(
        api,
        {"resource_class": "gold", "traits": ["CUSTOM_GPU"], "name": "job-1", "extra": {"a": 1}},
    )
    assert status == 201, alloc
    assert alloc["state"] == "active" and alloc["node_uuid"] == gold["uuid"] and alloc["last_error"] is None
    assert alloc["traits"] == ["CUSTOM_GPU"] and alloc["extra"] == {"a": 1}
    _, node = await call("GET", f"{api}/v1/nodes/alloc-gold")
    assert node["instance_uuid"] == alloc["uuid"] and node["allocation_uuid"] == alloc["uuid"]
    _, listed = await call("GET", f"{api}/v1/nodes/detail?resource_class=gold")
    assert [n["allocation_uuid"] for n in listed["nodes"]] == [alloc["uuid"]]
    status, patched = await call(  # a PATCH that changes nothing still shows the allocation
        "PATCH", f"{api}/v1/nodes/alloc-gold", [{"op": "replace", "path": "/resource_class", "value": "gold"}]
    )
    assert status == 200 and patched["allocation_uuid"] == alloc["uuid"], patched
    _, old_view = await call("GET", f"{api}/v1/nodes/alloc-gold", version="1.51")
    assert "allocation_uuid" not in old_view

    status, none_left = await allocate(api, {"resource_class": "gold"})
    assert status == 201 and none_left["state"] == "error" and none_left["node_uuid"] is None
    assert "gold" in none_left["last_error"]
    status, wrong = await allocate(api, {"resource_class": "silver", "traits": ["CUSTOM_GPU"]})
    assert wrong["state"] == "error"
    status, pinned = await allocate(api, {"resource_class": "silver", "candidate_nodes": ["alloc-silver"]})
    assert pinned["state"] == "active" and pinned["candidate_nodes"] == [pinned["node_uuid"]]

    _, one = await call("GET", f"{api}/v1/allocations/job-1")
    assert one["uuid"] == alloc["uuid"]
    _, on_node = await call("GET", f"{api}/v1/nodes/alloc-gold/allocation")
    assert on_node["uuid"] == alloc["uuid"]
    _, errored = await call("GET", f"{api}/v1/allocations?state=error")
    assert {a["uuid"] for a in errored["allocations"]} == {none_left["uuid"], wrong["uuid"]}
    _, by_node = await call("GET", f"{api}/v1/allocations?node=alloc-silver&fields=uuid,state")
    assert [set(a) for a in by_node["allocations"]] == [{"uuid", "state", "links"}]

    status, _ = await call("DELETE", f"{api}/v1/allocations/job-1")
    assert status == 204
    _, node = await call("GET", f"{api}/v1/nodes/alloc-gold")
    assert node["instance_uuid"] is None and node["allocation_uuid"] is None
    status, _ = await call("GET", f"{api}/v1/nodes/alloc-gold/allocation")
    assert status == 404
    status, again = await allocate(api, {"resource_class": "gold"})
    assert again["state"] == "active" and again["node_uuid"] == gold["uuid"]
    status, _ = await call("DELETE", f"{api}/v1/nodes/alloc-gold/allocation")
    assert status == 204


async def test_allocation_of_a_deployed_node_and_errors(api: str) -> None:
    await available_node(api, "alloc-deployed", "bronze", [])
    _, alloc = await allocate(api, {"resource_class": "bronze", "name": "job-d"})
    assert alloc["state"] == "active"
    assert (await call("PUT", f"{api}/v1/nodes/alloc-deployed/states/provision", {"target": "active"}))[0] == 202
    await wait_for(api, "alloc-deployed", "active")
    status, body = await call("DELETE", f"{api}/v1/allocations/job-d")
    assert status == 409 and "deployed" in fault(body)
    _, node = await call("GET", f"{api}/v1/nodes/alloc-deployed")
    assert node["instance_uuid"] == alloc["uuid"]
    assert (await call("PUT", f"{api}/v1/nodes/alloc-deployed/maintenance", {"reason": "release"}))[0] == 202
    status, _ = await call("DELETE", f"{api}/v1/allocations/job-d")
    assert status == 204
    _, node = await call("GET", f"{api}/v1/nodes/alloc-deployed")
    assert node["instance_uuid"] is None

    for body, expected in (
        ({}, 400),
        ({"resource_class": ""}, 400),
        ({"resource_class": "x", "traits": ["bad"]}, 400),
        ({"resource_class": "x", "candidate_nodes": ["no-such-node"]}, 400),
        ({"resource_class": "x", "name": "11111111-2222-3333-4444-555555555555"}, 400),
        ({"resource_class": "x", "color": "red"}, 400),
    ):
        status, reply = await call("POST", f"{api}/v1/allocations", body)
        assert status == expected, (body, reply)
    status, _ = await call("POST", f"{api}/v1/allocations", {"resource_class": "x", "name": "dup"})
    assert status == 201
    status, _ = await call("POST", f"{api}/v1/allocations", {"resource_class": "x", "name": "dup"})
    assert status == 409
    for url, expected in (
        (f"{api}/v1/allocations/nope", 404),
        (f"{api}/v1/allocations?state=bogus", 400),
        (f"{api}/v1/allocations?sort_key=traits", 400),
    ):
        status, _ = await call("GET", url)
        assert status == expected, url
    status, _ = await call("GET", f"{api}/v1/allocations", version="1.51")
    assert status == 404
    status, _ = await call("POST", f"{api}/v1/allocations", {"resource_class": "x"}, version="1.51")
    assert status == 405  # Ironic refuses writes below 1.52 as a method it does not allow


# -- trailing slashes (python-ironicclient's filtered lists) -----------------------------------


async def baremetal(api: str, *args: str) -> Any:
    """Run the real `baremetal` CLI (python-ironicclient) against the stack; its JSON output."""
    import os
    import sys
    from pathlib import Path

    process = await asyncio.create_subprocess_exec(
        str(Path(sys.executable).with_name("baremetal")),
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "OS_AUTH_TYPE": "none", "OS_ENDPOINT": api},
    )
    out, err = await asyncio.wait_for(process.communicate(), 120)
    assert process.returncode == 0, err.decode()
    return json.loads(out)


async def test_trailing_slash_redirects_to_the_route(api: str) -> None:
    _, node = await call("POST", f"{api}/v1/nodes", {"driver": "fake-hardware", "name": "slashed"})
    _, port = await call("POST", f"{api}/v1/ports", {"node_uuid": node["uuid"], "address": "52:54:00:dd:00:01"})
    status, listed = await call("GET", f"{api}/v1/ports/?node=slashed")  # aiohttp follows the 308
    assert status == 200 and [p["uuid"] for p in listed["ports"]] == [port["uuid"]]
    async with aiohttp.ClientSession() as s:
        async with s.post(
            f"{api}/v1/nodes/", json={"driver": "fake-hardware"}, headers=LATEST, allow_redirects=False
        ) as r:
            assert r.status == 308 and r.headers["Location"] == f"{api}/v1/nodes"
        async with s.get(f"{api}/v1/ports/?node=slashed&limit=5", allow_redirects=False) as r:
            assert r.status == 308 and r.headers["Location"] == f"{api}/v1/ports?node=slashed&limit=5"
        for path in ("/v1/nothing/", "/v1/nodes/slashed/nothing/"):
            async with s.get(api + path, headers=LATEST, allow_redirects=False) as r:
                assert r.status == 404, path
    cli = await baremetal(api, "node", "list", "--provision-state", "enroll", "-f", "json")
    assert "slashed" in [n["name"] for n in cli]


async def test_baremetal_cli_drives_the_new_resources(api: str) -> None:
    """python-ironicclient's own commands against conductors, port groups, allocations,
    deploy templates and BIOS settings (it negotiates down to the advertised 1.56)."""
    conductors = await baremetal(api, "conductor", "list", "-f", "json")
    assert {"hostname": "test-conductor", "conductor_group": "", "alive": True} in conductors
    node = await available_node(api, "cli-node", "cli-class", [])
    group = await baremetal(
        api, "port", "group", "create", "--node", node["uuid"], "--name", "cli-bond", "--mode", "802.3ad", "-f", "json"
    )
    assert group["mode"] == "802.3ad" and group["node_uuid"] == node["uuid"]
    template = await baremetal(
        api,
        "deploy",
        "template",
        "create",
        "CUSTOM_CLI_TEMPLATE",
        "--steps",
        json.dumps([{"interface": "bios", "step": "apply_configuration", "args": {}, "priority": 10}]),
        "-f",
        "json",
    )
    assert template["name"] == "CUSTOM_CLI_TEMPLATE"
    allocation = await baremetal(
        api, "allocation", "create", "--resource-class", "cli-class", "--wait", "30", "-f", "json"
    )
    assert allocation["state"] == "active" and allocation["node_uuid"] == node["uuid"]
    assert await baremetal(api, "node", "bios", "setting", "list", "cli-node", "-f", "json") == []
