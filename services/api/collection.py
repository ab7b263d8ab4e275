"""The ``next`` link of a paginated list, built one way for every resource.

Ironic's ``collection.get_next``: when a page is full, ``next`` is the same
list with the same query and ``marker`` set to the page's last item, so a
client that follows it sees the next page of the very same filtered list.
Every query parameter the client sent is carried over (all values of a
repeated one, in order) and URL-encoded, so a filter value with ``&``, ``=``,
a space or non-ASCII text cannot change or cut the query; ``limit`` and
``marker`` come last.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import quote, urlencode

from aiohttp import web

PAGING_PARAMS = ("limit", "marker")


def next_link(
    request: web.Request,
    rows: Sequence[Mapping[str, Any]],
    *,
    base: str,
    limit: int,
    marker_field: str = "uuid",
    path: str | None = None,
) -> str | None:
    """The URL of the page after ``rows``, or None when ``rows`` is the last page.

    ``path`` replaces the request's path when the canonical URL differs (a
    node named in the path by name, say); it defaults to the request's path.
    """
    if not rows or len(rows) != limit:
        return None
    carried = [(k, v) for k, v in request.query.items() if k not in PAGING_PARAMS]
    carried += [("limit", str(limit)), ("marker", str(rows[-1][marker_field]))]
    return f"{base}{path or request.path}?{urlencode(carried, quote_via=quote)}"
