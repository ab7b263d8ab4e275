"""HTTP PUT uploads through signed upload URLs (``/u/<expires>.<sig>/<container>/<name>``).

Why an HTTP upload next to the gRPC ``Put``: a file sent with sendfile(2)
over plain HTTP costs the client almost no CPU and the server one receive
into a buffer, while Python gRPC spends about a CPU-second per GiB on each
side (docs/objectstore.md, "Figures"). ``ObjectStoreClient.put_file`` asks
``TempUrl(method="PUT")`` for a URL and sends the file this way.

The request, Swift style:

- ``Content-Length`` (or ``Transfer-Encoding: chunked``); ``Expect:
  100-continue`` is honoured, so a refused upload sends no body;
- ``Content-Type``; ``X-Delete-After`` (seconds); ``X-Object-Usage-Count``;
  ``X-Object-Metadata`` (a JSON object of strings); ``X-Object-Sha256``
  (the digest the client expects; a mismatch stores nothing).

The answer is ``201`` with the object as JSON (and ``ETag``/``X-Object-Sha256``
headers), or an error status with ``{"error": {"name", "message"}}``. The
logic here is shared by the fast front door (``upload_front_door``) and the
aiohttp route that takes chunked bodies.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import AsyncIterator, Mapping
from typing import Any, cast

import asyncpg

from services.common import errors
from services.common.db.records import ObjectRecord
from services.objectstore.store import ObjectStore, PutRequest

MAX_METADATA_HEADER = 8000
_REFUSALS = {
    401: ("Unauthorized", "temp URL expired"),
    403: ("Forbidden", "temp URL signature invalid"),
    404: ("NotFound", "not found"),
}


@dataclasses.dataclass(frozen=True)
class Reply:
    status: int
    headers: tuple[tuple[str, str], ...]
    body: bytes


@dataclasses.dataclass(frozen=True)
class UploadPlan:
    request: PutRequest
    expected_size: int | None
    expected_sha256: str


class Refused(Exception):
    """A temp-URL refusal (401/403/404) with its fixed text: says nothing about the object."""

    def __init__(self, status: int) -> None:
        super().__init__(_REFUSALS[status][1])
        self.status = status


def _int_header(headers: Mapping[str, str], name: str) -> int:
    """A whole-number header; ``name`` as written in errors, looked up in lower case."""
    value = headers.get(name.lower(), "").strip()
    if not value:
        return 0
    if not value.isdigit():
        raise errors.InvalidParameterValue(f"{name} must be a whole number of 0 or more, not {value[:32]!r}")
    return int(value)


def _metadata(headers: Mapping[str, str]) -> dict[str, str]:
    raw = headers.get("x-object-metadata", "").strip()
    if not raw:
        return {}
    try:
        value = json.loads(raw)
    except ValueError:
        raise errors.InvalidParameterValue("X-Object-Metadata must be a JSON object of strings") from None
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise errors.InvalidParameterValue("X-Object-Metadata must be a JSON object of strings")
    return value


def _json(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


class HttpUploads:
    """Turns an authorised PUT into ``ObjectStore.put`` and its outcome into a reply."""

    ROUTE = "PUT /u/{token}/{container}/{name}"  # the metrics label, like aiohttp's canonical route

    def __init__(self, store: ObjectStore) -> None:
        self.store = store

    def plan(self, path: str, headers: Mapping[str, str], content_length: int | None) -> UploadPlan:
        """Check the URL and headers before a byte of the body is read.

        ``path`` is percent-decoded, ``headers`` has lower-case names. Raises
        :class:`Refused` or a FerrumError; changes nothing either way.
        """
        status, target = self.store.check_upload_url(path)
        if target is None:
            raise Refused(status)
        sha256 = headers.get("x-object-sha256", "").strip().lower()
        if sha256 and (len(sha256) != 64 or any(c not in "0123456789abcdef" for c in sha256)):
            raise errors.InvalidParameterValue("X-Object-Sha256 must be 64 hex digits")
        request = PutRequest(
            container=target.container,
            name=target.name,
            content_type=headers.get("content-type", "").strip() or "application/octet-stream",
            delete_after=_int_header(headers, "X-Delete-After"),
            metadata=_metadata(headers),
            usage_count=_int_header(headers, "X-Object-Usage-Count"),
        )
        limit = self.store.config.max_object_size
        if content_length is not None and content_length > limit:
            raise errors.PayloadTooLarge(f"object is larger than the limit of {limit} bytes")
        return UploadPlan(request, content_length, sha256)

    async def receive(self, plan: UploadPlan, chunks: AsyncIterator[bytes | bytearray | memoryview]) -> ObjectRecord:
        """Store the body; any failure (short body, limits, client gone) stores nothing."""
        # The store only measures, hashes and writes the chunks, and each buffer here is a
        # fresh one that nothing mutates afterwards: it serves as bytes without a copy.
        as_bytes = cast(AsyncIterator[bytes], chunks)
        return await self.store.put(plan.request, as_bytes, expected=lambda: (plan.expected_size, plan.expected_sha256))

    @staticmethod
    def created(row: ObjectRecord) -> Reply:
        delete_at = row["delete_at"]
        body = _json(
            {
                "container": row["container"],
                "name": row["name"],
                "size": int(row["size"]),
                "sha256": row["sha256"],
                "content_type": row["content_type"],
                "created_at": row["created_at"].isoformat(),
                "delete_at": delete_at.isoformat() if delete_at is not None else None,
                "usage_count": int(row["usage_count"]),
                "metadata": dict(row["metadata"] or {}),
            }
        )
        return Reply(
            201,
            (("Content-Type", "application/json"), ("ETag", f'"{row["sha256"]}"'), ("X-Object-Sha256", row["sha256"])),
            body,
        )

    @staticmethod
    def failed(exc: BaseException) -> Reply:
        if isinstance(exc, Refused):
            name, message, status = _REFUSALS[exc.status][0], str(exc), exc.status
        elif isinstance(exc, errors.FerrumError):
            name, message, status = type(exc).__name__, exc.message, exc.http_status
        elif isinstance(exc, (asyncpg.DataError, ValueError, UnicodeError)):
            name, message, status = "InvalidParameterValue", str(exc), 400
        elif isinstance(exc, (asyncpg.PostgresConnectionError, asyncpg.InterfaceError, ConnectionError)):
            name, message, status = "ServiceUnavailable", "the object store's database is unavailable; retry", 503
        else:
            name, message, status = "FerrumError", f"object store failure: {type(exc).__name__}", 500
        return Reply(
            status,
            (("Content-Type", "application/json"), ("Cache-Control", "no-store")),
            _json({"error": {"name": name, "message": message}}),
        )
