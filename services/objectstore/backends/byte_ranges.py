"""Which bytes a temp-URL download answers with: ``Range`` and ``If-Range``
as RFC 9110 has them (sections 14.1-14.4 and 13.1.5).

- No ``Range``, a unit other than ``bytes``, or a value that does not parse
  (``bytes=5-2``, ``bytes=abc``): the header is ignored and the whole object
  goes out, 200. A server MUST ignore a unit it does not know and MAY ignore
  an invalid range set; answering 416 to them (what aiohttp did) breaks
  clients that would have been happy with the whole object.
- ``If-Range`` whose validator does not match the object (a strong ETag
  comparison, or an HTTP-date equal to ``Last-Modified``): the client's
  cached piece is stale, so the Range is ignored, 200.
- No range-spec satisfiable (every first byte at or past the end, every
  suffix length 0, as in ``bytes=-0``): 416.
- Otherwise the satisfiable specs, merged where they overlap or touch
  (section 14.2 allows it; it also bounds the answer to the object's size):
  one span is a plain 206, several a 206 ``multipart/byteranges``.
- More than ``MAX_RANGE_SPECS`` specs is ignored (200): section 14.2 lets a
  server refuse to cut an object into many small pieces for one request.

An empty object has no byte a range could name, so any Range on it that is
satisfiable at all (a non-zero suffix) gets the whole, empty, object.
"""

from __future__ import annotations

import dataclasses
import datetime
import email.utils
import re

MAX_RANGE_SPECS = 16
_SPEC = re.compile(r"([0-9]*)-([0-9]*)")
_OWS = " \t"


@dataclasses.dataclass(frozen=True)
class Span:
    """Bytes [start, start + count) of the object."""

    start: int
    count: int

    @property
    def last(self) -> int:
        return self.start + self.count - 1


@dataclasses.dataclass(frozen=True)
class RangePlan:
    """200 with the whole object as one span, 206 with one or more spans, or 416 with none."""

    status: int
    spans: tuple[Span, ...]


RangeSpec = tuple[int | None, int | None]
"""(first, last) as written: (None, n) is a suffix of n bytes, (first, None) runs to the end."""


def parse_byte_ranges(value: str) -> list[RangeSpec] | None:
    """The range-specs of a ``bytes=`` Range value, in order; None when the
    unit is not ``bytes`` or the value is not a valid ranges-specifier."""
    unit, equals, range_set = value.partition("=")
    if not equals or unit.strip(_OWS).lower() != "bytes":
        return None
    specs: list[RangeSpec] = []
    for element in range_set.split(","):
        element = element.strip(_OWS)
        if not element:  # the list rule: empty elements are ignored
            continue
        match = _SPEC.fullmatch(element)
        if match is None:
            return None
        first, last = match.group(1), match.group(2)
        if first:
            if last and int(last) < int(first):
                return None
            specs.append((int(first), int(last) if last else None))
        elif last:
            specs.append((None, int(last)))
        else:  # a lone "-"
            return None
    return specs or None


def if_range_holds(value: str, *, etag: str, last_modified: datetime.datetime) -> bool:
    """The If-Range condition: a strong ETag equal to ``etag``, or an
    HTTP-date exactly ``last_modified`` (to the second); anything else is false."""
    value = value.strip(_OWS)
    if value.startswith(('"', "W/")):
        return value == etag  # strong comparison: a weak tag never matches
    try:
        date = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return False
    if date.tzinfo is None:  # asctime form: HTTP-dates are always GMT
        date = date.replace(tzinfo=datetime.UTC)
    return date == last_modified.replace(microsecond=0)


def _span(spec: RangeSpec, size: int) -> Span | None:
    """The bytes a spec names in an object of ``size``; None when unsatisfiable."""
    first, last = spec
    if first is None:
        assert last is not None
        if last == 0:
            return None
        start = max(size - last, 0)
        return Span(start, size - start)
    if first >= size:
        return None
    end = size - 1 if last is None else min(last, size - 1)
    return Span(first, end - first + 1)


def _merge(spans: list[Span]) -> tuple[Span, ...]:
    merged: list[Span] = []
    for span in sorted(spans, key=lambda s: s.start):
        if merged and span.start <= merged[-1].last + 1:
            previous = merged[-1]
            merged[-1] = Span(previous.start, max(previous.last, span.last) - previous.start + 1)
        else:
            merged.append(span)
    return tuple(merged)


def plan_ranges(
    range_value: str | None, if_range: str | None, *, size: int, etag: str, last_modified: datetime.datetime
) -> RangePlan:
    """What to answer a GET (or HEAD) with, given its Range and If-Range values."""
    whole = RangePlan(200, (Span(0, size),))
    if range_value is None:
        return whole
    specs = parse_byte_ranges(range_value)
    if specs is None or len(specs) > MAX_RANGE_SPECS:
        return whole
    if if_range is not None and not if_range_holds(if_range, etag=etag, last_modified=last_modified):
        return whole
    if size == 0:
        satisfiable = any(first is None and last for first, last in specs)
        return whole if satisfiable else RangePlan(416, ())
    spans = [span for span in (_span(spec, size) for spec in specs) if span is not None]
    if not spans:
        return RangePlan(416, ())
    return RangePlan(206, _merge(spans))
