"""The api's JSON reader: nesting refused before parsing (issue 16 #8), NaN,
Infinity and NUL refused, and a property test that the raw scan agrees with
the depth of the value the text encodes."""

from __future__ import annotations

import contextlib
import json
import sys
import time
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services.api.json_body import check_raw_depth, json_depth, loads_limited
from services.common import errors

LIMIT = 25


def nesting(value: Any) -> int:
    """How many containers deep the deepest point of ``value`` is."""
    if isinstance(value, dict):
        return 1 + max((nesting(v) for v in value.values()), default=0)
    if isinstance(value, list):
        return 1 + max((nesting(v) for v in value), default=0)
    return 0


@pytest.mark.parametrize(
    "raw",
    [
        b"[" * 100_000,
        b"[" * 100_000 + b"]" * 100_000,
        b'{"a":' * 100_000 + b"1" + b"}" * 100_000,
        ("[" * 50_000).encode() + b'"x"',
        "[" * (sys.getrecursionlimit() * 3),
    ],
)
def test_deep_text_is_refused_before_it_is_parsed(raw: bytes | str) -> None:
    started = time.perf_counter()
    with pytest.raises(errors.Invalid, match="deeper than the maximum depth of 25"):
        loads_limited(raw, depth=LIMIT)
    assert time.perf_counter() - started < 1.0


def test_brackets_inside_strings_do_not_count() -> None:
    raw = json.dumps({"text": "[" * 1000 + '"\\"{' * 100, "list": ["]]]" * 50]})
    assert loads_limited(raw, depth=LIMIT)["list"] == ["]]]" * 50]


def test_the_limit_is_inclusive() -> None:
    assert loads_limited("[" * LIMIT + "]" * LIMIT, depth=LIMIT) is not None
    with pytest.raises(errors.Invalid):
        loads_limited("[" * (LIMIT + 1) + "]" * (LIMIT + 1), depth=LIMIT)


@pytest.mark.parametrize(
    ("raw", "said"),
    [
        ('{"a": NaN}', "NaN is not a valid JSON number"),
        ("[Infinity]", "Infinity is not a valid JSON number"),
        ('{"a": -Infinity}', "-Infinity is not a valid JSON number"),
        ('{"a": "x\\u0000y"}', "NUL characters are not allowed"),
        ('{"a\\u0000": 1}', "NUL characters are not allowed"),
        ("[1,", "not valid JSON"),
    ],
)
def test_values_postgresql_cannot_store_are_refused(raw: str, said: str) -> None:
    with pytest.raises(errors.Invalid, match=said):
        loads_limited(raw, depth=LIMIT)


def test_parsed_values_with_non_finite_numbers_are_refused() -> None:
    """What the gRPC API's Structs carry (doubles) goes through the same check."""
    for bad in (float("nan"), float("inf"), {"x": [1, float("-inf")]}):
        with pytest.raises(errors.Invalid, match="NaN and Infinity"):
            json_depth(bad, LIMIT)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(alphabet='[]{}"\\ab\x00', max_size=8),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=4), children, max_size=3),
    max_leaves=60,
)


@settings(
    derandomize=True, database=None, deadline=None, max_examples=300, suppress_health_check=[HealthCheck.too_slow]
)
@given(value=json_values, limit=st.integers(min_value=0, max_value=8))
def test_raw_scan_agrees_with_the_value(value: Any, limit: int) -> None:
    raw = json.dumps(value)
    if nesting(value) > limit:
        with pytest.raises(errors.Invalid):
            check_raw_depth(raw, limit)
    else:
        check_raw_depth(raw, limit)
        check_raw_depth(raw.encode(), limit)


@settings(derandomize=True, database=None, deadline=None, max_examples=300)
@given(raw=st.binary(max_size=200) | st.text(alphabet='[]{}",:\\1a ', max_size=300))
def test_any_bytes_give_a_value_or_invalid(raw: bytes | str) -> None:
    with contextlib.suppress(errors.Invalid):
        loads_limited(raw, depth=4)
