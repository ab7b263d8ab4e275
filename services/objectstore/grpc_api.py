"""gRPC ObjectStore servicer: translation between protobuf and ObjectStore."""

from __future__ import annotations

import datetime
import logging
import time
from collections.abc import AsyncIterator

import asyncpg
import grpc
from google.protobuf.timestamp_pb2 import Timestamp

from ferrum.v1 import objectstore_pb2 as pb
from ferrum.v1 import objectstore_pb2_grpc as pb_grpc
from services.common import errors
from services.common.db.records import ObjectRecord
from services.common.metrics import ServiceMetrics
from services.objectstore.store import ObjectStore, PutRequest, utc_from_unix

LOG = logging.getLogger(__name__)
# The largest object PutSmall takes in its one message; larger ones go through the Put stream,
# which never holds a whole object in memory. Config drives are far below it (Nova's: ~400 KiB).
SMALL_PUT_LIMIT = 4 * 1024 * 1024


def _timestamp(value: datetime.datetime) -> Timestamp:
    stamp = Timestamp()
    stamp.FromDatetime(value.astimezone(datetime.UTC).replace(tzinfo=None))
    return stamp


def info_message(row: ObjectRecord) -> pb.ObjectInfo:
    message = pb.ObjectInfo(
        container=row["container"],
        name=row["name"],
        size=int(row["size"]),
        sha256=row["sha256"],
        content_type=row["content_type"],
        usage_count=int(row["usage_count"]),
        metadata={str(k): str(v) for k, v in (row["metadata"] or {}).items()},
        created_at=_timestamp(row["created_at"]),
    )
    if row["delete_at"] is not None:
        message.delete_at.CopyFrom(_timestamp(row["delete_at"]))
    return message


def put_request(header: pb.PutHeader) -> PutRequest:
    """What Put's and PutSmall's header asks the store for."""
    return PutRequest(
        container=header.container,
        name=header.name,
        content_type=header.content_type,
        delete_after=header.delete_after,
        metadata=dict(header.metadata),
        usage_count=header.usage_count,
    )


def _code(exc: BaseException | None) -> str:
    if exc is None:
        return "OK"
    if isinstance(exc, errors.FerrumError):
        return exc.grpc_code.name
    if isinstance(exc, (asyncpg.DataError, ValueError, UnicodeError)):
        return "INVALID_ARGUMENT"
    return "INTERNAL" if isinstance(exc, Exception) else "CANCELLED"


class ObjectStoreServicer(pb_grpc.ObjectStoreServicer):
    """The streaming calls record their own metrics (the shared interceptor
    only wraps unary calls) plus the bytes they moved."""

    def __init__(self, store: ObjectStore, metrics: ServiceMetrics) -> None:
        self.store = store
        self.metrics = metrics
        self.bytes = metrics.counter("ferrum_objectstore_bytes_total", "Object bytes moved over gRPC", ("direction",))

    async def _fail(self, context: grpc.aio.ServicerContext, exc: Exception) -> None:
        if isinstance(exc, errors.FerrumError):
            await errors.abort_with(context, exc)
        if isinstance(exc, (asyncpg.DataError, ValueError, UnicodeError)):
            await errors.abort_with(context, errors.InvalidParameterValue(str(exc)))
        LOG.exception("object store call failed")
        await errors.abort_with(context, errors.FerrumError(f"object store failure: {type(exc).__name__}"))

    async def Put(
        self, request_iterator: AsyncIterator[pb.PutRequest], context: grpc.aio.ServicerContext
    ) -> pb.ObjectInfo:
        started, failure = time.perf_counter(), None
        try:
            first = await anext(aiter(request_iterator), None)
            if first is None or first.WhichOneof("part") != "header":
                raise errors.MissingParameter("the first Put message must carry the header")
            header = first.header
            end: list[pb.PutEnd] = []

            async def chunks() -> AsyncIterator[bytes]:
                async for message in request_iterator:
                    part = message.WhichOneof("part")
                    if end or part == "header" or part is None:
                        raise errors.InvalidParameterValue(
                            "a Put stream is one header, chunks, then at most one end message"
                        )
                    if part == "end":
                        end.append(message.end)
                        continue
                    yield message.chunk
                # A client that goes away may also just end the request stream
                # (half-close before the cancel arrives): only the end message
                # tells a complete upload from a cut-short one.
                if not end:
                    raise errors.InvalidParameterValue(
                        "the Put stream ended without its end message (cancelled or cut short); nothing was stored"
                    )

            def expected() -> tuple[int | None, str]:
                return end[0].size, end[0].sha256

            row = await self.store.put(
                put_request(header),
                chunks(),
                expected=expected,
            )
        except BaseException as exc:
            failure = exc
            if isinstance(exc, Exception):  # every failure becomes a gRPC status
                await self._fail(context, exc)
            raise
        finally:
            self.metrics.observe("grpc", "Put", _code(failure), time.perf_counter() - started)
        self.bytes.labels("in").inc(int(row["size"]))
        return info_message(row)

    async def PutSmall(self, request: pb.PutSmallRequest, context: grpc.aio.ServicerContext) -> pb.PutSmallResponse:
        """Put's checks and durability for an object in one message, and its temp URL in the
        reply: one call where a config drive took a stream and a TempUrl call (issue 22)."""
        started, failure = time.perf_counter(), None
        try:
            if not request.HasField("header"):
                raise errors.MissingParameter("PutSmall needs the object's header")
            if len(request.data) > SMALL_PUT_LIMIT:
                raise errors.PayloadTooLarge(
                    f"PutSmall takes at most {SMALL_PUT_LIMIT} bytes ({len(request.data)} sent); use the Put stream"
                )
            self.store.check_lifetime(request.temp_url_lifetime)  # before anything is stored
            header = request.header
            data = request.data

            async def chunks() -> AsyncIterator[bytes]:
                yield data

            row = await self.store.put(
                put_request(header),
                chunks(),
                expected=lambda: (len(data), request.sha256),
                streamed=False,
            )
            reply = pb.PutSmallResponse(info=info_message(row))
            if request.temp_url_lifetime:
                url, expires = self.store.signed_url(row, lifetime=request.temp_url_lifetime)
                reply.temp_url = url
                reply.temp_url_expires_at.CopyFrom(_timestamp(utc_from_unix(expires)))
        except BaseException as exc:
            failure = exc
            if isinstance(exc, Exception):
                await self._fail(context, exc)
            raise
        finally:
            self.metrics.observe("grpc", "PutSmall", _code(failure), time.perf_counter() - started)
        self.bytes.labels("in").inc(int(row["size"]))
        return reply

    async def Get(
        self, request: pb.GetObjectRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.GetObjectChunk]:
        started, failure, sent = time.perf_counter(), None, 0
        try:
            _, chunks = await self.store.open_read(
                request.container, request.name, offset=request.offset, length=request.length
            )
            async for data in chunks:
                sent += len(data)
                yield pb.GetObjectChunk(data=data)
        except BaseException as exc:
            failure = exc
            if isinstance(exc, Exception):
                await self._fail(context, exc)
            raise
        finally:
            self.bytes.labels("out").inc(sent)
            self.metrics.observe("grpc", "Get", _code(failure), time.perf_counter() - started)

    async def Stat(self, request: pb.ObjectRef, context: grpc.aio.ServicerContext) -> pb.ObjectInfo:
        try:
            return info_message(await self.store.stat(request.container, request.name))
        except Exception as exc:
            await self._fail(context, exc)
            raise

    async def List(self, request: pb.ListObjectsRequest, context: grpc.aio.ServicerContext) -> pb.ListObjectsResponse:
        try:
            rows = await self.store.list(request.container, request.prefix)
        except Exception as exc:
            await self._fail(context, exc)
            raise
        return pb.ListObjectsResponse(objects=[info_message(r) for r in rows])

    async def Delete(self, request: pb.ObjectRef, context: grpc.aio.ServicerContext) -> pb.DeleteObjectResponse:
        try:
            await self.store.delete(request.container, request.name)
        except Exception as exc:  # noqa: BLE001
            await self._fail(context, exc)
        return pb.DeleteObjectResponse()

    async def TempUrl(self, request: pb.TempUrlRequest, context: grpc.aio.ServicerContext) -> pb.TempUrlResponse:
        try:
            url, expires = await self.store.temp_url(
                request.container, request.name, method=request.method, lifetime=request.lifetime
            )
        except Exception as exc:
            await self._fail(context, exc)
            raise
        return pb.TempUrlResponse(url=url, expires_at=_timestamp(utc_from_unix(expires)))

    async def UpdateMetadata(
        self, request: pb.UpdateMetadataRequest, context: grpc.aio.ServicerContext
    ) -> pb.ObjectInfo:
        try:
            row = await self.store.update_metadata(
                request.container,
                request.name,
                usage_delta=request.usage_delta,
                expected_usage=request.expected_usage if request.check_usage else None,
                set_metadata=dict(request.set_metadata),
            )
        except Exception as exc:
            await self._fail(context, exc)
            raise
        return info_message(row)

    async def Release(self, request: pb.ObjectRef, context: grpc.aio.ServicerContext) -> pb.ReleaseResponse:
        try:
            count, deleted = await self.store.release(request.container, request.name)
        except Exception as exc:
            await self._fail(context, exc)
            raise
        return pb.ReleaseResponse(usage_count=count, deleted=deleted)
