"""``keyset_page``, which every REST collection but nodes, ports and volumes pages
with: following markers visits each row once, in (sort_key, id) order with
NULL sort values last in both directions, whatever the page size."""

from __future__ import annotations

from collections.abc import AsyncIterator

import asyncpg
import pytest

from services.common import errors
from services.common.db.chassis import ChassisRepository
from services.common.db.pool import create_pool

DESCRIPTIONS = ("b", None, "a", "b", None, "c")


def chassis_uuid(n: int) -> str:
    return f"c4a55150-0000-4000-8000-{n:012d}"


@pytest.fixture(scope="module")
async def chassis(database_url: str) -> AsyncIterator[ChassisRepository]:
    pool: asyncpg.Pool = await create_pool(database_url, max_size=2)
    repo = ChassisRepository(pool)
    for n, description in enumerate(DESCRIPTIONS):
        await repo.create({"uuid": chassis_uuid(n), "description": description})
    try:
        yield repo
    finally:
        await pool.close()


async def walk(repo: ChassisRepository, *, limit: int, sort_dir: str) -> list[str]:
    seen: list[str] = []
    marker = None
    while True:
        page = await repo.list(limit=limit, marker=marker, sort_key="description", sort_dir=sort_dir)
        seen += [row["uuid"] for row in page]
        if len(page) < limit:
            return seen
        marker = page[-1]["uuid"]


@pytest.mark.parametrize("limit", [1, 2, 4, 10])
async def test_pages_follow_sort_key_then_id_with_nulls_last(chassis: ChassisRepository, limit: int) -> None:
    ids = range(len(DESCRIPTIONS))
    ascending = sorted((n for n in ids if DESCRIPTIONS[n] is not None), key=lambda n: (DESCRIPTIONS[n], n))
    descending = sorted((n for n in ids if DESCRIPTIONS[n] is not None), key=lambda n: (DESCRIPTIONS[n], n))[::-1]
    nulls = [n for n in ids if DESCRIPTIONS[n] is None]
    assert await walk(chassis, limit=limit, sort_dir="asc") == [chassis_uuid(n) for n in ascending + nulls]
    assert await walk(chassis, limit=limit, sort_dir="desc") == [chassis_uuid(n) for n in descending + nulls[::-1]]


async def test_bad_sort_and_marker_are_refused(chassis: ChassisRepository) -> None:
    with pytest.raises(errors.InvalidParameterValue, match=r"^The sort_key value extra is an invalid field"):
        await chassis.list(limit=1, sort_key="extra")
    with pytest.raises(errors.InvalidParameterValue, match=r"Invalid sort direction: up\. Acceptable values"):
        await chassis.list(limit=1, sort_dir="up")
    with pytest.raises(errors.InvalidParameterValue, match="Marker nope could not be found"):
        await chassis.list(limit=1, marker="nope")
