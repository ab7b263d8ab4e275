"""Restarts of the object store (filesystem backend): expired objects are
swept by the next process, and temp URLs stay valid because the generated
secret lives in PostgreSQL. A module of its own, so no other object store
shares its database and sweeps behind its back."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
import asyncpg

from services.common.objectstore_client import ObjectStoreClient
from services.objectstore.testing import running_objectstore, wait_until
from tests.conftest import test_settings


def files_under(path: Path) -> list[Path]:
    return [p for p in path.rglob("*") if p.is_file()]


async def test_ttl_sweep_after_restart(database_url: str, tmp_path: Path) -> None:
    root = tmp_path / "objects"
    settings = test_settings(
        database_url, tmp_path / "state", objectstore={"root": str(root), "sweep_interval": 3600.0}
    )
    async with running_objectstore(settings) as first:
        store = ObjectStoreClient(first.grpc_address, token=first.internal_token)
        await store.put_bytes("restart", "short-lived.img", b"y" * 1000, delete_after=1)
        await store.put_bytes("restart", "long-lived.img", b"z" * 10, delete_after=3600)
        await store.close()
    assert len(files_under(root / "data")) == 2
    await asyncio.sleep(1.5)
    conn = await asyncpg.connect(database_url)
    try:
        # Nothing ran in between: the expired row and its bytes are still there.
        assert await conn.fetchval("SELECT count(*) FROM objects WHERE container = 'restart'") == 2
        async with running_objectstore(settings):
            await wait_until(lambda: len(files_under(root / "data")) == 1)
            await wait_until(lambda: conn.fetchval("SELECT count(*) = 1 FROM objects WHERE container = 'restart'"))
        assert await conn.fetchval("SELECT name FROM objects WHERE container = 'restart'") == "long-lived.img"
    finally:
        await conn.close()


async def test_temp_urls_survive_restart(database_url: str, tmp_path: Path) -> None:
    settings = test_settings(database_url, tmp_path / "state", objectstore={"root": str(tmp_path / "o")})
    async with running_objectstore(settings) as first:
        store = ObjectStoreClient(first.grpc_address, token=first.internal_token)
        await store.put_bytes("survive", "a.img", b"persisted")
        url = await store.temp_url("survive", "a.img", lifetime=600)
        await store.close()
        old_base = first.public_url
    # A new process (new port: the signature covers the path, not the host).
    async with (
        running_objectstore(settings) as second,
        aiohttp.ClientSession() as http,
        http.get(url.replace(old_base, second.public_url)) as resp,
    ):
        assert resp.status == 200 and await resp.read() == b"persisted"
