"""Query parameters and microversion gates every REST resource shares.

Ironic answers the same malformed parameter the same way on every resource,
so the parsing lives here once: ``?fields=`` (1.8), ``?limit=`` (capped at
``[api]max_limit``), boolean flags, and the two kinds of microversion gate:

- a *feature* newer than the requested version (a filter, a body key) is a
  406 Not Acceptable (:func:`require_version`);
- an *endpoint* newer than the requested version does not exist for that
  client, so it is a 404 (:func:`require_endpoint`), as Ironic's controllers
  answer for resources they hide below their version; a few answer 405 or
  406 there instead, as Ironic does (the routes table says which).
"""

from __future__ import annotations

from typing import TypedDict

from aiohttp import web

from services.api import views
from services.common import errors

FIELDS_SINCE = (1, 8)
TRUE_WORDS = ("true", "1", "yes", "on")
FALSE_WORDS = ("false", "0", "no", "off")


def require_version(request: web.Request, since: tuple[int, int], what: str) -> None:
    """406 when ``what`` (a parameter or body key) is newer than the request's version."""
    if request["version"] < since:
        raise errors.NotAcceptable(f"{what} requires API version {since[0]}.{since[1]} or newer")


def require_minimal_version(request: web.Request, since: tuple[int, int]) -> None:
    """406 with Ironic's own words, for the filters Ironic guards that way (shard 1.82, children 1.83)."""
    if request["version"] < since:
        raise errors.NotAcceptable(
            f"Request not acceptable. The minimal required API version should be {since[0]}.{since[1]}"
        )


def require_endpoint(request: web.Request, since: tuple[int, int], refusal: int = 404) -> None:
    """404 when the whole endpoint is newer than the request's version.

    ``refusal`` is the status for routes where Ironic answers otherwise: 405
    for writes to allocations (below 1.52) and deploy templates (below 1.55),
    where its controllers refuse the method, and 405 or 406 for node traits
    below 1.37, where the path falls through to the node controller.
    """
    if request["version"] >= since:
        return
    if refusal == 405:
        raise web.HTTPMethodNotAllowed(request.method, [])
    if refusal == 406:
        raise errors.NotAcceptable(f"The requested resource requires API version {since[0]}.{since[1]} or newer")
    raise web.HTTPNotFound()


def parse_bool(value: str, name: str) -> bool:
    """Ironic's boolean query words; anything else is a 400 naming the parameter."""
    lowered = value.strip().lower()
    if lowered in TRUE_WORDS:
        return True
    if lowered in FALSE_WORDS:
        return False
    raise errors.InvalidParameterValue(f"Invalid value for {name}: {value}")


def optional_bool(request: web.Request, name: str) -> bool | None:
    """A boolean query parameter, or None when the request does not give it."""
    raw = request.query.get(name)
    return None if raw is None else parse_bool(raw, name)


def flag(request: web.Request, name: str) -> bool:
    """A boolean query parameter that is false unless the request sets it."""
    return bool(optional_bool(request, name))


def requested_fields(request: web.Request, known: dict[str, tuple[int, int]]) -> list[str] | None:
    """``?fields=``: None when absent or empty, 406 below 1.8 or for a field
    newer than the version, 400 for an unknown one."""
    raw = request.query.get("fields")
    if raw is None:
        return None
    require_version(request, FIELDS_SINCE, "The fields parameter")
    # An empty ?fields= asks for nothing in particular: the default view, not a links-only one.
    return views.check_fields([f.strip() for f in raw.split(",") if f.strip()], known, request["version"]) or None


def page_limit(request: web.Request, max_limit: int) -> int:
    """``?limit=``: a positive integer, capped at ``max_limit``; absent means ``max_limit``."""
    raw = request.query.get("limit")
    if raw is None:
        return max_limit
    try:
        limit = int(raw)
    except ValueError:
        raise errors.InvalidParameterValue(f"Invalid limit value: {raw}") from None
    if limit <= 0:
        raise errors.InvalidParameterValue("Limit must be positive")
    return min(limit, max_limit)


class PageOrder(TypedDict):
    """Where a list's page starts and how the list is sorted."""

    marker: str | None
    sort_key: str
    sort_dir: str


def page_order(request: web.Request) -> PageOrder:
    """``marker``, ``sort_key`` and ``sort_dir`` as the query gives them, with Ironic's
    defaults (by id, ascending), for a repository's list; the repository checks them."""
    q = request.query
    return {"marker": q.get("marker"), "sort_key": q.get("sort_key", "id"), "sort_dir": q.get("sort_dir", "asc")}
