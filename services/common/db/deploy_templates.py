"""Deploy template records (REST 1.55). The only place with SQL for the
``deploy_templates`` table; keyset pagination on (sort_key, id). Expects a
pool from ``services.common.db.pool`` (its codec maps jsonb to Python values)."""

from __future__ import annotations

import builtins
from collections.abc import Mapping
from typing import Any, cast

import asyncpg

from services.common import errors
from services.common.db.handles import Database
from services.common.db.keyset import keyset_page
from services.common.db.nodes import is_uuid
from services.common.db.records import DeployTemplateRecord
from services.common.db.rows import row_to_dict

SORT_KEYS = frozenset(("id", "uuid", "name", "created_at", "updated_at"))
WRITABLE = frozenset(("uuid", "name", "steps", "extra"))


def _row(record: asyncpg.Record) -> DeployTemplateRecord:
    return cast(DeployTemplateRecord, row_to_dict(record))  # the pool's codec turns jsonb into Python values


def _duplicate(exc: asyncpg.UniqueViolationError, values: Mapping[str, Any]) -> errors.Conflict:
    if "name" in (exc.constraint_name or ""):
        return errors.Conflict(f"A deploy template with name {values.get('name')} already exists.")
    return errors.Conflict(f"A deploy template with UUID {values.get('uuid')} already exists.")


class DeployTemplateRepository:
    def __init__(self, db: Database) -> None:
        self._db = db

    async def create(self, values: Mapping[str, Any]) -> DeployTemplateRecord:
        try:
            row = await self._db.fetchrow(
                "INSERT INTO deploy_templates (uuid, name, steps, extra) VALUES ($1::uuid, $2, $3::jsonb, $4::jsonb) "
                "RETURNING *",
                values["uuid"],
                values["name"],
                values.get("steps", []),
                values.get("extra", {}),
            )
        except asyncpg.UniqueViolationError as exc:
            raise _duplicate(exc, values) from None
        assert row is not None  # INSERT ... RETURNING always returns its row
        return _row(row)

    async def get(self, ident: str) -> DeployTemplateRecord:
        """By UUID or name."""
        if is_uuid(ident):
            row = await self._db.fetchrow("SELECT * FROM deploy_templates WHERE uuid = $1::uuid", ident)
        else:
            row = await self._db.fetchrow("SELECT * FROM deploy_templates WHERE name = $1", ident)
        if row is None:
            raise errors.NotFound(f"Deploy template {ident} could not be found.")
        return _row(row)

    async def list(
        self, *, limit: int, marker: str | None = None, sort_key: str = "id", sort_dir: str = "asc"
    ) -> builtins.list[DeployTemplateRecord]:
        return await keyset_page(
            self._db,
            "SELECT * FROM deploy_templates",
            table="deploy_templates",
            alias="deploy_templates",
            record=_row,
            limit=limit,
            marker=marker,
            sort_key=sort_key,
            sort_dir=sort_dir,
            sort_keys=SORT_KEYS,
        )

    async def update(self, template_uuid: str, changes: Mapping[str, Any]) -> DeployTemplateRecord:
        unknown = set(changes) - WRITABLE
        if unknown:
            raise errors.InvalidParameterValue(f"unknown deploy template fields: {', '.join(sorted(unknown))}")
        columns = list(changes)
        sets = [
            f"{c} = ${i}" + ("::jsonb" if c in ("steps", "extra") else "::uuid" if c == "uuid" else "")
            for i, c in enumerate(columns, start=2)
        ] + ["updated_at = now()"]
        values = [changes[c] for c in columns]
        try:
            row = await self._db.fetchrow(
                f"UPDATE deploy_templates SET {', '.join(sets)} WHERE uuid = $1::uuid RETURNING *",
                template_uuid,
                *values,
            )
        except asyncpg.UniqueViolationError as exc:
            raise _duplicate(exc, changes) from None
        if row is None:
            raise errors.NotFound(f"Deploy template {template_uuid} could not be found.")
        return _row(row)

    async def delete(self, template_uuid: str) -> None:
        result = await self._db.execute("DELETE FROM deploy_templates WHERE uuid = $1::uuid", template_uuid)
        if result.endswith(" 0"):
            raise errors.NotFound(f"Deploy template {template_uuid} could not be found.")
