import subprocess
import sys
from pathlib import Path

import asyncpg

from services.common.db import migrate

ROOT = Path(__file__).resolve().parents[2]


async def test_three_concurrent_upgrades_then_idempotent(empty_database_url: str) -> None:
    processes = [
        subprocess.Popen(
            [sys.executable, "-m", "services.cli", "db", "upgrade", "--database-url", empty_database_url],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(3)
    ]
    outputs = [p.communicate(timeout=60) for p in processes]
    assert [p.returncode for p in processes] == [0, 0, 0], outputs
    applied = [out for out, _ in outputs if "applied" in out]
    assert len(applied) == 1, outputs  # exactly one process did the work
    latest = migrate.load_migrations()[-1].version
    assert await migrate.current_version(empty_database_url) == latest
    assert await migrate.upgrade(empty_database_url) == []  # second run is a no-op
    conn = await asyncpg.connect(empty_database_url)
    try:
        assert await conn.fetchval("SELECT count(*) FROM schema_migrations") == len(migrate.load_migrations())
        tables = {r["tablename"] for r in await conn.fetch("SELECT tablename FROM pg_tables WHERE schemaname='public'")}
        assert {
            "nodes",
            "ports",
            "volume_connectors",
            "volume_targets",
            "conductors",
            "node_history",
            "node_events",
            "objects",
        } <= tables
    finally:
        await conn.close()


async def test_constraints(database_url: str) -> None:
    conn = await asyncpg.connect(database_url)
    try:
        node_id = await conn.fetchval(
            "INSERT INTO nodes (uuid, name, driver, provision_state) VALUES (gen_random_uuid(), 'c1', 'fake-hardware', 'enroll') RETURNING id"
        )
        await conn.execute(
            "INSERT INTO ports (uuid, node_id, address) VALUES (gen_random_uuid(), $1, '52:54:00:aa:bb:cc')", node_id
        )
        for sql in (
            "INSERT INTO ports (uuid, node_id, address) VALUES (gen_random_uuid(), $1, '52:54:00:aa:bb:cc')",
            "INSERT INTO ports (uuid, node_id, address) VALUES (gen_random_uuid(), $1, 'NOT-A-MAC')",
            "INSERT INTO nodes (uuid, name, driver, provision_state) SELECT gen_random_uuid(), 'c1', 'x', 'enroll' WHERE $1 > 0",
            "INSERT INTO nodes (uuid, driver, provision_state, driver_info) SELECT gen_random_uuid(), 'x', 'enroll', '[]'::jsonb WHERE $1 > 0",
        ):
            try:
                await conn.execute(sql, node_id)
            except (asyncpg.UniqueViolationError, asyncpg.CheckViolationError):
                continue
            raise AssertionError(f"constraint not enforced: {sql}")
        await conn.execute(
            "INSERT INTO volume_targets (uuid, node_id, volume_type, boot_index, volume_id) VALUES (gen_random_uuid(), $1, 'iscsi', 0, 'v1')",
            node_id,
        )
        try:
            await conn.execute(
                "INSERT INTO volume_targets (uuid, node_id, volume_type, boot_index, volume_id) VALUES (gen_random_uuid(), $1, 'iscsi', 0, 'v2')",
                node_id,
            )
            raise AssertionError("duplicate boot_index accepted")
        except asyncpg.UniqueViolationError:
            pass
        await conn.execute(
            "INSERT INTO volume_connectors (uuid, node_id, type, connector_id) VALUES (gen_random_uuid(), $1, 'iqn', 'iqn.x')",
            node_id,
        )
        try:
            await conn.execute(
                "INSERT INTO volume_connectors (uuid, node_id, type, connector_id) VALUES (gen_random_uuid(), $1, 'iqn', 'iqn.x')",
                node_id,
            )
            raise AssertionError("duplicate connector accepted")
        except asyncpg.UniqueViolationError:
            pass
        await conn.execute("DELETE FROM nodes WHERE id = $1", node_id)  # ON DELETE CASCADE
        assert await conn.fetchval("SELECT count(*) FROM ports WHERE node_id = $1", node_id) == 0
        assert await conn.fetchval("SELECT count(*) FROM volume_targets WHERE node_id = $1", node_id) == 0
    finally:
        await conn.close()
