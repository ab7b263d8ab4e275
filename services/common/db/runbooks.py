"""Runbook records and their traits (REST 1.92, traits 1.112). The only place
with SQL for the ``runbooks`` and ``runbook_traits`` tables; keyset pagination
on (sort_key, id). Rows carry ``traits``, the runbook's trait names sorted."""

from __future__ import annotations

import builtins
from collections.abc import Mapping, Sequence
from typing import Any, cast

import asyncpg

from services.common import errors
from services.common.db.handles import Database
from services.common.db.keyset import keyset_page
from services.common.db.nodes import is_uuid
from services.common.db.records import RunbookRecord
from services.common.db.rows import row_to_dict

SORT_KEYS = frozenset(("id", "uuid", "name", "created_at", "updated_at", "owner", "public", "description"))
WRITABLE = frozenset(("uuid", "name", "description", "steps", "disable_ramdisk", "extra", "public", "owner"))
JSON_COLUMNS = frozenset(("steps", "extra"))
_SELECT = (
    "SELECT r.*, coalesce((SELECT array_agg(t.trait ORDER BY t.trait) FROM runbook_traits t "
    "WHERE t.runbook_id = r.id), '{}') AS traits FROM runbooks r"
)


def _row(record: asyncpg.Record) -> RunbookRecord:
    row = cast(RunbookRecord, row_to_dict(record))
    row["traits"] = list(row["traits"] or [])
    return row


def _duplicate(exc: asyncpg.UniqueViolationError, values: Mapping[str, Any]) -> errors.Conflict:
    if "name" in (exc.constraint_name or ""):
        return errors.Conflict(f"A runbook with name {values.get('name')} already exists.")
    return errors.Conflict(f"A runbook with UUID {values.get('uuid')} already exists.")


def _not_found(ident: str) -> errors.NotFound:
    return errors.NotFound(f"Runbook {ident} could not be found.")


class RunbookRepository:
    def __init__(self, db: Database) -> None:
        self._db = db

    async def create(self, values: Mapping[str, Any]) -> RunbookRecord:
        unknown = set(values) - WRITABLE
        if unknown:
            raise errors.InvalidParameterValue(f"unknown runbook fields: {', '.join(sorted(unknown))}")
        columns = list(values)
        marks = ", ".join(
            f"${i}" + ("::jsonb" if c in JSON_COLUMNS else "::uuid" if c == "uuid" else "")
            for i, c in enumerate(columns, start=1)
        )
        try:
            row = await self._db.fetchrow(
                f"WITH r AS (INSERT INTO runbooks ({', '.join(columns)}) VALUES ({marks}) RETURNING *) "
                "SELECT r.*, '{}'::text[] AS traits FROM r",
                *[values[c] for c in columns],
            )
        except asyncpg.UniqueViolationError as exc:
            raise _duplicate(exc, values) from None
        assert row is not None  # INSERT ... RETURNING always returns its row
        return _row(row)

    async def get(self, ident: str) -> RunbookRecord:
        """By UUID or name."""
        if is_uuid(ident):
            row = await self._db.fetchrow(_SELECT + " WHERE r.uuid = $1::uuid", ident)
        else:
            row = await self._db.fetchrow(_SELECT + " WHERE r.name = $1", ident)
        if row is None:
            raise _not_found(ident)
        return _row(row)

    async def list(
        self,
        *,
        limit: int,
        marker: str | None = None,
        sort_key: str = "id",
        sort_dir: str = "asc",
        visible_to: str | None = None,
    ) -> builtins.list[RunbookRecord]:
        """One page; ``visible_to`` (a project) keeps the runbooks it owns and the public ones."""
        if sort_key not in SORT_KEYS:  # checked here for Ironic's wording (the key unquoted)
            raise errors.InvalidParameterValue(f"The sort_key value {sort_key} is an invalid field for sorting")
        return await keyset_page(
            self._db,
            _SELECT,
            table="runbooks",
            alias="r",
            record=_row,
            limit=limit,
            marker=marker,
            sort_key=sort_key,
            sort_dir=sort_dir,
            sort_keys=SORT_KEYS,
            where=["(r.public OR r.owner = $1)"] if visible_to is not None else [],
            args=[visible_to] if visible_to is not None else [],
        )

    async def update(self, runbook_uuid: str, changes: Mapping[str, Any]) -> RunbookRecord:
        unknown = set(changes) - WRITABLE
        if unknown:
            raise errors.InvalidParameterValue(f"unknown runbook fields: {', '.join(sorted(unknown))}")
        columns = list(changes)
        sets = [
            f"{c} = ${i}" + ("::jsonb" if c in JSON_COLUMNS else "::uuid" if c == "uuid" else "")
            for i, c in enumerate(columns, start=2)
        ] + ["updated_at = now()"]
        try:
            row = await self._db.fetchrow(
                f"UPDATE runbooks SET {', '.join(sets)} WHERE uuid = $1::uuid RETURNING uuid",
                runbook_uuid,
                *[changes[c] for c in columns],
            )
        except asyncpg.UniqueViolationError as exc:
            raise _duplicate(exc, changes) from None
        if row is None:
            raise _not_found(runbook_uuid)
        return await self.get(str(row["uuid"]))

    async def delete(self, runbook_uuid: str) -> None:
        result = await self._db.execute("DELETE FROM runbooks WHERE uuid = $1::uuid", runbook_uuid)
        if result.endswith(" 0"):
            raise _not_found(runbook_uuid)

    async def set_traits(self, runbook_id: int, traits: Sequence[str]) -> None:
        """Replace every trait of the runbook, in one statement."""
        await self._db.execute(
            "WITH gone AS (DELETE FROM runbook_traits WHERE runbook_id = $1 AND NOT (trait = ANY($2::text[]))), "
            "added AS (INSERT INTO runbook_traits (runbook_id, trait) SELECT $1, t FROM unnest($2::text[]) AS t "
            "ON CONFLICT DO NOTHING) UPDATE runbooks SET updated_at = now() WHERE id = $1",
            runbook_id,
            list(traits),
        )

    async def add_trait(self, runbook_id: int, trait: str) -> None:
        await self._db.execute(
            "INSERT INTO runbook_traits (runbook_id, trait) VALUES ($1, $2) ON CONFLICT DO NOTHING", runbook_id, trait
        )

    async def remove_trait(self, runbook_id: int, trait: str) -> bool:
        """True when the runbook had the trait."""
        result = await self._db.execute(
            "DELETE FROM runbook_traits WHERE runbook_id = $1 AND trait = $2", runbook_id, trait
        )
        return not result.endswith(" 0")
