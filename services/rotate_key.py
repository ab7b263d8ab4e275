"""``ferrum db rotate-key``: every stored secret re-encrypted under the current key.

It rewrites node secrets (``NodeRepository.reseal_batch``) and sealed
objects (``services/objectstore/reseal.py``) that are in the clear or under
any key but the first of the keyring. So it both rotates (after a new key
was put first in the key file and the services restarted) and encrypts a
deployment that had no key until now. Batches commit as they go, and what
is already under the current key is skipped, so an interrupted run is
simply run again. When it reports nothing left, older keys can leave the
key file.

It works on the database and the object store's backend directly (the same
configuration the services use), so the services may keep running when the
database is external; the embedded PostgreSQL can only be opened while no
``ferrum stack`` uses it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import asyncpg

from services.common.config import ConfigError, Settings
from services.common.db.bootstrap import open_database
from services.common.db.node_secrets import NodeSecrets
from services.common.db.nodes import NodeRepository
from services.common.db.objects import ObjectRepository
from services.common.db.pool import create_pool
from services.objectstore.backends import make_backend
from services.objectstore.reseal import reseal_objects
from services.objectstore.sealed_objects import SEAL_METADATA_KEY, ObjectSealing


@dataclasses.dataclass(frozen=True)
class RotationReport:
    key_id: str
    nodes_rewritten: int
    objects_rewritten: int


async def rotate(
    pool: asyncpg.Pool, settings: Settings, *, batch_size: int = 100, progress: Callable[[str], None] = lambda _: None
) -> RotationReport:
    """Re-encrypt everything stored under the keyring of ``settings``; see the module docstring."""
    sealing = ObjectSealing.from_settings(settings)
    keyring = sealing.keyring
    if not keyring.enabled:
        raise ConfigError(
            "ferrum db rotate-key needs a key: set FERRUM_SECURITY_SECRET_KEY or FERRUM_SECURITY_SECRET_KEY_FILE"
        )
    nodes = NodeRepository(pool, secrets=NodeSecrets(keyring))
    after: int | None = 0
    node_count = 0
    while after is not None:
        after, rewritten = await nodes.reseal_batch(after_id=after, limit=batch_size)
        node_count += rewritten
        if rewritten:
            progress(f"nodes: {node_count} rewritten so far (up to id {after})")
    objects = ObjectRepository(pool)
    object_count = 0
    pending = await objects.reseal_candidates(
        after_id=0, limit=1, current_key_id=keyring.current_id, containers=sealing.containers, flag=SEAL_METADATA_KEY
    )
    if pending:  # the backend is opened only when there is work for it (S3 would create its bucket)
        backend = make_backend(settings.objectstore, settings.state_dir)
        await backend.start()
        try:
            object_count = await reseal_objects(objects, backend, sealing, batch_size=batch_size)
        finally:
            await backend.close()
        progress(f"objects: {object_count} rewritten")
    return RotationReport(keyring.current_id, node_count, object_count)


async def run(settings: Settings, *, batch_size: int = 100) -> int:
    """The command: open the database (migrating it, starting the embedded one if
    that is what is configured), rotate, print what was done."""
    database = await open_database(settings)
    try:
        pool = await create_pool(database.url, min_size=1, max_size=2)
        try:
            report = await rotate(pool, settings, batch_size=batch_size, progress=print)
        finally:
            await pool.close()
    finally:
        await database.close()
    print(
        f"every stored secret is now under key {report.key_id!r}: re-encrypted {report.nodes_rewritten} node(s) "
        f"and {report.objects_rewritten} object(s); older keys may leave the key file once every service has "
        "been restarted with this keyring"
    )
    return 0
