"""The conditional headers of a temp-URL download, in RFC 9110's order
(section 13.2.2): ``If-Match``, then ``If-Unmodified-Since`` (only without
If-Match), then ``If-None-Match``, then ``If-Modified-Since`` (only without
If-None-Match). ``If-Range`` comes after these and lives with the ranges
(``byte_ranges``).

Both backends validate with the same values: the quoted sha256 as a strong
ETag (a key's bytes never change, and a replaced object has a new digest) and
the row's ``created_at`` as ``Last-Modified``.
"""

from __future__ import annotations

import datetime

from aiohttp import ETag, web


def _matches(tags: tuple[ETag, ...], etag: str, *, weak: bool) -> bool:
    if len(tags) == 1 and tags[0].value == "*":
        return True
    value = etag.strip('"')
    return any(tag.value == value for tag in tags if weak or not tag.is_weak)


def precondition_status(request: web.Request, *, etag: str, last_modified: datetime.datetime) -> int | None:
    """412 or 304 when a condition stops the request, None to answer it."""
    modified = last_modified.replace(microsecond=0)
    if_match = request.if_match
    if if_match is not None:
        if not _matches(if_match, etag, weak=False):
            return 412
    elif (since := request.if_unmodified_since) is not None and modified > since:
        return 412
    if_none_match = request.if_none_match
    if if_none_match is not None:
        if _matches(if_none_match, etag, weak=True):
            return 304  # only GET and HEAD reach a download
    elif (since := request.if_modified_since) is not None and modified <= since:
        return 304
    return None
