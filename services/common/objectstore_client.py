"""Async client of the object store's gRPC API, for the conductor and tools.

Failures arrive as the FerrumError the server raised (``ObjectNotFound``,
``InvalidParameterValue``, ``PayloadTooLarge``, ``InvalidState`` for a lost
compare-and-set ...), or ``ServiceUnavailable`` when the store cannot be
reached. Uploads stream in 1 MiB messages, so no caller needs a whole object
in memory; ``put_file`` sends the file as one HTTP PUT to a signed upload URL
instead (sendfile, no copy through Python), which is about twice as fast.
"""

from __future__ import annotations

import asyncio
import builtins
import dataclasses
import datetime
import json
import logging
import types
from collections.abc import AsyncIterator, Iterable, Mapping
from pathlib import Path
from typing import Any

import grpc

from ferrum.v1 import objectstore_pb2 as pb
from ferrum.v1 import objectstore_pb2_grpc as pb_grpc
from services.common import errors, objectstore_upload_client
from services.common.endpoints import Endpoints
from services.common.grpcserver import client_channel
from services.common.tls import TlsFiles

LOG = logging.getLogger(__name__)
CHUNK_SIZE = 1024 * 1024
UPLOAD_URL_LIFETIME = 300  # only needs to outlive the start of the request
MAX_METADATA_HEADER = 8000  # larger metadata goes over gRPC (HTTP servers bound header sizes)
SMALL_PUT_LIMIT = 4 * 1024 * 1024  # objects up to this size go in one PutSmall message (the server's limit)
ENCRYPT_AT_REST = "encrypt-at-rest"
"""Metadata key: ``"true"`` asks the store to encrypt the object at rest when it has a key
(services/objectstore/sealed_objects.py); the config drive container is always encrypted."""
_CODE_ERRORS: dict[grpc.StatusCode, type[errors.FerrumError]] = {
    grpc.StatusCode.NOT_FOUND: errors.ObjectNotFound,
    grpc.StatusCode.INVALID_ARGUMENT: errors.InvalidParameterValue,
    grpc.StatusCode.FAILED_PRECONDITION: errors.InvalidState,
    grpc.StatusCode.UNAVAILABLE: errors.ServiceUnavailable,
    grpc.StatusCode.DEADLINE_EXCEEDED: errors.ServiceUnavailable,
}


@dataclasses.dataclass(frozen=True)
class ObjectInfo:
    container: str
    name: str
    size: int
    sha256: str
    content_type: str
    created_at: datetime.datetime
    delete_at: datetime.datetime | None
    usage_count: int
    metadata: Mapping[str, str]

    @classmethod
    def from_message(cls, message: pb.ObjectInfo) -> ObjectInfo:
        return cls(
            container=message.container,
            name=message.name,
            size=message.size,
            sha256=message.sha256,
            content_type=message.content_type,
            created_at=message.created_at.ToDatetime(tzinfo=datetime.UTC),
            delete_at=message.delete_at.ToDatetime(tzinfo=datetime.UTC) if message.HasField("delete_at") else None,
            usage_count=message.usage_count,
            metadata=types.MappingProxyType(dict(message.metadata)),
        )

    @classmethod
    def from_json(cls, value: Mapping[str, Any]) -> ObjectInfo:
        """The body of an HTTP upload's 201 answer."""
        delete_at = value.get("delete_at")
        return cls(
            container=value["container"],
            name=value["name"],
            size=int(value["size"]),
            sha256=value["sha256"],
            content_type=value["content_type"],
            created_at=datetime.datetime.fromisoformat(value["created_at"]),
            delete_at=datetime.datetime.fromisoformat(delete_at) if delete_at else None,
            usage_count=int(value["usage_count"]),
            metadata=types.MappingProxyType(dict(value.get("metadata") or {})),
        )


def _error(exc: grpc.aio.AioRpcError) -> errors.FerrumError:
    """The server's FerrumError (named in trailing metadata), else one by status code."""
    for key, value in exc.trailing_metadata() or ():
        if key == errors.ERROR_METADATA_KEY:
            name = value if isinstance(value, str) else value.decode()
            return errors.error_class(name)(exc.details() or name)
    cls = _CODE_ERRORS.get(exc.code(), errors.FerrumError)
    return cls(f"object store call failed: {exc.code().name}: {exc.details()}")


async def _file_chunks(path: Path) -> AsyncIterator[bytes]:
    handle = await asyncio.to_thread(open, path, "rb")
    try:
        while True:
            data = await asyncio.to_thread(handle.read, CHUNK_SIZE)
            if not data:
                return
            yield data
    finally:
        await asyncio.to_thread(handle.close)


async def _byte_chunks(data: bytes) -> AsyncIterator[bytes]:
    view = memoryview(data)
    for start in range(0, len(view), CHUNK_SIZE):
        yield bytes(view[start : start + CHUNK_SIZE])


class _ForeignAnswer(Exception):
    """An HTTP answer that did not come from the object store (a proxy's 405, say)."""


def _upload_result(reply: objectstore_upload_client.HttpReply) -> ObjectInfo:
    """The ObjectInfo of a 201, else the FerrumError the server named."""
    try:
        body = json.loads(reply.body or b"{}")
    except ValueError:
        body = {}
    if reply.status == 201 and isinstance(body, dict) and "sha256" in body:
        return ObjectInfo.from_json(body)
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict) and "name" in error:
        raise errors.error_class(str(error["name"]))(str(error.get("message")))
    raise _ForeignAnswer(f"HTTP {reply.status} without an object store answer")


class ObjectStoreClient:
    """One channel to one object store; cheap to keep, close it when done."""

    def __init__(
        self, address: str, *, token: str = "", tls: TlsFiles | None = None, endpoints: Endpoints | None = None
    ) -> None:
        self.address = address
        # The object store of this process, when it is one: unary calls go to it directly.
        self._endpoints = endpoints
        self._token = token
        self._tls = tls
        self._channel: grpc.aio.Channel | None = None
        self._stub: pb_grpc.ObjectStoreAsyncStub | None = None

    def present_token(self, token: str) -> None:
        """The internal token to call with (known only once the caller has its database)."""
        if self._stub is not None:
            raise RuntimeError("the token must be set before the first call")
        self._token = token

    def _api(self) -> pb_grpc.ObjectStoreAsyncStub:
        if self._stub is None:
            self._channel = client_channel(self.address, token=self._token, tls=self._tls)
            self._stub = pb_grpc.ObjectStoreStub(self._channel)
        return self._stub

    async def _unary(self, method: str, request: Any, timeout: float | None) -> Any:
        """One unary call: in-process when the object store runs here, else over gRPC."""
        local = self._endpoints.local(self.address, method) if self._endpoints is not None else None
        if local is not None:
            return await local.call(method, request, timeout=timeout)
        return await getattr(self._api(), method)(request, timeout=timeout)

    async def _call(self, method: str, request: Any, timeout: float | None = 60.0) -> Any:
        try:
            return await self._unary(method, request, timeout)
        except grpc.aio.AioRpcError as exc:
            raise _error(exc) from None

    async def put_stream(
        self,
        container: str,
        name: str,
        chunks: AsyncIterator[bytes] | Iterable[bytes],
        *,
        delete_after: int = 0,
        content_type: str = "application/octet-stream",
        metadata: Mapping[str, str] | None = None,
        usage_count: int = 0,
        sha256: str = "",
    ) -> ObjectInfo:
        """Upload from an async (or plain) iterator of byte chunks of any size.
        ``sha256``, when given, must match what the server computes, else nothing is stored."""
        header = pb.PutHeader(
            container=container,
            name=name,
            content_type=content_type,
            delete_after=delete_after,
            metadata=dict(metadata or {}),
            usage_count=usage_count,
        )

        async def requests() -> AsyncIterator[pb.PutRequest]:
            sent = 0
            yield pb.PutRequest(header=header)
            if isinstance(chunks, AsyncIterator):
                async for chunk in chunks:
                    sent += len(chunk)
                    for start in range(0, len(chunk), CHUNK_SIZE):
                        yield pb.PutRequest(chunk=bytes(chunk[start : start + CHUNK_SIZE]))
            else:
                for chunk in chunks:
                    sent += len(chunk)
                    for start in range(0, len(chunk), CHUNK_SIZE):
                        yield pb.PutRequest(chunk=bytes(chunk[start : start + CHUNK_SIZE]))
            # The end marker: the server publishes only a stream that reached it.
            yield pb.PutRequest(end=pb.PutEnd(size=sent, sha256=sha256))

        try:
            reply = await self._api().Put(requests())
        except grpc.aio.AioRpcError as exc:
            raise _error(exc) from None
        return ObjectInfo.from_message(reply)

    async def put_small(
        self,
        container: str,
        name: str,
        data: bytes,
        *,
        delete_after: int = 0,
        content_type: str = "application/octet-stream",
        metadata: Mapping[str, str] | None = None,
        usage_count: int = 0,
        temp_url_lifetime: int = 0,
        sha256: str = "",
    ) -> tuple[ObjectInfo, str]:
        """Store up to ``SMALL_PUT_LIMIT`` bytes in one call, with a GET temp URL for them
        when ``temp_url_lifetime`` is set ("" otherwise). ``sha256``, when given, must match
        the bytes, else nothing is stored. An object store without PutSmall gets the Put
        stream and a TempUrl call instead."""
        request = pb.PutSmallRequest(
            header=pb.PutHeader(
                container=container,
                name=name,
                content_type=content_type,
                delete_after=delete_after,
                metadata=dict(metadata or {}),
                usage_count=usage_count,
            ),
            data=bytes(data),
            sha256=sha256,
            temp_url_lifetime=temp_url_lifetime,
        )
        try:
            reply = await self._unary("PutSmall", request, 60.0)
        except grpc.aio.AioRpcError as exc:
            if exc.code() != grpc.StatusCode.UNIMPLEMENTED:
                raise _error(exc) from None
            info = await self.put_stream(
                container,
                name,
                _byte_chunks(data),
                delete_after=delete_after,
                content_type=content_type,
                metadata=metadata,
                usage_count=usage_count,
                sha256=sha256,
            )
            url = await self.temp_url(container, name, lifetime=temp_url_lifetime) if temp_url_lifetime else ""
            return info, url
        return ObjectInfo.from_message(reply.info), str(reply.temp_url)

    async def put_bytes(
        self,
        container: str,
        name: str,
        data: bytes,
        *,
        delete_after: int = 0,
        content_type: str = "application/octet-stream",
        metadata: Mapping[str, str] | None = None,
        usage_count: int = 0,
    ) -> ObjectInfo:
        if len(data) <= SMALL_PUT_LIMIT:
            info, _ = await self.put_small(
                container,
                name,
                data,
                delete_after=delete_after,
                content_type=content_type,
                metadata=metadata,
                usage_count=usage_count,
            )
            return info
        return await self.put_stream(
            container,
            name,
            _byte_chunks(data),
            delete_after=delete_after,
            content_type=content_type,
            metadata=metadata,
            usage_count=usage_count,
        )

    async def put_file(
        self,
        container: str,
        name: str,
        path: str | Path,
        *,
        delete_after: int = 0,
        content_type: str = "application/octet-stream",
        metadata: Mapping[str, str] | None = None,
        usage_count: int = 0,
        sha256: str = "",
        via: str = "http",
    ) -> ObjectInfo:
        """Upload a file.

        ``via="http"`` (the default) asks for a signed upload URL and sends the
        file as one HTTP PUT with sendfile(2); ``via="grpc"`` streams it over
        the gRPC ``Put`` in 1 MiB messages. HTTP falls back to gRPC when the
        metadata is too large for a header, the HTTP port cannot be reached
        (a ``public_url`` this host cannot resolve, say), or something other
        than the object store answers there (a proxy that refuses PUT). ``sha256``, when
        given, must match what the server computes, else nothing is stored.
        """
        encoded = json.dumps(dict(metadata or {}), separators=(",", ":"))
        if via not in ("http", "grpc"):
            raise errors.InvalidParameterValue(f"via must be 'http' or 'grpc', not {via!r}")
        if via == "http" and len(encoded) <= MAX_METADATA_HEADER:
            url = await self.temp_url(container, name, lifetime=UPLOAD_URL_LIFETIME, method="PUT")
            headers = {
                "Content-Type": content_type,
                "X-Delete-After": str(delete_after),
                "X-Object-Usage-Count": str(usage_count),
                "X-Object-Metadata": encoded,
            }
            if sha256:
                headers["X-Object-Sha256"] = sha256
            try:
                return _upload_result(await objectstore_upload_client.put_file(url, Path(path), headers))
            except objectstore_upload_client.UploadConnectError as exc:
                LOG.warning("object store HTTP upload port unreachable (%s); uploading over gRPC instead", exc)
            except _ForeignAnswer as exc:
                LOG.warning(
                    "object store upload URL %s answered %s (a proxy in the way?); uploading over gRPC instead",
                    url.split("/u/")[0],
                    exc,
                )
            except OSError as exc:
                raise errors.ServiceUnavailable(f"object store upload of {container}/{name} failed: {exc}") from exc
        return await self.put_stream(
            container,
            name,
            _file_chunks(Path(path)),
            delete_after=delete_after,
            content_type=content_type,
            metadata=metadata,
            usage_count=usage_count,
            sha256=sha256,
        )

    async def get_stream(self, container: str, name: str, *, offset: int = 0, length: int = 0) -> AsyncIterator[bytes]:
        """The object's bytes [offset, offset+length) (length 0 = to the end), chunk by chunk."""
        call = self._api().Get(pb.GetObjectRequest(container=container, name=name, offset=offset, length=length))
        try:
            async for message in call:
                yield message.data
        except grpc.aio.AioRpcError as exc:
            raise _error(exc) from None
        finally:
            call.cancel()

    async def get_bytes(self, container: str, name: str, *, offset: int = 0, length: int = 0) -> bytes:
        parts = [data async for data in self.get_stream(container, name, offset=offset, length=length)]
        return b"".join(parts)

    async def stat(self, container: str, name: str) -> ObjectInfo | None:
        try:
            reply = await self._call("Stat", pb.ObjectRef(container=container, name=name))
        except errors.NotFound:
            return None
        return ObjectInfo.from_message(reply)

    async def list(self, container: str, prefix: str = "") -> builtins.list[ObjectInfo]:
        reply = await self._call("List", pb.ListObjectsRequest(container=container, prefix=prefix))
        return [ObjectInfo.from_message(m) for m in reply.objects]

    async def temp_url(self, container: str, name: str, *, lifetime: int, method: str = "GET") -> str:
        reply = await self._call(
            "TempUrl", pb.TempUrlRequest(container=container, name=name, method=method, lifetime=lifetime)
        )
        return str(reply.url)

    async def delete(self, container: str, name: str, *, missing_ok: bool = True) -> None:
        try:
            await self._call("Delete", pb.ObjectRef(container=container, name=name))
        except errors.NotFound:
            if not missing_ok:
                raise

    async def update_metadata(
        self,
        container: str,
        name: str,
        *,
        usage_delta: int = 0,
        expected_usage: int | None = None,
        set_metadata: Mapping[str, str] | None = None,
    ) -> ObjectInfo:
        """Atomically add ``usage_delta`` (compare-and-set when ``expected_usage`` is
        given: InvalidState if it no longer matches) and merge ``set_metadata``
        (an empty value removes that key)."""
        request = pb.UpdateMetadataRequest(
            container=container,
            name=name,
            usage_delta=usage_delta,
            set_metadata=dict(set_metadata or {}),
            check_usage=expected_usage is not None,
            expected_usage=expected_usage or 0,
        )
        return ObjectInfo.from_message(await self._call("UpdateMetadata", request))

    async def release(self, container: str, name: str) -> tuple[int, bool]:
        """Decrement usage_count, deleting the object at zero: (new count, deleted)."""
        reply = await self._call("Release", pb.ObjectRef(container=container, name=name))
        return int(reply.usage_count), bool(reply.deleted)

    async def close(self) -> None:
        if self._channel is not None:
            await self._channel.close()
        self._channel = None
        self._stub = None
