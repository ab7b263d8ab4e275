"""Each typed record lists exactly the columns its repository returns.

One real row of each, read from PostgreSQL through its repository: a column
added by a migration (or dropped) without its record in
``services/common/db/records.py`` following fails here. One test per record.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest

from services.common.db import records
from services.common.db.pool import create_pool


def keys(record: Any) -> set[str]:
    """Every key a TypedDict declares, required or not."""
    return set(record.__required_keys__ | record.__optional_keys__)


@pytest.fixture(scope="module")
async def pool(database_url: str) -> AsyncIterator[asyncpg.Pool]:
    pool = await create_pool(database_url, max_size=4)
    yield pool
    await pool.close()


async def test_node_record_matches_columns(pool: asyncpg.Pool) -> None:
    from services.common.db.bootdata import BootDataRepository
    from services.common.db.node_secrets import NodeSecrets
    from services.common.db.nodes import NodeRepository
    from services.common.keyring import Keyring

    nodes = NodeRepository(pool, secrets=NodeSecrets(Keyring()))
    created = await nodes.create(
        {"uuid": str(uuid.uuid4()), "driver": "fake-hardware", "provision_state": "enroll", "console_enabled": True}
    )
    assert set(created) == keys(records.NodeRecord)
    assert set(await nodes.get(created["uuid"])) == keys(records.NodeRecord)
    (listed,) = await nodes.list(filters={"driver": "fake-hardware"})
    assert set(listed) == keys(records.NodeRecord)
    (console,) = await nodes.list_console_enabled()
    assert set(console) == keys(records.ConsoleNodeRecord)
    boot = await BootDataRepository(pool).read(uuid=created["uuid"])
    assert boot is not None and set(boot.node) == keys(records.BootNodeRecord)
