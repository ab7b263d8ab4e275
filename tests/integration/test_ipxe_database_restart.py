"""The renderer across a real PostgreSQL restart (its own embedded server, so
the shared one is untouched): while the database is down every request gets an
error script, never a 500 or a stale cached script; once it is back the cache
listens again and follows changes made after the restart."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import aiohttp

from services.common.db import migrate
from services.common.db.embedded import EmbeddedPostgres
from services.common.db.pool import create_pool
from services.ipxe.service import IpxeService
from tests.conftest import test_settings

MAC = "52:54:00:cc:00:01"


async def kind_of(http: aiohttp.ClientSession, url: str) -> tuple[int, str, str]:
    async with http.get(url, params={"mac": MAC}) as r:
        return r.status, r.headers.get("X-Ferrum-Boot-Kind", ""), await r.text()


async def wait_until(predicate: Any, what: str, timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = await predicate()
        if result:
            return result
        await asyncio.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


async def test_renderer_survives_a_database_restart(tmp_path: Path) -> None:
    pg = EmbeddedPostgres(tmp_path / "pg", fsync=False)
    await asyncio.to_thread(pg.start)
    service: IpxeService | None = None
    pool = None
    try:
        await asyncio.to_thread(pg.create_database, "ferrum")
        url = pg.database_url("ferrum")
        await migrate.upgrade(url)
        pool = await create_pool(url, min_size=1, max_size=4)
        await pool.execute(
            "INSERT INTO nodes (uuid, name, driver, boot_interface, driver_info, provision_state) VALUES "
            "(gen_random_uuid(), 'restart-me', 'fake-hardware', 'ipxe', "
            '\'{"deploy_kernel": "http://192.0.2.9/k", "deploy_ramdisk": "http://192.0.2.9/r"}\', \'deploying\')'
        )
        await pool.execute(
            "INSERT INTO ports (uuid, node_id, address) SELECT gen_random_uuid(), id, $1 FROM nodes", MAC
        )
        settings = test_settings(
            url, tmp_path / "state", ipxe={"api_url": "http://api.example:6385", "cache_ttl": 300.0}
        )
        service = IpxeService(settings, pool)
        endpoints = await service.start()
        cache = service.cache
        assert cache is not None and cache.listening
        script_url = endpoints["ipxe HTTP"].rsplit("/", 1)[0] + "/ipxe"
        async with aiohttp.ClientSession() as http:
            assert (await kind_of(http, script_url))[:2] == (200, "deploy")  # now cached

            await asyncio.to_thread(pg.stop)
            await wait_until(lambda: _false_to_true(not cache.listening), "the cache to notice the outage")
            status, kind, body = await kind_of(http, script_url)
            assert (status, kind) == (200, "error") and "database error" in body  # nothing stale, no 500

            await asyncio.to_thread(pg.start)  # same data dir, same port
            await wait_until(lambda: _false_to_true(cache.listening), "the cache to listen again")
            # The pool's first queries may still meet connections that died with the server.
            await wait_until(lambda: _kind_is(http, script_url, "deploy"), "the script to be served (and cached)")
            assert ("mac", MAC) in cache._entries
            await pool.execute("UPDATE nodes SET provision_state = 'active' WHERE name = 'restart-me'")
            # Only a notification on the new LISTEN connection can replace the cached deploy script.
            await wait_until(lambda: _kind_is(http, script_url, "local_disk"), "the new state to be served")
            assert (await kind_of(http, script_url))[:2] == (200, "local_disk")
            assert ("mac", MAC) in cache._entries  # cached again
    finally:
        if service is not None:
            await service.stop()
        if pool is not None:
            await pool.close()
        await asyncio.to_thread(pg.stop)


async def _false_to_true(value: bool) -> bool:
    return value


async def _kind_is(http: aiohttp.ClientSession, url: str, kind: str) -> bool:
    return (await kind_of(http, url))[1] == kind
