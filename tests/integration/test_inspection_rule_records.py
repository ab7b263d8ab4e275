"""The inspection_rules table through its repository (migration 0013): what the
conductor runs and, with API 1.96, what the api will list, page, patch and delete."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest

from services.common import errors
from services.common.db.inspection_rules import InspectionRuleRepository
from services.common.db.pool import create_pool

ACTIONS = [{"op": "add-trait", "args": {"name": "CUSTOM_X"}}]


@pytest.fixture
async def rules(database_url: str) -> AsyncIterator[InspectionRuleRepository]:
    pool = await create_pool(database_url, max_size=4)
    await pool.execute("DELETE FROM inspection_rules")
    try:
        yield InspectionRuleRepository(pool)
    finally:
        await pool.close()


def uuid(n: int) -> str:
    return f"7c0ffee0-0000-4000-8000-{n:012d}"


async def test_rules_are_run_by_priority_and_listed_in_pages(rules: InspectionRuleRepository) -> None:
    for n, priority in enumerate((5, 90, 5, 40)):
        await rules.create({"uuid": uuid(n), "priority": priority, "actions": ACTIONS, "description": f"r{n}"})
    await rules.create({"uuid": uuid(9), "priority": 99, "actions": ACTIONS, "phase": "later"})
    assert [r["uuid"] for r in await rules.for_phase("main")] == [uuid(1), uuid(3), uuid(0), uuid(2)]
    first = await rules.list(limit=2, sort_key="priority", sort_dir="desc")
    rest = await rules.list(limit=5, marker=str(first[-1]["uuid"]), sort_key="priority", sort_dir="desc")
    # descending throughout: ties on priority by id, newest first, as the keyset pages them
    assert [str(r["uuid"]) for r in first + rest] == [uuid(9), uuid(1), uuid(3), uuid(2), uuid(0)]
    with pytest.raises(errors.InvalidParameterValue, match="invalid field for sorting"):
        await rules.list(limit=1, sort_key="actions")
    with pytest.raises(errors.InvalidParameterValue, match="Marker"):
        await rules.list(limit=1, marker=uuid(77))


async def test_a_rule_is_read_patched_and_deleted(rules: InspectionRuleRepository) -> None:
    created = await rules.create({"uuid": uuid(1), "actions": ACTIONS, "sensitive": True})
    assert created["priority"] == 0 and created["phase"] == "main" and created["conditions"] == []
    assert created["updated_at"] is None
    with pytest.raises(errors.Conflict, match=f"A rule with UUID {uuid(1)} already exists."):
        await rules.create({"uuid": uuid(1), "actions": ACTIONS})
    changed = await rules.update(uuid(1), {"priority": 7, "conditions": [{"op": "is-true", "args": {"value": "1"}}]})
    assert changed["priority"] == 7 and changed["conditions"][0]["op"] == "is-true"
    assert changed["updated_at"] is not None
    assert (await rules.get(uuid(1)))["priority"] == 7
    with pytest.raises(errors.InvalidParameterValue, match="unknown inspection rule fields: id"):
        await rules.update(uuid(1), {"id": 3})
    await rules.delete(uuid(1))
    for call in (rules.get(uuid(1)), rules.delete(uuid(1)), rules.update(uuid(1), {"priority": 1})):
        with pytest.raises(errors.NotFound, match=f"Rule {uuid(1)} could not be found."):
            await call


@pytest.mark.parametrize(
    "values",
    [
        {"actions": []},  # a rule does something
        {"actions": ACTIONS, "priority": 10000},  # user rules stay within 0-9999
        {"actions": {"op": "fail"}},
    ],
)
async def test_the_table_refuses_what_validation_would_have(rules: InspectionRuleRepository, values: Any) -> None:
    with pytest.raises(asyncpg.CheckViolationError):
        await rules.create({"uuid": uuid(5), **values})
