"""Objects in an S3 bucket through aioboto3.

Uploads up to one part size go up with one PutObject; larger ones use a
multipart upload, one part in flight while the next is received, aborted on
any failure or cancellation so no partial object remains. Temp-URL downloads
are either proxied (streamed through this service with ranged GetObjects;
``download_response`` handles preconditions and ranges) or answered with a
307 redirect to an S3 presigned URL that expires with the temp URL
(``download_mode = presigned``); HEAD is always answered here from the
metadata, because a presigned URL is valid for one method only.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import logging
import re
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from typing import Any

import aioboto3
from aiohttp import web
from botocore.config import Config as BotoConfig
from botocore.exceptions import ClientError

from services.common import errors
from services.common.config import ObjectStoreConfig
from services.common.db.records import ObjectRecord
from services.objectstore.backends.base import HashingPipeline
from services.objectstore.backends.download_response import ObjectVersion, answer_download

LOG = logging.getLogger(__name__)
PROXY_CHUNK = 1024 * 1024


def _missing(exc: ClientError) -> bool:
    code = str(exc.response.get("Error", {}).get("Code", ""))
    return code in ("404", "NoSuchKey", "NoSuchBucket", "NotFound")


class S3Upload:
    def __init__(self, backend: S3Backend, key: str) -> None:
        self._backend = backend
        self._key = key
        self._part_size = backend.part_size
        self._buffer = bytearray()
        # The worker thread only hashes; the buffer is touched on the event loop only.
        self._pipeline = HashingPipeline(None)
        self._upload_id: str | None = None
        self._creating: asyncio.Future[Any] | None = None
        self._parts: list[dict[str, Any]] = []
        self._inflight: asyncio.Task[None] | None = None
        self._done = False
        self._finishing = False

    async def _upload_part(self, number: int, body: bytes) -> None:
        reply = await self._backend.client.upload_part(
            Bucket=self._backend.bucket,
            Key=self._backend.full_key(self._key),
            UploadId=self._upload_id,
            PartNumber=number,
            Body=body,
        )
        self._parts.append({"PartNumber": number, "ETag": reply["ETag"]})

    async def _start_part(self, body: bytes) -> None:
        if self._inflight is not None:
            await asyncio.shield(self._inflight)  # cleared only once done, so abort() still sees it
            self._inflight = None
        if self._upload_id is None:
            self._upload_id = await self._create_multipart()
        number = len(self._parts) + 1
        self._inflight = asyncio.create_task(self._upload_part(number, body))

    async def _create_multipart(self) -> str:
        """The upload id. The creation runs to its end even if the caller is
        cancelled meanwhile, and abort() waits for it: S3 may have created the
        upload already, and only its id lets abort() remove it."""
        if self._creating is None:
            self._creating = asyncio.ensure_future(
                self._backend.client.create_multipart_upload(
                    Bucket=self._backend.bucket, Key=self._backend.full_key(self._key)
                )
            )
        reply = await asyncio.shield(self._creating)
        return str(reply["UploadId"])

    async def _flush_full_parts(self) -> None:
        while len(self._buffer) >= self._part_size:
            body = bytes(self._buffer[: self._part_size])
            del self._buffer[: self._part_size]
            await self._start_part(body)

    async def write(self, chunk: bytes) -> None:
        await self._pipeline.write(chunk)
        self._buffer += chunk
        await self._flush_full_parts()

    async def commit(self) -> tuple[int, str]:
        digest = await self._pipeline.finish()
        await self._flush_full_parts()
        client, bucket, key = self._backend.client, self._backend.bucket, self._backend.full_key(self._key)
        self._finishing = True  # from here a cancel may leave a complete object behind: abort() deletes it
        if self._upload_id is None:
            await client.put_object(Bucket=bucket, Key=key, Body=bytes(self._buffer))
        else:
            if self._buffer:
                await self._start_part(bytes(self._buffer))
            if self._inflight is not None:
                await asyncio.shield(self._inflight)
                self._inflight = None
            parts = sorted(self._parts, key=lambda p: p["PartNumber"])
            await client.complete_multipart_upload(
                Bucket=bucket, Key=key, UploadId=self._upload_id, MultipartUpload={"Parts": parts}
            )
        self._buffer.clear()
        self._done = True
        return self._pipeline.size, digest

    async def abort(self) -> None:
        if self._done:
            return
        self._done = True
        await self._pipeline.drain()
        self._buffer.clear()
        if self._inflight is not None:
            self._inflight.cancel()
            with contextlib.suppress(BaseException):
                await self._inflight
        if self._upload_id is None and self._creating is not None:
            with contextlib.suppress(Exception):  # a failed creation left nothing to abort
                self._upload_id = str((await self._creating)["UploadId"])
        if self._upload_id is not None:
            try:
                await self._backend.client.abort_multipart_upload(
                    Bucket=self._backend.bucket, Key=self._backend.full_key(self._key), UploadId=self._upload_id
                )
            except ClientError as exc:
                LOG.warning("aborting multipart upload failed key=%s error=%s", self._key, exc)
        if self._finishing:
            await self._backend.delete(self._key)


class S3Backend:
    name = "s3"

    def __init__(self, config: ObjectStoreConfig) -> None:
        self.bucket = config.s3_bucket
        self.prefix = config.s3_prefix
        self.part_size = config.s3_part_size
        self.presigned = config.download_mode == "presigned"
        self._config = config
        self._stack = AsyncExitStack()
        self.client: Any = None
        self._presigner: Any = None

    def full_key(self, key: str) -> str:
        return f"{self.prefix}{key}"

    async def start(self) -> None:
        c = self._config
        session = aioboto3.Session()

        def client(signature_version: str) -> Any:
            return session.client(
                "s3",
                endpoint_url=c.s3_endpoint_url or None,
                region_name=c.s3_region or None,
                aws_access_key_id=c.s3_access_key or None,
                aws_secret_access_key=c.s3_secret_key or None,
                config=BotoConfig(
                    signature_version=signature_version,
                    s3={"addressing_style": "path"},
                    retries={"max_attempts": 3, "mode": "standard"},
                ),
            )

        self.client = await self._stack.enter_async_context(client("s3v4"))
        # Presigned URLs may need another signature version (V2 query strings for old gateways).
        self._presigner = (
            self.client
            if c.s3_presign_version == "s3v4"
            else await self._stack.enter_async_context(client(c.s3_presign_version))
        )
        try:
            await self.client.head_bucket(Bucket=self.bucket)
        except ClientError as exc:
            if not _missing(exc):
                raise
            extra = (
                {}
                if c.s3_region in ("", "us-east-1")
                else {"CreateBucketConfiguration": {"LocationConstraint": c.s3_region}}
            )
            await self.client.create_bucket(Bucket=self.bucket, **extra)
            LOG.info("created bucket bucket=%s endpoint=%s", self.bucket, c.s3_endpoint_url or "aws")

    async def close(self) -> None:
        await self._stack.aclose()
        self.client = None

    def begin_upload(self, key: str) -> S3Upload:
        return S3Upload(self, key)

    async def _get(self, key: str, offset: int, length: int) -> Any:
        kwargs: dict[str, Any] = {"Bucket": self.bucket, "Key": self.full_key(key)}
        if length > 0:
            kwargs["Range"] = f"bytes={offset}-{offset + length - 1}"
        try:
            return await self.client.get_object(**kwargs)
        except ClientError as exc:
            if _missing(exc):
                raise errors.ObjectNotFound("object bytes are gone (deleted or replaced meanwhile)") from None
            raise

    async def read(self, key: str, *, offset: int, length: int, chunk_size: int) -> AsyncIterator[bytes]:
        if length <= 0:
            return
        reply = await self._get(key, offset, length)
        body = reply["Body"]
        try:
            async for data in body.iter_chunks(chunk_size):
                yield data
        finally:
            with contextlib.suppress(Exception):
                body.close()

    async def delete(self, key: str) -> None:
        try:
            await self.client.delete_object(Bucket=self.bucket, Key=self.full_key(key))
        except ClientError as exc:
            if not _missing(exc):
                raise

    async def stale_keys(self, older_than: float) -> list[str]:
        cutoff = datetime.datetime.fromtimestamp(older_than, datetime.UTC)
        found: list[str] = []
        paginator = self.client.get_paginator("list_objects_v2")
        async for page in paginator.paginate(Bucket=self.bucket, Prefix=self.prefix):
            for item in page.get("Contents", ()):
                if item["LastModified"] < cutoff:
                    found.append(item["Key"][len(self.prefix) :])
        try:
            uploads = await self.client.list_multipart_uploads(Bucket=self.bucket, Prefix=self.prefix)
        except ClientError as exc:  # e.g. s3rver: NotImplemented
            LOG.debug("cannot list multipart uploads bucket=%s error=%s", self.bucket, exc)
            return found
        for upload in uploads.get("Uploads", ()):
            ours = re.fullmatch(r"[0-9a-f]{32}", upload["Key"][len(self.prefix) :]) is not None
            if ours and upload["Initiated"] < cutoff:
                with contextlib.suppress(ClientError):
                    await self.client.abort_multipart_upload(
                        Bucket=self.bucket, Key=upload["Key"], UploadId=upload["UploadId"]
                    )
        return found

    async def presigned_url(self, key: str, *, lifetime: int) -> str:
        return await self._presigner.generate_presigned_url(
            "get_object", Params={"Bucket": self.bucket, "Key": self.full_key(key)}, ExpiresIn=max(lifetime, 1)
        )

    async def serve(self, request: web.Request, obj: ObjectRecord, *, expires: int) -> web.StreamResponse:
        if self.presigned and request.method == "GET":
            # The presigned URL dies with the temp URL or the object, whichever goes first.
            until = float(expires)
            if obj["delete_at"] is not None:
                until = min(until, obj["delete_at"].timestamp())
            remaining = int(until - datetime.datetime.now(datetime.UTC).timestamp())
            location = await self.presigned_url(obj["backend_key"], lifetime=remaining)
            return web.Response(status=307, headers={"Location": location, "Cache-Control": "no-store"})

        async def send_span(response: web.StreamResponse, offset: int, count: int) -> None:
            async for data in self.read(obj["backend_key"], offset=offset, length=count, chunk_size=PROXY_CHUNK):
                await response.write(data)

        return await answer_download(request, ObjectVersion.from_row(obj), send_span)
