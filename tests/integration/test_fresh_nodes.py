"""A GET of an unchanged node answers without the database, and never after a change is heard.

services/api/fresh_nodes.py remembers the nodes the api has read since their
last change; database triggers (migration 0023) notify every change, from
any writer. These tests tell the two paths apart with a write the trigger
does not see (turned off inside the writing transaction): a GET that still
shows the old row was answered without the database. Everything else here is a change the triggers see, or a write
through the api itself, and each must show at once (or as soon as its
notification arrives).
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import asyncpg
import pytest

from services.api.fresh_nodes import NODE_CHANGES_CHANNEL, FreshNodes, forgetting_middleware
from services.common.db.listener import ChannelListener

HEADERS = {"X-OpenStack-Ironic-API-Version": "latest"}


@pytest.fixture(scope="module")
def api(stack: Any) -> str:
    return stack.endpoints["api REST (Ironic v1)"]


@pytest.fixture(scope="module")
def fresh(stack: Any) -> FreshNodes:
    service = next(s for s in stack.services if s.name == "api")
    assert service.fresh is not None, "the stack's api keeps no current node documents"
    return service.fresh


async def call(method: str, url: str, body: Any = None, *, no_cache: bool = False) -> tuple[int, Any]:
    headers = {**HEADERS, **({"Cache-Control": "no-cache"} if no_cache else {})}
    async with aiohttp.ClientSession() as s, s.request(method, url, json=body, headers=headers) as r:
        text = await r.text()
        return r.status, (json.loads(text) if text else None)


async def new_node(api: str) -> str:
    status, body = await call("POST", f"{api}/v1/nodes", {"driver": "fake-hardware", "name": f"n-{uuid.uuid4().hex}"})
    assert status == 201, body
    return str(body["uuid"])


async def unheard_write(stack: Any, sql: str, *args: Any) -> None:
    """A write its trigger does not see, so no notification is sent: the trigger is off for
    that one transaction (the DDL commits with it, so no other write can miss it)."""
    async with stack.pool.acquire() as conn, conn.transaction():
        await conn.execute("ALTER TABLE nodes DISABLE TRIGGER nodes_changes")
        await conn.execute(sql, *args)
        await conn.execute("ALTER TABLE nodes ENABLE TRIGGER nodes_changes")


async def eventually(check: Callable[[], Awaitable[bool]], what: str) -> None:
    deadline = time.monotonic() + 10
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


async def known_after_two_gets(api: str, fresh: FreshNodes, node: str) -> dict[str, Any]:
    for _ in range(2):  # rendered and remembered, then answered from memory
        status, doc = await call("GET", f"{api}/v1/nodes/{node}")
        assert status == 200, doc
    assert await fresh.known(node) is not None
    return dict(doc)


async def test_an_unchanged_node_is_answered_without_the_database(stack: Any, api: str, fresh: FreshNodes) -> None:
    node = await new_node(api)
    before = await known_after_two_gets(api, fresh, node)
    await unheard_write(stack, "UPDATE nodes SET extra = '{\"unheard\": 1}' WHERE uuid = $1::uuid", node)
    status, doc = await call("GET", f"{api}/v1/nodes/{node}")
    assert (status, doc) == (200, before)  # the row changed, unheard: the answer came from memory
    status, doc = await call("GET", f"{api}/v1/nodes/{node}", no_cache=True)
    assert doc["extra"] == {"unheard": 1}  # no-cache always reads the row

    # A change the triggers see, by direct SQL: forgotten when its notification arrives.
    await stack.pool.execute("UPDATE nodes SET extra = '{\"heard\": 2}' WHERE uuid = $1::uuid", node)
    await eventually(lambda: _forgotten(fresh, node), "the change's notification")
    status, doc = await call("GET", f"{api}/v1/nodes/{node}")
    assert doc["extra"] == {"heard": 2}


async def _forgotten(fresh: FreshNodes, node: str) -> bool:
    return await fresh.known(node) is None


async def test_a_write_through_the_api_reads_back_at_once(stack: Any, api: str, fresh: FreshNodes) -> None:
    node = await new_node(api)
    await known_after_two_gets(api, fresh, node)
    status, body = await call("PATCH", f"{api}/v1/nodes/{node}", [{"op": "add", "path": "/extra/a", "value": 1}])
    assert status == 200, body
    status, doc = await call("GET", f"{api}/v1/nodes/{node}")  # no wait for any notification
    assert doc["extra"] == {"a": 1}

    # Even a refused write forgets (it forgets whatever it was, before its answer is sent).
    await known_after_two_gets(api, fresh, node)
    status, body = await call("PATCH", f"{api}/v1/nodes/{node}", [{"op": "add", "path": "/uuid", "value": "x"}])
    assert status == 400, body
    assert await fresh.known(node) is None


async def test_a_conductor_call_forgets_what_is_known(stack: Any, api: str, fresh: FreshNodes) -> None:
    """The native gRPC API's writes reach the conductor through the same router as REST."""
    service = next(s for s in stack.services if s.name == "api")
    node = await new_node(api)
    await known_after_two_gets(api, fresh, node)
    assert service.router.after_call == fresh.forget
    status, body = await call("GET", f"{api}/v1/nodes/{node}/management/boot_device")  # a read, but a conductor call
    assert status == 200, body
    assert await fresh.known(node) is None


async def test_an_allocation_taking_the_node_is_heard(stack: Any, api: str, fresh: FreshNodes) -> None:
    node = await new_node(api)
    await known_after_two_gets(api, fresh, node)
    allocation = str(uuid.uuid4())
    await stack.pool.execute(
        "INSERT INTO allocations (uuid, node_id, state) SELECT $1::uuid, id, 'active' FROM nodes WHERE uuid = $2::uuid",
        allocation,
        node,
    )
    await eventually(lambda: _forgotten(fresh, node), "the allocation's notification")
    await stack.pool.execute("UPDATE nodes SET instance_uuid = $1::uuid WHERE uuid = $2::uuid", allocation, node)
    await eventually(lambda: _forgotten(fresh, node), "the node's notification")
    status, doc = await call("GET", f"{api}/v1/nodes/{node}")
    assert (status, doc["allocation_uuid"]) == (200, allocation)


async def test_a_lost_listener_knows_nothing_until_it_is_back(stack: Any, api: str, fresh: FreshNodes) -> None:
    node = await new_node(api)
    await known_after_two_gets(api, fresh, node)
    old_pid = fresh.listener.server_pid
    assert old_pid is not None
    await stack.pool.execute("SELECT pg_terminate_backend($1)", old_pid)
    await eventually(
        lambda: _true(fresh.listener.listening and fresh.listener.server_pid not in (None, old_pid)),
        "the listener to come back",
    )
    assert len(fresh) == 0  # what could have changed unheard is forgotten
    assert await fresh.known(node) is None
    before = await known_after_two_gets(api, fresh, node)  # remembered again
    await unheard_write(stack, "UPDATE nodes SET extra = '{\"after\": 1}' WHERE uuid = $1::uuid", node)
    status, doc = await call("GET", f"{api}/v1/nodes/{node}")
    assert (status, doc) == (200, before)


async def _true(value: bool) -> bool:
    return value


async def test_a_notification_waiting_unread_is_seen(database_url: str) -> None:
    """``unheard`` sees bytes on the socket that the loop has not read yet: a GET then reads the row."""
    heard: list[str | None] = []
    listener = ChannelListener(lambda: asyncpg.connect(database_url), NODE_CHANGES_CHANNEL, heard.append, name="t")
    await listener.start()

    async def notify() -> None:
        sender = await asyncpg.connect(database_url)
        try:
            await sender.execute(f"NOTIFY {NODE_CHANGES_CHANNEL}, 'abc'")
        finally:
            await sender.close()

    # Sent from another thread while this loop is blocked, so the loop cannot read it meanwhile.
    sent = threading.Thread(target=lambda: asyncio.run(notify()))
    try:
        assert not listener.unheard()
        sent.start()
        sent.join(timeout=10)
        assert not sent.is_alive()
        deadline = time.monotonic() + 10  # still blocked: the notification arrives on the socket, unread
        while not listener.unheard() and time.monotonic() < deadline:
            time.sleep(0.005)
        assert listener.unheard()
        assert heard == []
        await eventually(lambda: _true(heard == ["abc"]), "the notification to be handed over")
        assert not listener.unheard()
    finally:
        await listener.stop()
    assert heard[-1] is None  # stopping forgets everything
    assert listener.unheard()  # and nothing is certain any more


async def test_only_writes_forget(database_url: str) -> None:
    """The middleware: a GET keeps what is known, any other method forgets it, refused or not."""
    fresh = FreshNodes(lambda: asyncpg.connect(database_url), size=10)
    await fresh.start()
    app = aiohttp.web.Application(middlewares=[forgetting_middleware(fresh)])

    async def ok(_: aiohttp.web.Request) -> aiohttp.web.Response:
        return aiohttp.web.Response(text="ok")

    async def refused(_: aiohttp.web.Request) -> aiohttp.web.Response:
        raise aiohttp.web.HTTPBadRequest()

    app.router.add_get("/x", ok)
    app.router.add_post("/x", ok)
    app.router.add_delete("/x", refused)
    runner = aiohttp.web.AppRunner(app)
    await runner.setup()
    site = aiohttp.web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    node = {"uuid": str(uuid.uuid4()), "driver": "fake-hardware", "conductor_group": ""}
    try:
        async with aiohttp.ClientSession() as s:
            for method, status, kept in (("GET", 200, True), ("POST", 200, False), ("DELETE", 400, False)):
                fresh.note(node, 7, None, fresh.generation)
                async with s.request(method, f"http://127.0.0.1:{port}/x") as r:
                    assert r.status == status
                assert (await fresh.known(node["uuid"]) is not None) is kept, method
        stale = fresh.generation
        fresh.forget(str(uuid.uuid4()))  # a change of another node, heard during a read
        fresh.note(node, 8, None, stale)
        assert await fresh.known(node["uuid"]) is None  # a read that spans a change is not kept
    finally:
        await runner.cleanup()
        await fresh.stop()
