"""Inspection rule records (migration 0013, Ironic API 1.96). The only place
with SQL for the ``inspection_rules`` table; keyset pagination on
(sort_key, id). Documents are validated before they get here
(``services.common.inspection_rules.validation``); the table's checks are
the last line, not the error messages."""

from __future__ import annotations

import builtins
from collections.abc import Mapping
from typing import Any, cast

import asyncpg

from services.common import errors
from services.common.db.handles import Database
from services.common.db.keyset import keyset_page
from services.common.db.records import InspectionRuleRecord
from services.common.db.rows import row_to_dict

SORT_KEYS = frozenset(("id", "uuid", "priority", "phase", "description", "sensitive", "created_at", "updated_at"))
WRITABLE = frozenset(("uuid", "description", "priority", "sensitive", "phase", "conditions", "actions"))
_CASTS = {"uuid": "::uuid", "conditions": "::jsonb", "actions": "::jsonb"}


def _row(record: asyncpg.Record | None) -> InspectionRuleRecord:
    """A returned row; callers pass None only where a row always comes back (INSERT ... RETURNING)."""
    row = cast(InspectionRuleRecord, row_to_dict(record))
    if row is None:
        raise errors.NotFound("The inspection rule could not be found.")
    return row


def _not_found(rule_uuid: str) -> errors.NotFound:
    return errors.NotFound(f"Rule {rule_uuid} could not be found.")


class InspectionRuleRepository:
    def __init__(self, db: Database) -> None:
        self._db = db

    async def create(self, values: Mapping[str, Any]) -> InspectionRuleRecord:
        try:
            row = await self._db.fetchrow(
                "INSERT INTO inspection_rules (uuid, description, priority, sensitive, phase, conditions, actions) "
                "VALUES ($1::uuid, $2, $3, $4, $5, $6::jsonb, $7::jsonb) RETURNING *",
                values["uuid"],
                values.get("description"),
                values.get("priority") or 0,
                bool(values.get("sensitive")),
                values.get("phase") or "main",
                values.get("conditions") or [],
                values["actions"],
            )
        except asyncpg.UniqueViolationError:
            raise errors.Conflict(f"A rule with UUID {values['uuid']} already exists.") from None
        return _row(row)

    async def get(self, rule_uuid: str) -> InspectionRuleRecord:
        row = await self._db.fetchrow("SELECT * FROM inspection_rules WHERE uuid = $1::uuid", rule_uuid)
        if row is None:
            raise _not_found(rule_uuid)
        return _row(row)

    async def for_phase(self, phase: str) -> builtins.list[InspectionRuleRecord]:
        """The rules an inspection runs in ``phase``, highest priority first (ties: oldest first)."""
        rows = await self._db.fetch("SELECT * FROM inspection_rules WHERE phase = $1 ORDER BY priority DESC, id", phase)
        return [_row(r) for r in rows]

    async def list(
        self,
        *,
        limit: int,
        marker: str | None = None,
        sort_key: str = "id",
        sort_dir: str = "asc",
        phase: str | None = None,
    ) -> builtins.list[InspectionRuleRecord]:
        return await keyset_page(
            self._db,
            "SELECT * FROM inspection_rules",
            table="inspection_rules",
            alias="inspection_rules",
            record=_row,
            limit=limit,
            marker=marker,
            sort_key=sort_key,
            sort_dir=sort_dir,
            sort_keys=SORT_KEYS,
            where=["phase = $1"] if phase is not None else [],
            args=[phase] if phase is not None else [],
        )

    async def update(self, rule_uuid: str, changes: Mapping[str, Any]) -> InspectionRuleRecord:
        unknown = set(changes) - WRITABLE
        if unknown:
            raise errors.InvalidParameterValue(f"unknown inspection rule fields: {', '.join(sorted(unknown))}")
        columns = builtins.list(changes)
        sets = [f"{c} = ${i}{_CASTS.get(c, '')}" for i, c in enumerate(columns, start=2)] + ["updated_at = now()"]
        try:
            row = await self._db.fetchrow(
                f"UPDATE inspection_rules SET {', '.join(sets)} WHERE uuid = $1::uuid RETURNING *",
                rule_uuid,
                *[changes[c] for c in columns],
            )
        except asyncpg.UniqueViolationError:
            raise errors.Conflict(f"A rule with UUID {changes.get('uuid')} already exists.") from None
        if row is None:
            raise _not_found(rule_uuid)
        return _row(row)

    async def delete(self, rule_uuid: str) -> None:
        result = await self._db.execute("DELETE FROM inspection_rules WHERE uuid = $1::uuid", rule_uuid)
        if result.endswith(" 0"):
            raise _not_found(rule_uuid)
