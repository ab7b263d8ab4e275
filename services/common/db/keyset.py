"""One keyset-paginated page, shared by the repositories of the REST collections.

Chassis, deploy templates, runbooks, allocations, inspection rules, port
groups and a group's ports page the same way: ordered on (sort_key, id) with
NULL sort values last in both directions, and the page after ``marker`` (a
UUID) starting right after that row. Only the SELECT, the filters and the row
type differ, so the repository passes those in and gets its own record type
back (``record`` converts each row, typically ``cast(XRecord, row_to_dict(r))``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import asyncpg

from services.common import errors
from services.common.db.handles import Database
from services.common.db.nodes import is_uuid

RecordT = TypeVar("RecordT")


def check_sort_dir(sort_dir: str) -> None:
    """Ironic's answer to a sort direction that is neither asc nor desc."""
    if sort_dir not in ("asc", "desc"):
        raise errors.InvalidParameterValue(f"Invalid sort direction: {sort_dir}. Acceptable values are 'asc' or 'desc'")


async def keyset_page(
    db: Database,
    select: str,
    *,
    table: str,
    alias: str,
    record: Callable[[asyncpg.Record], RecordT],
    limit: int,
    marker: str | None,
    sort_key: str,
    sort_dir: str,
    sort_keys: frozenset[str],
    where: Sequence[str] = (),
    args: Sequence[Any] = (),
) -> list[RecordT]:
    """The page of ``select`` (which reads ``table`` as ``alias``) after ``marker``.

    ``where`` holds the caller's filters, numbered ``$1``.. over ``args``;
    ``sort_key`` is checked against ``sort_keys`` before it reaches the SQL.
    """
    if sort_key not in sort_keys:
        raise errors.InvalidParameterValue(f"The sort_key value {sort_key!r} is an invalid field for sorting")
    check_sort_dir(sort_dir)
    conditions, values = list(where), list(args)
    op = ">" if sort_dir == "asc" else "<"
    if marker is not None:
        row = (
            await db.fetchrow(f"SELECT id, {sort_key} AS k FROM {table} WHERE uuid = $1::uuid", marker)
            if is_uuid(marker)
            else None
        )
        if row is None:
            raise errors.InvalidParameterValue(f"Marker {marker} could not be found.")
        if row["k"] is None:  # after a NULL only NULLs follow (NULLS LAST both ways)
            values.append(row["id"])
            conditions.append(f"({alias}.{sort_key} IS NULL AND {alias}.id {op} ${len(values)})")
        else:
            values += [row["k"], row["id"]]
            conditions.append(
                f"(({alias}.{sort_key}, {alias}.id) {op} (${len(values) - 1}, ${len(values)}) "
                f"OR {alias}.{sort_key} IS NULL)"
            )
    values.append(limit)
    clause = (" WHERE " + " AND ".join(conditions)) if conditions else ""
    rows = await db.fetch(
        f"{select}{clause} ORDER BY {alias}.{sort_key} {sort_dir} NULLS LAST, {alias}.id {sort_dir} "
        f"LIMIT ${len(values)}",
        *values,
    )
    return [record(r) for r in rows]
