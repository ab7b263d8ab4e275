"""Shared fixtures: one real PostgreSQL per test session (the same embedded
launcher `ferrum stack` uses), a migrated template, and a fresh database per
test module cloned from it."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import os
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from services.common.config import Settings, load_settings
from services.common.db import migrate
from services.common.db.embedded import EmbeddedPostgres

TEMPLATE = "ferrum_template"
_counter = itertools.count()


@pytest.fixture(scope="session")
def postgres() -> Iterator[EmbeddedPostgres]:
    with tempfile.TemporaryDirectory(prefix="ferrum-test-pg-") as tmp:
        os.chmod(tmp, 0o755)
        server = EmbeddedPostgres(Path(tmp), fsync=False)
        server.start()
        try:
            server.create_database(TEMPLATE)
            asyncio.run(migrate.upgrade(server.database_url(TEMPLATE)))
            yield server
        finally:
            server.stop()


@pytest.fixture(scope="module")
def database_url(postgres: EmbeddedPostgres) -> Iterator[str]:
    """A fresh, migrated database for one test module."""
    name = f"ferrum_t{os.getpid()}_{next(_counter)}"
    postgres.create_database(name, template=TEMPLATE)
    try:
        yield postgres.database_url(name)
    finally:
        postgres.drop_database(name)


@pytest.fixture(scope="module")
def empty_database_url(postgres: EmbeddedPostgres) -> Iterator[str]:
    """A database with no schema at all, for migration tests."""
    name = f"ferrum_e{os.getpid()}_{next(_counter)}"
    postgres.create_database(name)
    try:
        yield postgres.database_url(name)
    finally:
        postgres.drop_database(name)


def test_settings(database_url: str, state_dir: Path, **sections: dict[str, Any]) -> Settings:
    """Settings for an in-process stack on ephemeral ports."""
    base = load_settings(
        {},
        overrides={
            None: {"state_dir": str(state_dir)},
            "database": {"url": database_url, "pool_max": 20},
            "api": {"port": 0, "grpc_port": 0, "ring_refresh_interval": 0.5},
            "conductor": {"grpc_port": 0, "metrics_port": 0, "heartbeat_interval": 0.5, "heartbeat_timeout": 5.0},
            "ipxe": {"port": 0, "grpc_port": 0},
            "objectstore": {"grpc_port": 0, "http_port": 0},
        },
    )
    for name, values in sections.items():
        base = dataclasses.replace(base, **{name: dataclasses.replace(getattr(base, name), **values)})
    return base


@pytest.fixture(scope="module")
async def stack(database_url: str, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Any]:
    """api + conductor + ipxe + objectstore in this process on ephemeral ports."""
    from services.runtime import ALL_SERVICES_ORDER, RunningStack

    settings = test_settings(
        database_url,
        tmp_path_factory.mktemp("state"),
        conductor={"hostname": "test-conductor", "fake_deploy_delay": "0"},
    )
    running = RunningStack()
    await running.start(settings, list(ALL_SERVICES_ORDER))
    try:
        yield running
    finally:
        await running.close()


test_settings.__test__ = False  # type: ignore[attr-defined]  # pytest reads this: a helper, not a test
