"""The node field ``automated_clean`` (microversion 1.47) against a live stack
over REST: false skips automated cleaning, true always cleans, null follows
the conductor's ``automated_clean`` option, as in Ironic. Fake cleaning is
instant, so what happened is read from the node history and the node_events
feed the conductor writes with every transition."""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import asyncpg
import pytest

from services.common.db.embedded import EmbeddedPostgres
from tests.conftest import TEMPLATE, test_settings

V = {"X-OpenStack-Ironic-API-Version": "1.56"}
RAN = "automated cleaning finished"
SKIPPED_API = "automated cleaning skipped: disabled via the API"
SKIPPED_CONFIG = "automated cleaning skipped: disabled via configuration"
PATHS = {  # (provision_state, event) rows of the node_events feed per verb
    "provide": [("cleaning", "provide"), ("available", "done")],
    "deleted": [("deleting", "delete"), ("cleaning", "clean"), ("available", "done")],
}


class Client:
    """Real REST calls, plus read access to the database for the audit trail."""

    def __init__(self, session: aiohttp.ClientSession, base: str, pool: asyncpg.Pool) -> None:
        self.session, self.base, self.pool = session, base, pool

    async def call(
        self, method: str, path: str, body: Any = None, version: str = "1.56", expect: int | None = None
    ) -> tuple[int, Any]:
        headers = {"X-OpenStack-Ironic-API-Version": version}
        async with self.session.request(method, self.base + path, json=body, headers=headers) as r:
            text = await r.text()
            if expect is not None:
                assert r.status == expect, f"{method} {path}: {r.status} {text}"
            return r.status, json.loads(text) if text else None

    async def wait_state(self, ident: str, state: str, timeout: float = 30) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            _, node = await self.call("GET", f"/v1/nodes/{ident}", expect=200)
            if node["provision_state"] == state and node["reservation"] is None:
                return node
            assert time.monotonic() < deadline, f"{ident} stuck in {node['provision_state']}: {node['last_error']}"
            await asyncio.sleep(0.05)

    async def move(self, ident: str, target: str, state: str) -> dict[str, Any]:
        await self.call("PUT", f"/v1/nodes/{ident}/states/provision", {"target": target}, expect=202)
        return await self.wait_state(ident, state)

    async def enroll(self, name: str, automated_clean: bool | None) -> dict[str, Any]:
        body: dict[str, Any] = {"driver": "fake-hardware", "name": name}
        if automated_clean is not None:
            body["automated_clean"] = automated_clean
        _, node = await self.call("POST", "/v1/nodes", body, expect=201)
        assert node["automated_clean"] is automated_clean
        await self.move(name, "manage", "manageable")
        return node

    async def history(self, uuid: str) -> list[str]:
        """The node_history messages of one node, oldest first."""
        rows = await self.pool.fetch(
            "SELECT h.event FROM node_history h JOIN nodes n ON n.id = h.node_id WHERE n.uuid = $1::uuid ORDER BY h.id",
            uuid,
        )
        return [r["event"] for r in rows]

    async def path(self, uuid: str, after: int) -> list[tuple[str, str]]:
        """(provision_state, event) of the node_events feed after ``after``."""
        rows = await self.pool.fetch(
            "SELECT provision_state, event FROM node_events WHERE node_uuid = $1::uuid AND sequence > $2 "
            "ORDER BY sequence",
            uuid,
            after,
        )
        return [(r["provision_state"], r["event"]) for r in rows]

    async def latest(self) -> int:
        return int(await self.pool.fetchval("SELECT coalesce(max(sequence), 0) FROM node_events"))

    async def cleaning_outcome(self, uuid: str, verb: str, before: str, after: str) -> str:
        """Run ``verb`` (which goes through the cleaning state) and return the
        history message of the cleaning -> available step."""
        start = await self.latest()
        seen = len(await self.history(uuid))
        await self.move(uuid, verb, after)
        # Both outcomes pass through the cleaning state, as in Ironic; only the
        # work done there differs.
        assert await self.path(uuid, start) == PATHS[verb]
        new = (await self.history(uuid))[seen:]
        assert new[0].startswith(f"{before} -> ") and new[-1].startswith("cleaning -> available (done): "), new
        return new[-1].split(": ", 1)[1]


async def lifecycle_outcomes(client: Client, uuid: str) -> list[str]:
    """Cleaning outcomes of provide and of undeploy for one manageable node."""
    provided = await client.cleaning_outcome(uuid, "provide", "manageable", "available")
    await client.move(uuid, "active", "active")
    undeployed = await client.cleaning_outcome(uuid, "deleted", "active", "available")
    return [provided, undeployed]


@pytest.fixture(scope="module")
async def client(stack: Any, database_url: str) -> AsyncIterator[Client]:
    pool = await asyncpg.create_pool(database_url, min_size=1, max_size=2)
    try:
        async with aiohttp.ClientSession() as session:
            yield Client(session, stack.endpoints["api REST (Ironic v1)"], pool)
    finally:
        await pool.close()


@pytest.fixture(scope="module")
async def no_clean_client(
    postgres: EmbeddedPostgres, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Client]:
    """A second stack, on its own database, whose conductor has automated_clean=False."""
    from services.runtime import RunningStack

    name = f"ferrum_noclean{os.getpid()}"
    postgres.create_database(name, template=TEMPLATE)
    url = postgres.database_url(name)
    try:
        settings = test_settings(
            url,
            tmp_path_factory.mktemp("noclean"),
            conductor={"hostname": "no-clean-conductor", "automated_clean": False},
        )
        running = RunningStack()
        await running.start(settings, ["conductor", "api"])
        pool = await asyncpg.create_pool(url, min_size=1, max_size=2)
        try:
            async with aiohttp.ClientSession() as session:
                yield Client(session, running.endpoints["api REST (Ironic v1)"], pool)
        finally:
            await pool.close()
            await running.close()
    finally:
        postgres.drop_database(name)


async def test_false_skips_cleaning_with_the_conductor_default(client: Client) -> None:
    node = await client.enroll("ac-false", False)
    assert await lifecycle_outcomes(client, node["uuid"]) == [SKIPPED_API, SKIPPED_API]
    assert RAN not in " ".join(await client.history(node["uuid"]))


@pytest.mark.parametrize("value", [True, None])
async def test_true_and_null_clean_with_the_conductor_default(client: Client, value: bool | None) -> None:
    node = await client.enroll(f"ac-{value}", value)
    assert await lifecycle_outcomes(client, node["uuid"]) == [RAN, RAN]
    assert "skipped" not in " ".join(await client.history(node["uuid"]))


async def test_patching_the_field_changes_the_next_cleaning(client: Client) -> None:
    node = await client.enroll("ac-patched", None)
    assert await client.cleaning_outcome(node["uuid"], "provide", "manageable", "available") == RAN
    await client.move("ac-patched", "active", "active")
    patch = [{"op": "replace", "path": "/automated_clean", "value": False}]
    _, patched = await client.call("PATCH", "/v1/nodes/ac-patched", patch, version="1.47", expect=200)
    assert patched["automated_clean"] is False
    assert await client.cleaning_outcome(node["uuid"], "deleted", "active", "available") == SKIPPED_API
    # below 1.47 the field does not exist: it can be neither seen nor set
    _, old = await client.call("GET", "/v1/nodes/ac-patched", version="1.46", expect=200)
    assert "automated_clean" not in old
    status, _ = await client.call(
        "PATCH", "/v1/nodes/ac-patched", [{"op": "replace", "path": "/automated_clean", "value": True}], version="1.46"
    )
    assert status in (400, 406)
    _, unchanged = await client.call("GET", "/v1/nodes/ac-patched", expect=200)
    assert unchanged["automated_clean"] is False


async def test_bad_value_is_rejected_and_changes_nothing(client: Client) -> None:
    status, _ = await client.call(
        "POST", "/v1/nodes", {"driver": "fake-hardware", "name": "ac-bad", "automated_clean": "yes"}
    )
    assert status == 400
    status, _ = await client.call("GET", "/v1/nodes/ac-bad")
    assert status == 404


@pytest.mark.parametrize(("value", "outcome"), [(True, RAN), (None, SKIPPED_CONFIG), (False, SKIPPED_API)])
async def test_node_field_wins_over_conductor_option_false(
    no_clean_client: Client, value: bool | None, outcome: str
) -> None:
    node = await no_clean_client.enroll(f"nc-{value}", value)
    assert await lifecycle_outcomes(no_clean_client, node["uuid"]) == [outcome, outcome]
