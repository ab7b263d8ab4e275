"""The Range parser and planner (issue 16, item 11) as properties: any header
text is answered without an exception, a valid range set round-trips, and a
206 sends exactly the bytes the satisfiable specs name, each once, in order."""

from __future__ import annotations

import datetime

from hypothesis import given
from hypothesis import strategies as st

from services.objectstore.backends.byte_ranges import (
    MAX_RANGE_SPECS,
    RangeSpec,
    parse_byte_ranges,
    plan_ranges,
)

ETAG = '"' + "ab" * 32 + '"'
MODIFIED = datetime.datetime(2026, 11, 23, 10, 0, 0, 250_000, tzinfo=datetime.UTC)


def spec_text(spec: RangeSpec) -> str:
    first, last = spec
    return f"{'' if first is None else first}-{'' if last is None else last}"


positions = st.integers(min_value=0, max_value=400)
int_ranges = st.tuples(positions, st.integers(min_value=0, max_value=200) | st.none()).map(
    lambda t: (t[0], None if t[1] is None else t[0] + t[1])
)
suffixes = st.tuples(st.none(), positions)
spec_lists = st.lists(int_ranges | suffixes, min_size=1, max_size=MAX_RANGE_SPECS)


def named_bytes(specs: list[RangeSpec], size: int) -> set[int]:
    """Brute force: every byte offset some spec names."""
    named: set[int] = set()
    for first, last in specs:
        if first is None:
            assert last is not None
            named.update(range(max(size - last, 0), size))
        else:
            named.update(range(first, size if last is None else min(last + 1, size)))
    return named


@given(st.text(max_size=200), st.integers(min_value=0, max_value=10**12), st.text(max_size=80) | st.none())
def test_any_header_text_gets_an_answer(value: str, size: int, if_range: str | None) -> None:
    plan = plan_ranges(value, if_range, size=size, etag=ETAG, last_modified=MODIFIED)
    assert plan.status in (200, 206, 416)
    for span in plan.spans:
        assert span.start >= 0 and span.count >= 0 and span.start + span.count <= size


@given(spec_lists, st.sampled_from(["bytes", "BYTES", "Bytes"]), st.sampled_from([",", ", ", " ,\t"]))
def test_a_valid_range_set_round_trips(specs: list[RangeSpec], unit: str, comma: str) -> None:
    assert parse_byte_ranges(f"{unit}={comma.join(spec_text(s) for s in specs)}") == specs


@given(spec_lists, st.integers(min_value=0, max_value=500))
def test_a_206_sends_each_named_byte_once_in_order(specs: list[RangeSpec], size: int) -> None:
    value = "bytes=" + ",".join(spec_text(s) for s in specs)
    plan = plan_ranges(value, None, size=size, etag=ETAG, last_modified=MODIFIED)
    named = named_bytes(specs, size)
    if plan.status == 206:
        sent = [offset for span in plan.spans for offset in range(span.start, span.start + span.count)]
        assert sent == sorted(named)  # each byte once, ascending
        assert all(a.last + 1 < b.start for a, b in zip(plan.spans, plan.spans[1:], strict=False))  # merged
        assert all(span.count > 0 for span in plan.spans)
    elif plan.status == 416:
        assert not named and not (size == 0 and any(first is None and last for first, last in specs))
    else:  # an empty object with a non-zero suffix: the whole (empty) object
        assert size == 0 and plan.spans[0].count == 0


@given(spec_lists, st.integers(min_value=1, max_value=500))
def test_if_range_serves_the_range_only_for_the_current_version(specs: list[RangeSpec], size: int) -> None:
    value = "bytes=" + ",".join(spec_text(s) for s in specs)
    plain = plan_ranges(value, None, size=size, etag=ETAG, last_modified=MODIFIED)
    for current in (ETAG, "Mon, 23 Nov 2026 10:00:00 GMT", "Monday, 23-Nov-26 10:00:00 GMT"):
        assert plan_ranges(value, current, size=size, etag=ETAG, last_modified=MODIFIED) == plain
    for stale in ('"other"', f"W/{ETAG}", "Mon, 23 Nov 2026 09:59:59 GMT", "yesterday", ""):
        whole = plan_ranges(value, stale, size=size, etag=ETAG, last_modified=MODIFIED)
        assert whole.status == 200 and whole.spans[0].count == size


def test_too_many_specs_are_ignored() -> None:
    value = "bytes=" + ",".join(f"{i}-{i}" for i in range(0, 2 * (MAX_RANGE_SPECS + 1), 2))
    plan = plan_ranges(value, None, size=1000, etag=ETAG, last_modified=MODIFIED)
    assert plan.status == 200 and plan.spans[0].count == 1000
