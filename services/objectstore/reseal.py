"""Re-encrypting stored objects under the current key (``ferrum db rotate-key``).

Each object that is sealed under another key, or plain although it should
be sealed (``sealed_objects``), is copied to a fresh backend key, sealed
under the current key as it goes, checked against the row's sha256, and
the row is pointed at the copy in one conditional UPDATE; then the old bytes
go. An upload or delete of the same object meanwhile wins (the UPDATE finds
another key and the copy is dropped), a crash leaves at worst an
unreferenced copy for the orphan sweep, and running it again finds only what
is left. It needs the object store's backend and database, not the running
service.
"""

from __future__ import annotations

import logging
import uuid

from services.common import errors
from services.common.db.objects import ObjectRepository
from services.common.db.records import ObjectRecord
from services.objectstore.backends import Backend
from services.objectstore.sealed_objects import READ_CHUNK, SEAL_METADATA_KEY, ObjectSealing

LOG = logging.getLogger(__name__)


async def reseal_object(repo: ObjectRepository, backend: Backend, sealing: ObjectSealing, row: ObjectRecord) -> bool:
    """Rewrite one object's bytes under the current key; False when the object
    changed or went away meanwhile (nothing to do then)."""
    new_key = uuid.uuid4().hex
    upload, key_id = sealing.begin(backend.begin_upload(new_key), container=row["container"], name=row["name"])
    size = int(row["size"])
    try:
        if row["sealed_key_id"] is not None:
            source = sealing.read(backend, row, offset=0, length=size)
        else:
            source = backend.read(row["backend_key"], offset=0, length=size, chunk_size=READ_CHUNK)
        async for chunk in source:
            await upload.write(chunk)
        written, digest = await upload.commit()
    except errors.ObjectNotFound:  # replaced or deleted since the row was read
        await upload.abort()
        return False
    except BaseException:
        await upload.abort()
        raise
    if (written, digest) != (size, row["sha256"]):
        await backend.delete(new_key)
        raise errors.FerrumError(
            f"object {row['container']}/{row['name']}: its stored bytes ({written} bytes, sha256 {digest}) are not "
            f"the {size} bytes with sha256 {row['sha256']} its row records; left as it was"
        )
    if not await repo.swap_bytes(int(row["id"]), old_key=row["backend_key"], new_key=new_key, sealed_key_id=key_id):
        await backend.delete(new_key)
        return False
    await backend.delete(row["backend_key"])
    LOG.info(
        "object re-encrypted container=%s name=%s key_id=%s was=%s",
        row["container"],
        row["name"],
        key_id,
        row["sealed_key_id"] or "plain",
    )
    return True


async def reseal_objects(
    repo: ObjectRepository, backend: Backend, sealing: ObjectSealing, *, batch_size: int = 100
) -> int:
    """Every object that needs it, in batches by id; returns how many were rewritten."""
    after, rewritten = 0, 0
    while True:
        rows = await repo.reseal_candidates(
            after_id=after,
            limit=batch_size,
            current_key_id=sealing.keyring.current_id,
            containers=sealing.containers,
            flag=SEAL_METADATA_KEY,
        )
        if not rows:
            return rewritten
        for row in rows:
            after = int(row["id"])
            if await reseal_object(repo, backend, sealing, row):
                rewritten += 1
