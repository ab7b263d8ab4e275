"""Object store metadata queries.

Rows in ``objects`` describe blobs whose bytes live in a backend (a directory
or an S3 bucket) under ``backend_key``. An object whose ``delete_at`` has
passed is dead: every read here filters it out, and the sweeper removes the
row and then the bytes. Counters and metadata change only through single SQL
statements or row-locked transactions, so concurrent users never lose an
update.
"""

from __future__ import annotations

import builtins
import datetime
from collections.abc import Mapping, Sequence
from typing import Any, cast

import asyncpg

from services.common import errors
from services.common.db.records import ObjectRecord
from services.common.db.rows import row_to_dict

_LIVE = "(delete_at IS NULL OR delete_at > now())"
_COLUMNS = (
    "id, container, name, size, sha256, content_type, backend_key, delete_at, usage_count, "
    "metadata, created_at, updated_at, sealed_key_id"
)


class ObjectRepository:
    def __init__(self, db: asyncpg.Pool) -> None:
        self._db = db

    async def get(self, container: str, name: str) -> ObjectRecord | None:
        """The live object, or None when it is unknown or expired."""
        return cast(
            ObjectRecord | None,
            row_to_dict(
                await self._db.fetchrow(
                    f"SELECT {_COLUMNS} FROM objects WHERE container = $1 AND name = $2 AND {_LIVE}", container, name
                )
            ),
        )

    async def get_by_id(self, object_id: int) -> ObjectRecord | None:
        return cast(
            ObjectRecord | None,
            row_to_dict(
                await self._db.fetchrow(f"SELECT {_COLUMNS} FROM objects WHERE id = $1 AND {_LIVE}", object_id)
            ),
        )

    async def container_exists(self, container: str) -> bool:
        return bool(
            await self._db.fetchval(
                f"SELECT EXISTS (SELECT 1 FROM objects WHERE container = $1 AND {_LIVE})", container
            )
        )

    async def list(self, container: str, prefix: str = "", *, limit: int = 10000) -> builtins.list[ObjectRecord]:
        rows = await self._db.fetch(
            f"SELECT {_COLUMNS} FROM objects WHERE container = $1 AND starts_with(name, $2) AND {_LIVE} "
            "ORDER BY name LIMIT $3",
            container,
            prefix,
            limit,
        )
        return [cast(ObjectRecord, row_to_dict(r)) for r in rows]

    async def container_usage(self, container: str, *, excluding: str = "") -> int:
        """Bytes held by the live objects of a container, not counting ``excluding``
        (the object an upload is about to replace)."""
        return int(
            await self._db.fetchval(
                f"SELECT coalesce(sum(size), 0) FROM objects WHERE container = $1 AND name <> $2 AND {_LIVE}",
                container,
                excluding,
            )
        )

    async def upsert(
        self,
        values: Mapping[str, Any],
        *,
        delete_after: int,
        max_container_size: int,
    ) -> tuple[ObjectRecord, str | None]:
        """Insert or replace an object; returns the row and the replaced backend key.

        A per-container advisory lock serialises the quota check with the
        write, so two concurrent uploads cannot both squeeze under the limit.
        """
        async with self._db.acquire() as conn, conn.transaction():
            container, name = values["container"], values["name"]
            await conn.execute("SELECT pg_advisory_xact_lock(hashtext('objects:' || $1))", container)
            # One statement after the lock (its snapshot is taken once the lock is held, so it sees
            # every upload committed before): the container's other bytes, the key being replaced, and
            # the write, which happens only when the quota allows it. ``old`` reads the row as the
            # statement's snapshot has it, before the write, so it is not locked: a lock taken in the
            # same statement as the update would skip the row the update touched first. Uploads to
            # the container wait on the advisory lock; a delete racing this one at worst makes the
            # replaced bytes be removed twice, which is harmless.
            found = await conn.fetchrow(
                "WITH used AS ("
                f" SELECT coalesce(sum(size), 0) AS bytes FROM objects WHERE container = $1 AND name <> $2 AND {_LIVE}"
                "), old AS ("
                " SELECT backend_key FROM objects WHERE container = $1 AND name = $2"
                "), written AS ("
                " INSERT INTO objects (container, name, size, sha256, content_type, backend_key, delete_at, "
                "  usage_count, metadata, sealed_key_id) "
                " SELECT $1, $2, $3::bigint, $4, $5, $6, "
                "  CASE WHEN $7::bigint > 0 THEN now() + $7::bigint * interval '1 second' END, $8, $9::jsonb, $10 "
                " WHERE (SELECT bytes FROM used) + $3::bigint <= $11::bigint "
                " ON CONFLICT (container, name) DO UPDATE SET size = EXCLUDED.size, sha256 = EXCLUDED.sha256, "
                "  content_type = EXCLUDED.content_type, backend_key = EXCLUDED.backend_key, "
                "  delete_at = EXCLUDED.delete_at, usage_count = EXCLUDED.usage_count, "
                "  metadata = EXCLUDED.metadata, sealed_key_id = EXCLUDED.sealed_key_id, "
                "  created_at = now(), updated_at = NULL "
                f" RETURNING {_COLUMNS}"
                ") "
                "SELECT (SELECT bytes FROM used) AS used_bytes, (SELECT backend_key FROM old) AS replaced_key, "
                " written.* FROM (SELECT 1) AS one LEFT JOIN written ON true",
                container,
                name,
                values["size"],
                values["sha256"],
                values["content_type"],
                values["backend_key"],
                delete_after,
                values["usage_count"],
                dict(values["metadata"]),
                values.get("sealed_key_id"),
                max_container_size,
            )
            written = row_to_dict(found) or {}  # the statement always returns its one row
            used, old = int(written.pop("used_bytes")), written.pop("replaced_key")
            if written["id"] is None:  # the quota refused the write
                raise errors.PayloadTooLarge(
                    f"container {container!r} would hold {used + values['size']} bytes, "
                    f"over its limit of {max_container_size}"
                )
        return cast(ObjectRecord, written), old

    async def delete(self, container: str, name: str) -> tuple[str | None, bool]:
        """Remove a row; returns (its backend key or None, whether it was live)."""
        row = await self._db.fetchrow(
            f"DELETE FROM objects WHERE container = $1 AND name = $2 RETURNING backend_key, {_LIVE} AS live",
            container,
            name,
        )
        if row is None:
            return None, False
        return row["backend_key"], bool(row["live"])

    async def update_metadata(
        self,
        container: str,
        name: str,
        *,
        usage_delta: int = 0,
        expected_usage: int | None = None,
        set_metadata: Mapping[str, str] | None = None,
        remove_keys: Sequence[str] = (),
    ) -> ObjectRecord:
        """Add to usage_count and merge metadata in one statement.

        With ``expected_usage`` the change applies only when the counter still
        has that value (compare-and-set); a lost race raises InvalidState and
        changes nothing.
        """
        try:
            row = await self._db.fetchrow(
                "UPDATE objects SET usage_count = usage_count + $3, "
                " metadata = (metadata || $4::jsonb) - $5::text[], updated_at = now() "
                f"WHERE container = $1 AND name = $2 AND {_LIVE} "
                " AND ($6::bigint IS NULL OR usage_count = $6::bigint) "
                f"RETURNING {_COLUMNS}",
                container,
                name,
                usage_delta,
                dict(set_metadata or {}),
                list(remove_keys),
                expected_usage,
            )
        except asyncpg.CheckViolationError:
            raise errors.InvalidParameterValue(f"usage_count of {container}/{name} cannot go below zero") from None
        if row is not None:
            return cast(ObjectRecord, row_to_dict(row))
        current = await self.get(container, name)
        if current is None:
            raise errors.ObjectNotFound(f"object {container}/{name} not found")
        raise errors.InvalidState(
            f"usage_count of {container}/{name} is {current['usage_count']}, not the expected {expected_usage}"
        )

    async def release(self, container: str, name: str) -> tuple[int, bool, str | None]:
        """Decrement usage_count; at zero delete the row.

        Returns (new count, deleted, backend key to remove when deleted). The
        row lock makes concurrent releases count down one by one, so exactly
        one caller sees ``deleted``.
        """
        async with self._db.acquire() as conn, conn.transaction():
            row = await conn.fetchrow(
                f"SELECT id, usage_count, backend_key FROM objects WHERE container = $1 AND name = $2 AND {_LIVE} "
                "FOR UPDATE",
                container,
                name,
            )
            if row is None:
                raise errors.ObjectNotFound(f"object {container}/{name} not found")
            count = max(int(row["usage_count"]) - 1, 0)
            if count == 0:
                await conn.execute("DELETE FROM objects WHERE id = $1", row["id"])
                return 0, True, row["backend_key"]
            await conn.execute(
                "UPDATE objects SET usage_count = $2, updated_at = now() WHERE id = $1", row["id"], count
            )
            return count, False, None

    async def delete_expired(self, *, limit: int = 500) -> builtins.list[str]:
        """Remove up to ``limit`` expired rows; returns their backend keys.

        SKIP LOCKED lets several object store replicas sweep at once without
        waiting on each other.
        """
        rows = await self._db.fetch(
            "DELETE FROM objects WHERE id IN (SELECT id FROM objects WHERE delete_at <= now() "
            " ORDER BY delete_at LIMIT $1 FOR UPDATE SKIP LOCKED) RETURNING backend_key",
            limit,
        )
        return [r["backend_key"] for r in rows]

    async def referenced_keys(self, keys: Sequence[str]) -> set[str]:
        """Which of these backend keys still belong to a row (live or not)."""
        rows = await self._db.fetch("SELECT backend_key FROM objects WHERE backend_key = ANY($1::text[])", list(keys))
        return {r["backend_key"] for r in rows}

    async def reseal_candidates(
        self, *, after_id: int, limit: int, current_key_id: str, containers: Sequence[str], flag: str
    ) -> builtins.list[ObjectRecord]:
        """Live objects after ``after_id`` (by id) whose bytes are sealed under
        another key, or plain although they should be sealed (in one of
        ``containers`` or with metadata ``flag`` = "true"): what
        ``ferrum db rotate-key`` rewrites."""
        rows = await self._db.fetch(
            f"SELECT {_COLUMNS} FROM objects WHERE id > $1 AND {_LIVE} AND ("
            " (sealed_key_id IS NOT NULL AND sealed_key_id <> $3) OR (sealed_key_id IS NULL "
            "  AND (container = ANY($4::text[]) OR lower(metadata ->> $5) = 'true'))) "
            "ORDER BY id LIMIT $2",
            after_id,
            limit,
            current_key_id,
            list(containers),
            flag,
        )
        return [cast(ObjectRecord, row_to_dict(r)) for r in rows]

    async def swap_bytes(self, object_id: int, *, old_key: str, new_key: str, sealed_key_id: str | None) -> bool:
        """Point a row at re-encrypted bytes, only if it still points at
        ``old_key`` (an upload or delete meanwhile wins); True when it did.
        The content is the same, so nothing else changes (not even updated_at)."""
        result = await self._db.execute(
            "UPDATE objects SET backend_key = $3, sealed_key_id = $4 WHERE id = $1 AND backend_key = $2",
            object_id,
            old_key,
            new_key,
            sealed_key_id,
        )
        return not result.endswith(" 0")

    async def now(self) -> datetime.datetime:
        """The database clock, which decides expiry everywhere."""
        return await self._db.fetchval("SELECT now()")  # type: ignore[no-any-return]
