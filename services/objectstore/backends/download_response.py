"""The answer to a verified temp-URL GET or HEAD, the same whatever holds the
bytes: validators, preconditions (304, 412), then the Range plan (200, 206,
206 ``multipart/byteranges``, 416). A backend supplies only a way to send one
span of the object into the prepared response (sendfile for files, a ranged
GetObject for S3).

HEAD answers the status and headers the same GET would, ranges included, and
no body (RFC 9110 section 9.3.2; nginx does the same). iPXE's ``sanboot`` over
HTTP asks HEAD for the size, then single ranges, and needs 200 and 206.
"""

from __future__ import annotations

import dataclasses
import datetime
import secrets
from collections.abc import Awaitable, Callable
from email.utils import format_datetime

from aiohttp import web

from services.common.db.records import ObjectRecord
from services.objectstore.backends.byte_ranges import Span, plan_ranges
from services.objectstore.backends.preconditions import precondition_status

SendSpan = Callable[[web.StreamResponse, int, int], Awaitable[None]]
"""Writes bytes [offset, offset + count) of the object into a prepared response."""


@dataclasses.dataclass(frozen=True)
class ObjectVersion:
    """What a download needs to know of an object row."""

    size: int
    content_type: str
    sha256: str
    created_at: datetime.datetime

    @classmethod
    def from_row(cls, row: ObjectRecord) -> ObjectVersion:
        return cls(int(row["size"]), row["content_type"], row["sha256"], row["created_at"])

    @property
    def etag(self) -> str:
        """Strong: a key's bytes never change, and a replaced object has another digest."""
        return f'"{self.sha256}"'

    @property
    def last_modified(self) -> str:
        return format_datetime(self.created_at.astimezone(datetime.UTC), usegmt=True)


def _common_headers(version: ObjectVersion) -> dict[str, str]:
    return {
        "ETag": version.etag,
        "Last-Modified": version.last_modified,
        "Cache-Control": "private, no-transform",
        "X-Object-Sha256": version.sha256,
    }


def _part_heads(spans: tuple[Span, ...], version: ObjectVersion, boundary: str) -> tuple[list[bytes], bytes]:
    """The bytes before each span of a multipart/byteranges body, and its closing delimiter."""
    heads = [
        (
            ("\r\n" if index else "")
            + f"--{boundary}\r\nContent-Type: {version.content_type}\r\n"
            + f"Content-Range: bytes {span.start}-{span.last}/{version.size}\r\n\r\n"
        ).encode()  # as aiohttp encodes the response's own headers
        for index, span in enumerate(spans)
    ]
    return heads, f"\r\n--{boundary}--\r\n".encode()


async def answer_download(request: web.Request, version: ObjectVersion, send_span: SendSpan) -> web.StreamResponse:
    """Answer a verified temp-URL GET or HEAD for ``version``."""
    headers = _common_headers(version)
    stopped = precondition_status(request, etag=version.etag, last_modified=version.created_at)
    if stopped is not None:
        return web.Response(status=stopped, headers=headers)
    plan = plan_ranges(
        request.headers.get("Range"),
        request.headers.get("If-Range"),
        size=version.size,
        etag=version.etag,
        last_modified=version.created_at,
    )
    if plan.status == 416:
        return web.Response(status=416, headers={**headers, "Content-Range": f"bytes */{version.size}"})
    response = web.StreamResponse(status=plan.status, headers={**headers, "Accept-Ranges": "bytes"})
    heads: list[bytes] = []
    tail = b""
    if len(plan.spans) == 1:
        span = plan.spans[0]
        response.headers["Content-Type"] = version.content_type
        response.content_length = span.count
        if plan.status == 206:
            response.headers["Content-Range"] = f"bytes {span.start}-{span.last}/{version.size}"
    else:
        boundary = secrets.token_hex(16)
        heads, tail = _part_heads(plan.spans, version, boundary)
        response.headers["Content-Type"] = f"multipart/byteranges; boundary={boundary}"
        response.content_length = sum(len(h) for h in heads) + sum(s.count for s in plan.spans) + len(tail)
    await response.prepare(request)
    if request.method == "HEAD" or response.content_length == 0:
        await response.write_eof()
        return response
    if heads:
        for head, span in zip(heads, plan.spans, strict=True):
            await response.write(head)
            await send_span(response, span.start, span.count)
        await response.write(tail)
    else:
        await send_span(response, plan.spans[0].start, plan.spans[0].count)
    await response.write_eof()
    return response
