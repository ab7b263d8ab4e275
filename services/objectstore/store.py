"""The object store's logic, independent of gRPC and HTTP: validated puts
that stream into a backend, reads, listings, atomic counters, temp URLs and
the expiry and orphan sweeps. Metadata lives in PostgreSQL, bytes in the
backend; a row is written only after its bytes are durable, and bytes are
removed only after their row is gone, so a crash at any point leaves at worst
unreferenced bytes, which the orphan sweep removes."""

from __future__ import annotations

import asyncio
import builtins
import dataclasses
import datetime
import logging
import re
import time
import uuid
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

from aiohttp import web

from services.common import errors
from services.common.config import ObjectStoreConfig
from services.common.db.objects import ObjectRepository
from services.common.db.records import ObjectRecord
from services.objectstore import names, tempurl
from services.objectstore.backends import Backend, Upload
from services.objectstore.backends.download_response import ObjectVersion, answer_download
from services.objectstore.sealed_objects import ObjectSealing

LOG = logging.getLogger(__name__)
EXPIRED_BATCH = 500
ORPHAN_BATCH = 1000
MAX_DELETE_AFTER = 100 * 365 * 86400
_KEY = re.compile(r"[0-9a-f]{32}")  # uuid4().hex, the backend keys put() makes


@dataclasses.dataclass(frozen=True)
class PutRequest:
    container: str
    name: str
    content_type: str = "application/octet-stream"
    delete_after: int = 0
    metadata: Mapping[str, str] = dataclasses.field(default_factory=dict)
    usage_count: int = 0


@dataclasses.dataclass(frozen=True)
class TempUrlCheck:
    """Outcome of checking a temp-URL request: an HTTP status and, for 200, the row."""

    status: int
    row: ObjectRecord | None = None
    expires: int = 0


class ObjectStore:
    def __init__(
        self,
        config: ObjectStoreConfig,
        repo: ObjectRepository,
        backend: Backend,
        *,
        secret: bytes,
        public_url: str,
        sealing: ObjectSealing,
    ) -> None:
        """``sealing`` says which objects are encrypted at rest and holds the keys (sealed_objects)."""
        self.config = config
        self.repo = repo
        self.backend = backend
        self.sealing = sealing
        self._secret = secret
        self.public_url = public_url.rstrip("/")

    # -- writes -------------------------------------------------------------------------------

    async def put(
        self,
        request: PutRequest,
        chunks: AsyncIterator[bytes],
        *,
        expected: Callable[[], tuple[int | None, str]] = lambda: (None, ""),
        streamed: bool = True,
    ) -> ObjectRecord:
        """Stream ``chunks`` into a new backend key, then publish the row.

        ``expected()`` is asked once the chunks are exhausted: the size (None =
        unchecked) and sha256 ("" = unchecked) the client says it sent.
        A stream (``streamed``) is checked against the container's room as it
        comes, so an upload over the quota stops at the first byte too many
        instead of at its end; an object the caller holds whole (PutSmall,
        at most a few MiB) skips that read, and the check every write gets
        when it is published, under the container's lock, refuses it alike.
        Any failure or cancellation (client gone, limit hit, mismatch,
        database down) removes the partial or committed bytes before the error
        propagates.
        """
        container = names.check_container(request.container)
        name = names.check_name(request.name)
        content_type = names.check_content_type(request.content_type)
        metadata = names.check_metadata(request.metadata)
        if not 0 <= request.delete_after <= MAX_DELETE_AFTER:
            raise errors.InvalidParameterValue(
                f"delete_after must be 0 (never) or between 1 and {MAX_DELETE_AFTER} seconds"
            )
        if request.usage_count < 0:
            raise errors.InvalidParameterValue("usage_count must not be negative")
        room = self.config.max_container_size
        if streamed:
            room -= await self.repo.container_usage(container, excluding=name)
        key = uuid.uuid4().hex
        upload: Upload = self.backend.begin_upload(key)
        sealed_key_id = None
        if self.sealing.wants(container, metadata):
            upload, sealed_key_id = self.sealing.begin(upload, container=container, name=name)
        size = 0
        try:
            async for chunk in chunks:
                size += len(chunk)
                if size > self.config.max_object_size:
                    raise errors.PayloadTooLarge(
                        f"object is larger than the limit of {self.config.max_object_size} bytes"
                    )
                if size > room:
                    raise errors.PayloadTooLarge(
                        f"container {container!r} would exceed its limit of {self.config.max_container_size} bytes"
                    )
                await upload.write(chunk)
            expected_size, expected_sha256 = expected()
            if expected_size is not None and expected_size != size:
                raise errors.InvalidParameterValue(f"the client announced {expected_size} bytes but sent {size}")
        except BaseException as exc:
            await asyncio.shield(self._discard(upload, key, committed=False))
            LOG.info(
                "upload discarded container=%s name=%s reason=%s",
                container,
                name,
                exc.message if isinstance(exc, errors.FerrumError) else type(exc).__name__,
            )
            raise
        # All bytes are in. Commit and publish run to the end even if the caller
        # is cancelled now, so the row and the bytes always agree.
        values = {
            "container": container,
            "name": name,
            "content_type": content_type,
            "backend_key": key,
            "usage_count": request.usage_count,
            "metadata": metadata,
            "sealed_key_id": sealed_key_id,
        }
        return await asyncio.shield(
            self._commit_and_publish(upload, values, request.delete_after, expected_sha256.lower())
        )

    async def _commit_and_publish(
        self, upload: Upload, values: dict[str, Any], delete_after: int, expected_sha256: str
    ) -> ObjectRecord:
        key = values["backend_key"]
        committed = False
        try:
            size, digest = await upload.commit()
            committed = True
            if expected_sha256 and expected_sha256 != digest:
                raise errors.InvalidParameterValue(
                    f"sha256 mismatch: the client announced {expected_sha256}, the server computed {digest}"
                )
            row, replaced = await self.repo.upsert(
                {**values, "size": size, "sha256": digest},
                delete_after=delete_after,
                max_container_size=self.config.max_container_size,
            )
        except BaseException as exc:
            await self._discard(upload, key, committed=committed)
            LOG.info(
                "upload discarded container=%s name=%s reason=%s",
                values["container"],
                values["name"],
                exc.message if isinstance(exc, errors.FerrumError) else type(exc).__name__,
            )
            raise
        if replaced:
            await self._remove_bytes(replaced)
        LOG.info(
            "object stored container=%s name=%s size=%d sha256=%s delete_after=%d",
            values["container"],
            values["name"],
            size,
            digest,
            delete_after,
        )
        return row

    async def _discard(self, upload: Upload, key: str, *, committed: bool) -> None:
        try:
            if committed:
                await self.backend.delete(key)
            else:
                await upload.abort()
        except Exception:
            LOG.exception("could not remove a failed upload key=%s (the orphan sweep will)", key)

    async def _remove_bytes(self, key: str) -> None:
        try:
            await self.backend.delete(key)
        except Exception:
            LOG.exception("could not remove bytes key=%s (the orphan sweep will)", key)

    async def delete(self, container: str, name: str) -> None:
        names.check_container(container)
        names.check_name(name)
        key, live = await self.repo.delete(container, name)
        if key is not None:
            await self._remove_bytes(key)
        if not live:
            raise errors.ObjectNotFound(f"object {container}/{name} not found")
        LOG.info("object deleted container=%s name=%s", container, name)

    async def update_metadata(
        self,
        container: str,
        name: str,
        *,
        usage_delta: int = 0,
        expected_usage: int | None = None,
        set_metadata: Mapping[str, str] | None = None,
    ) -> ObjectRecord:
        """Counter change and metadata merge in one statement; an empty value removes a key."""
        names.check_container(container)
        names.check_name(name)
        values = dict(set_metadata or {})
        remove = [k for k, v in values.items() if v == ""]
        merged = names.check_metadata({k: v for k, v in values.items() if v != ""})
        return await self.repo.update_metadata(
            container,
            name,
            usage_delta=usage_delta,
            expected_usage=expected_usage,
            set_metadata=merged,
            remove_keys=remove,
        )

    async def release(self, container: str, name: str) -> tuple[int, bool]:
        names.check_container(container)
        names.check_name(name)
        count, deleted, key = await self.repo.release(container, name)
        if key is not None:
            await self._remove_bytes(key)
            LOG.info("object released and deleted container=%s name=%s", container, name)
        return count, deleted

    # -- reads --------------------------------------------------------------------------------

    async def stat(self, container: str, name: str) -> ObjectRecord:
        names.check_container(container)
        names.check_name(name)
        row = await self.repo.get(container, name)
        if row is None:
            raise errors.ObjectNotFound(f"object {container}/{name} not found")
        return row

    async def list(self, container: str, prefix: str = "") -> builtins.list[ObjectRecord]:
        """Objects of a container by name; a container exists while it holds an object."""
        names.check_container(container)
        rows = await self.repo.list(container, prefix)
        if not rows and not await self.repo.container_exists(container):
            raise errors.NotFound(f"container {container} not found")
        return rows

    async def open_read(
        self, container: str, name: str, *, offset: int = 0, length: int = 0
    ) -> tuple[ObjectRecord, AsyncIterator[bytes]]:
        """The row and its bytes [offset, offset+length) (length 0 = to the end)."""
        row = await self.stat(container, name)
        size = int(row["size"])
        if offset < 0 or length < 0:
            raise errors.InvalidParameterValue("offset and length must not be negative")
        if offset > size:
            raise errors.InvalidParameterValue(f"offset {offset} is past the end of the object ({size} bytes)")
        count = size - offset if length == 0 else min(length, size - offset)
        if row["sealed_key_id"] is not None:
            self.sealing.check_readable(row)
            return row, self.sealing.read(self.backend, row, offset=offset, length=count)
        chunks = self.backend.read(row["backend_key"], offset=offset, length=count, chunk_size=1024 * 1024)
        return row, chunks

    # -- temp URLs ----------------------------------------------------------------------------

    def check_lifetime(self, lifetime: int) -> None:
        """A temp URL's lifetime in seconds: 0 (the default) up to the configured maximum."""
        if lifetime < 0 or lifetime > self.config.temp_url_max_lifetime:
            raise errors.InvalidParameterValue(
                f"lifetime must be between 1 and {self.config.temp_url_max_lifetime} seconds (0 = default)"
            )

    async def temp_url(self, container: str, name: str, *, method: str = "GET", lifetime: int = 0) -> tuple[str, int]:
        """A signed URL and its Unix expiry time."""
        method = names.check_method(method)
        self.check_lifetime(lifetime)
        if method == "PUT":  # an upload URL: the object need not exist yet
            expires = int(time.time()) + (lifetime or self.config.temp_url_default_lifetime)
            path = tempurl.build_upload_path(
                self._secret, names.check_container(container), names.check_name(name), expires
            )
            return f"{self.public_url}{path}", expires
        return self.signed_url(await self.stat(container, name), method=method, lifetime=lifetime)

    def signed_url(self, row: ObjectRecord, *, method: str = "GET", lifetime: int = 0) -> tuple[str, int]:
        """A GET or HEAD temp URL for an object row already in hand (no lookup), and its expiry."""
        method = names.check_method(method)
        if method == "PUT":
            raise errors.InvalidParameterValue("an upload URL names no stored object: use temp_url")
        self.check_lifetime(lifetime)
        expires = int(time.time()) + (lifetime or self.config.temp_url_default_lifetime)
        path = tempurl.build_path(self._secret, method, int(row["id"]), row["name"], expires)
        return f"{self.public_url}{path}", expires

    def check_upload_url(self, path: str) -> tuple[int, tempurl.UploadTarget | None]:
        """(200, target) for a valid PUT temp URL path (percent-decoded);
        404 when it is not shaped like one, 403 for a bad signature, 401 when expired.
        Only the signature is checked here: names and limits are put()'s."""
        target = tempurl.parse_upload_path(path)
        if target is None:
            return 404, None
        if not tempurl.verify_upload(self._secret, target):
            return 403, None
        if target.expires <= time.time():
            return 401, None
        return 200, target

    async def check_temp_url(self, http_method: str, token: str, name: str) -> TempUrlCheck:
        """403 for a bad signature, 401 when expired, 404 for anything unknown.

        The signature is checked before the database is asked, so only the
        holder of a valid URL can learn whether its object still exists.
        """
        parsed = tempurl.parse_token(token)
        if parsed is None:
            return TempUrlCheck(404)
        methods = ("GET", "HEAD") if http_method == "HEAD" else (http_method,)
        if not tempurl.verify(self._secret, methods, parsed, name):
            return TempUrlCheck(403)
        if parsed.expires <= time.time():
            return TempUrlCheck(401)
        row = await self.repo.get_by_id(parsed.object_id)
        if row is None or row["name"] != name:
            return TempUrlCheck(404)
        return TempUrlCheck(200, row, parsed.expires)

    async def serve(self, request: web.Request, check: TempUrlCheck) -> web.StreamResponse:
        row = check.row
        assert row is not None
        if row["sealed_key_id"] is None:
            return await self.backend.serve(request, row, expires=check.expires)
        # Sealed: decrypted here, never sendfile'd or redirected to S3 (either would hand out ciphertext).
        try:
            self.sealing.check_readable(row)
        except errors.SecretUnreadable as exc:
            LOG.error("temp URL download refused container=%s name=%s reason=%s", row["container"], row["name"], exc)
            return web.Response(
                status=500, text="the object cannot be decrypted\n", headers={"Cache-Control": "no-store"}
            )

        async def send_span(response: web.StreamResponse, offset: int, count: int) -> None:
            async for data in self.sealing.read(self.backend, row, offset=offset, length=count):
                await response.write(data)

        return await answer_download(request, ObjectVersion.from_row(row), send_span)

    # -- sweeps -------------------------------------------------------------------------------

    async def sweep_expired(self) -> int:
        """Remove expired rows, then their bytes; returns how many objects went."""
        removed = 0
        while True:
            keys = await self.repo.delete_expired(limit=EXPIRED_BATCH)
            for key in keys:
                await self._remove_bytes(key)
            removed += len(keys)
            if len(keys) < EXPIRED_BATCH:
                break
        if removed:
            LOG.info("expired objects removed count=%d", removed)
        return removed

    async def sweep_orphans(self) -> int:
        """Remove backend bytes no row refers to, older than ``orphan_grace``
        (left by a crash between writing bytes and publishing the row)."""
        # Only keys of the shape this service writes: a bucket or directory shared
        # with anything else never loses that data to the sweep.
        stale = [k for k in await self.backend.stale_keys(time.time() - self.config.orphan_grace) if _KEY.fullmatch(k)]
        removed = 0
        for start in range(0, len(stale), ORPHAN_BATCH):
            batch = stale[start : start + ORPHAN_BATCH]
            referenced = await self.repo.referenced_keys(batch)
            for key in batch:
                if key not in referenced:
                    await self._remove_bytes(key)
                    removed += 1
        if removed:
            LOG.info("orphaned object bytes removed count=%d", removed)
        return removed


def utc_from_unix(value: int) -> datetime.datetime:
    return datetime.datetime.fromtimestamp(value, datetime.UTC)
