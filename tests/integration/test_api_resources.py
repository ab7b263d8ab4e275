"""REST resources added on the way from 1.56 towards 1.78, against a live
stack: conductors (1.49)."""

from __future__ import annotations

import json
from typing import Any

import aiohttp
import pytest

from services.common.db.conductors import ConductorRepository

LATEST = {"X-OpenStack-Ironic-API-Version": "latest"}


@pytest.fixture(scope="module")
def api(stack: Any) -> str:
    return stack.endpoints["api REST (Ironic v1)"]


async def call(method: str, url: str, body: Any = None, version: str = "latest") -> tuple[int, Any]:
    async with aiohttp.ClientSession() as s:
        async with s.request(method, url, json=body, headers={"X-OpenStack-Ironic-API-Version": version}) as r:
            text = await r.text()
            return r.status, (json.loads(text) if text else None)


def fault(body: dict[str, Any]) -> str:
    return json.loads(body["error_message"])["faultstring"]


# -- conductors (1.49) ------------------------------------------------------------------


@pytest.fixture(scope="module")
async def dead_conductor(stack: Any) -> str:
    """A registered conductor that went offline; it drives nothing, so no ring includes it."""
    repo = ConductorRepository(stack.pool)
    await repo.register(hostname="gone-conductor", grpc_address="127.0.0.1:1", conductor_group="rack9",
                        hardware_types=[], interfaces={})
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
