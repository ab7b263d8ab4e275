"""Chassis records (REST 1.1). The only place with SQL for the ``chassis``
table; keyset pagination on (sort_key, id). A node refers to its chassis by
UUID (``nodes.chassis_uuid``); the foreign key keeps a chassis with nodes
from being deleted and carries a changed chassis UUID over to its nodes."""

from __future__ import annotations

import builtins
from collections.abc import Mapping
from typing import Any, cast

import asyncpg

from services.common import errors
from services.common.db.handles import Database
from services.common.db.keyset import keyset_page
from services.common.db.nodes import is_uuid
from services.common.db.records import ChassisRecord
from services.common.db.rows import row_to_dict

SORT_KEYS = frozenset(("id", "uuid", "description", "created_at", "updated_at"))
WRITABLE = frozenset(("uuid", "description", "extra"))


def _record(row: asyncpg.Record) -> ChassisRecord:
    return cast(ChassisRecord, row_to_dict(row))


def _not_found(ident: str) -> errors.NotFound:
    return errors.NotFound(f"Chassis {ident} could not be found.")


class ChassisRepository:
    def __init__(self, db: Database) -> None:
        self._db = db

    async def create(self, values: Mapping[str, Any]) -> ChassisRecord:
        try:
            row = await self._db.fetchrow(
                "INSERT INTO chassis (uuid, description, extra) VALUES ($1::uuid, $2, $3::jsonb) RETURNING *",
                values["uuid"],
                values.get("description"),
                values.get("extra", {}),
            )
        except asyncpg.UniqueViolationError:
            raise errors.Conflict(f"A chassis with UUID {values['uuid']} already exists.") from None
        return cast(ChassisRecord, row_to_dict(row))

    async def get(self, ident: str) -> ChassisRecord:
        """By UUID only: chassis have no names."""
        row = await self._db.fetchrow("SELECT * FROM chassis WHERE uuid = $1::uuid", ident) if is_uuid(ident) else None
        if row is None:
            raise _not_found(ident)
        return cast(ChassisRecord, row_to_dict(row))

    async def list(
        self, *, limit: int, marker: str | None = None, sort_key: str = "id", sort_dir: str = "asc"
    ) -> builtins.list[ChassisRecord]:
        if sort_key not in SORT_KEYS:  # checked here for Ironic's wording (the key unquoted)
            raise errors.InvalidParameterValue(f"The sort_key value {sort_key} is an invalid field for sorting")
        return await keyset_page(
            self._db,
            "SELECT * FROM chassis",
            table="chassis",
            alias="chassis",
            record=_record,
            limit=limit,
            marker=marker,
            sort_key=sort_key,
            sort_dir=sort_dir,
            sort_keys=SORT_KEYS,
        )

    async def update(self, chassis_uuid: str, changes: Mapping[str, Any]) -> ChassisRecord:
        unknown = set(changes) - WRITABLE
        if unknown:
            raise errors.InvalidParameterValue(f"unknown chassis fields: {', '.join(sorted(unknown))}")
        columns = list(changes)
        sets = [
            f"{c} = ${i}" + ("::jsonb" if c == "extra" else "::uuid" if c == "uuid" else "")
            for i, c in enumerate(columns, start=2)
        ] + ["updated_at = now()"]
        try:
            row = await self._db.fetchrow(
                f"UPDATE chassis SET {', '.join(sets)} WHERE uuid = $1::uuid RETURNING *",
                chassis_uuid,
                *[changes[c] for c in columns],
            )
        except asyncpg.UniqueViolationError:
            raise errors.Conflict(f"A chassis with UUID {changes.get('uuid')} already exists.") from None
        if row is None:
            raise _not_found(chassis_uuid)
        return cast(ChassisRecord, row_to_dict(row))

    async def delete(self, chassis_uuid: str) -> None:
        try:
            deleted = await self._db.fetchval("DELETE FROM chassis WHERE uuid = $1::uuid RETURNING id", chassis_uuid)
        except (asyncpg.ForeignKeyViolationError, asyncpg.RestrictViolationError):
            raise errors.Invalid(
                f"Cannot complete the requested action because chassis {chassis_uuid} contains nodes."
            ) from None
        if deleted is None:
            raise _not_found(chassis_uuid)
