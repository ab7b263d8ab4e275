"""The object store on the S3 backend: round trips (single put and multipart),
proxied temp-URL downloads with ranges, cancelled multipart uploads (over
gRPC and HTTP PUT) and limits against a real ``moto_server``; presigned temp-URL redirects, their
expiry and tampering against ``s3rver``, which checks signatures."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import sys
import time
import uuid
from pathlib import Path
from urllib.parse import urlsplit

import aioboto3
import aiohttp
import pytest

from services.common import errors
from services.common.objectstore_client import ObjectStoreClient
from services.objectstore.backends.s3 import S3Backend
from services.objectstore.testing import moto_server, running_objectstore, s3rver, wait_until
from tests.conftest import test_settings

MiB = 1024 * 1024
VENV_BIN = Path(sys.executable).parent


@pytest.fixture(scope="module")
def moto_endpoint():
    with moto_server(VENV_BIN) as endpoint:
        yield endpoint


def s3_settings(database_url: str, state: Path, endpoint: str, **extra: object):
    return test_settings(
        database_url,
        state,
        objectstore={
            "backend": "s3",
            "s3_endpoint_url": endpoint,
            "s3_bucket": "ferrum-test",
            "s3_access_key": "testing",
            "s3_secret_key": "testing",
            "s3_part_size": 5 * MiB,
            "max_object_size": 64 * MiB,
            **extra,
        },
    )


@pytest.fixture(scope="module")
async def moto_service(database_url: str, moto_endpoint: str, tmp_path_factory: pytest.TempPathFactory):
    async with running_objectstore(s3_settings(database_url, tmp_path_factory.mktemp("s"), moto_endpoint)) as svc:
        yield svc


@pytest.fixture(scope="module")
async def client(moto_service):
    store = ObjectStoreClient(moto_service.grpc_address, token=moto_service.internal_token)
    yield store
    await store.close()


async def bucket_state(endpoint: str, bucket: str = "ferrum-test") -> tuple[list[str], list[str]]:
    """(object keys, multipart upload keys) straight from the S3 server."""
    session = aioboto3.Session()
    async with session.client(
        "s3",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    ) as s3:
        listed = await s3.list_objects_v2(Bucket=bucket)
        uploads = await s3.list_multipart_uploads(Bucket=bucket)
    return ([o["Key"] for o in listed.get("Contents", ())], [u["Key"] for u in uploads.get("Uploads", ())])


async def test_round_trips_single_and_multipart(client: ObjectStoreClient, moto_endpoint: str) -> None:
    small = os.urandom(1000)
    big = os.urandom(12 * MiB + 5)  # three parts at 5 MiB
    info = await client.put_bytes("s3c", "small.bin", small, metadata={"k": "v"})
    assert info.sha256 == hashlib.sha256(small).hexdigest() and dict(info.metadata) == {"k": "v"}
    info = await client.put_bytes("s3c", "big.iso", big)
    assert info.size == len(big) and info.sha256 == hashlib.sha256(big).hexdigest()
    assert await client.get_bytes("s3c", "small.bin") == small
    assert await client.get_bytes("s3c", "big.iso") == big
    assert await client.get_bytes("s3c", "big.iso", offset=5 * MiB - 3, length=6) == big[5 * MiB - 3 : 5 * MiB + 3]
    assert [o.name for o in await client.list("s3c")] == ["big.iso", "small.bin"]
    keys, uploads = await bucket_state(moto_endpoint)
    assert len(keys) == 2 and uploads == []

    await client.put_bytes("s3c", "big.iso", b"replaced")
    assert await client.get_bytes("s3c", "big.iso") == b"replaced"
    await client.delete("s3c", "small.bin")
    await client.delete("s3c", "big.iso")
    assert await bucket_state(moto_endpoint) == ([], [])
    assert await client.stat("s3c", "big.iso") is None


async def test_proxied_temp_url_download(client: ObjectStoreClient) -> None:
    data = os.urandom(2 * MiB + 1)
    await client.put_bytes("s3c", "boot-1.iso", data, content_type="application/x-iso9660-image")
    url = await client.temp_url("s3c", "boot-1.iso", lifetime=300)
    async with aiohttp.ClientSession() as http:
        async with http.get(url) as resp:
            assert resp.status == 200 and await resp.read() == data
            assert resp.headers["ETag"] == f'"{hashlib.sha256(data).hexdigest()}"'
            assert resp.headers["Content-Length"] == str(len(data)) and resp.headers["Last-Modified"]
        async with http.head(url) as resp:
            assert resp.status == 200 and resp.headers["Content-Length"] == str(len(data))
        async with http.get(url, headers={"Range": "bytes=10-19"}) as resp:
            assert resp.status == 206 and await resp.read() == data[10:20]
            assert resp.headers["Content-Range"] == f"bytes 10-19/{len(data)}"
        async with http.get(url, headers={"Range": "bytes=-7"}) as resp:
            assert resp.status == 206 and await resp.read() == data[-7:]
        async with http.get(url, headers={"Range": f"bytes={len(data) + 5}-"}) as resp:
            assert resp.status == 416
    await client.delete("s3c", "boot-1.iso")


async def test_failed_and_cancelled_multipart_uploads_leave_nothing(
    client: ObjectStoreClient,
    moto_endpoint: str,
    database_url: str,
) -> None:
    with pytest.raises(errors.PayloadTooLarge):
        await client.put_bytes("s3lim", "huge.img", b"x" * (64 * MiB + 1))
    assert await bucket_state(moto_endpoint) == ([], [])

    sent = asyncio.Event()

    async def slow():
        for _ in range(12):
            yield b"y" * MiB  # two 5 MiB parts go up before the upload stalls
        sent.set()
        await asyncio.sleep(3600)
        yield b"never"

    task = asyncio.create_task(client.put_stream("s3lim", "stalled.img", slow()))
    await asyncio.wait_for(sent.wait(), 60)
    await wait_until(lambda: bucket_state(moto_endpoint), timeout=30)  # the server is reachable
    await wait_until(lambda: _has_upload(moto_endpoint), timeout=30)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await wait_until(lambda: _empty(moto_endpoint), timeout=30)
    assert await client.stat("s3lim", "stalled.img") is None


async def test_http_put_upload_multipart_and_cut_short(
    client: ObjectStoreClient, moto_endpoint: str, tmp_path: Path
) -> None:
    """put_file's HTTP PUT path on S3: a multipart upload, and a client that goes
    away mid-body leaves no object and no open multipart upload."""
    data = os.urandom(11 * MiB + 7)  # three parts at 5 MiB
    source = tmp_path / "disk.img"
    source.write_bytes(data)
    info = await client.put_file("s3http", "disk.img", source, metadata={"via": "http"})
    assert info.size == len(data) and info.sha256 == hashlib.sha256(data).hexdigest()
    assert await client.get_bytes("s3http", "disk.img") == data
    await client.delete("s3http", "disk.img")
    assert await _empty(moto_endpoint)

    url = urlsplit(await client.temp_url("s3http", "cut.img", lifetime=60, method="PUT"))
    _reader, writer = await asyncio.open_connection(url.hostname, url.port)
    writer.write(f"PUT {url.path} HTTP/1.1\r\nHost: {url.netloc}\r\nContent-Length: {30 * MiB}\r\n\r\n".encode())
    writer.write(os.urandom(12 * MiB))  # two parts go up before the client vanishes
    await writer.drain()
    await wait_until(lambda: _has_upload(moto_endpoint), timeout=30)
    writer.close()
    await wait_until(lambda: _empty(moto_endpoint), timeout=30)
    assert await client.stat("s3http", "cut.img") is None


class CreateMultipartHold:
    """A TCP relay in front of the S3 server that holds back the answer to a
    CreateMultipartUpload: the request reaches S3, which creates the upload,
    and the answer waits at the relay until ``release()``."""

    def __init__(self, upstream: str) -> None:
        self._upstream = urlsplit(upstream)
        self.answer_waiting = asyncio.Event()
        self._released = asyncio.Event()
        self._server: asyncio.Server | None = None

    async def start(self) -> str:
        self._server = await asyncio.start_server(self._relay, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    def release(self) -> None:
        self._released.set()

    async def close(self) -> None:
        assert self._server is not None
        self._server.close()

    async def _relay(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        upstream_r, upstream_w = await asyncio.open_connection(self._upstream.hostname, self._upstream.port)
        holding = False

        async def requests() -> None:
            nonlocal holding
            while data := await client_r.read(65536):
                if data.startswith(b"POST ") and b"?uploads" in data.split(b"\r\n", 1)[0]:
                    holding = True
                upstream_w.write(data)
                await upstream_w.drain()
            upstream_w.close()

        async def answers() -> None:
            while data := await upstream_r.read(65536):
                if holding:
                    self.answer_waiting.set()
                    await self._released.wait()
                client_w.write(data)
                await client_w.drain()
            client_w.close()

        with contextlib.suppress(OSError):
            await asyncio.gather(requests(), answers())
        client_w.close()
        upstream_w.close()


async def test_upload_cancelled_while_its_multipart_upload_is_created_leaves_none(
    database_url: str, moto_endpoint: str, tmp_path: Path
) -> None:
    """The same class of bug as issue 14 on S3: a cancel that lands while
    CreateMultipartUpload is on its way must not lose the upload id, or
    abort() cannot remove the multipart upload S3 has already made."""
    relay = CreateMultipartHold(moto_endpoint)
    endpoint = await relay.start()
    config = s3_settings(database_url, tmp_path, endpoint, s3_bucket="ferrum-create-cancel").objectstore
    backend = S3Backend(config)
    await backend.start()
    try:
        upload = backend.begin_upload(uuid.uuid4().hex)
        writing = asyncio.create_task(upload.write(b"p" * config.s3_part_size))  # one full part: the upload starts
        await asyncio.wait_for(relay.answer_waiting.wait(), 30)
        assert (await bucket_state(moto_endpoint, "ferrum-create-cancel"))[1]  # S3 made the multipart upload
        writing.cancel()
        with pytest.raises(asyncio.CancelledError):
            await writing
        relay.release()
        await asyncio.wait_for(upload.abort(), 30)
        assert await bucket_state(moto_endpoint, "ferrum-create-cancel") == ([], [])
    finally:
        await backend.close()
        await relay.close()


async def _has_upload(endpoint: str) -> bool:
    return bool((await bucket_state(endpoint))[1])


async def _empty(endpoint: str) -> bool:
    return await bucket_state(endpoint) == ([], [])


@pytest.fixture(scope="module")
def s3rver_endpoint():
    with s3rver() as endpoint:
        yield endpoint


@pytest.mark.parametrize("version", ["s3", "s3v4"])
async def test_presigned_downloads_against_s3rver(
    database_url: str, tmp_path: Path, s3rver_endpoint: str, version: str
) -> None:
    """s3rver verifies V2 query signatures (and the expiry of both versions);
    it accepts any well-formed V4 signature, so tampering is checked on V2."""
    endpoint = s3rver_endpoint
    settings = test_settings(
        database_url,
        tmp_path / "state",
        objectstore={
            "backend": "s3",
            "s3_endpoint_url": endpoint,
            "s3_bucket": f"presigned-{version}",
            "s3_access_key": "S3RVER",
            "s3_secret_key": "S3RVER",
            "download_mode": "presigned",
            "s3_presign_version": version,
        },
    )
    async with running_objectstore(settings) as service, aiohttp.ClientSession() as http:
        store = ObjectStoreClient(service.grpc_address, token=service.internal_token)
        try:
            data = os.urandom(300_000)
            await store.put_bytes("vm", "boot-2.iso", data)
            url = await store.temp_url("vm", "boot-2.iso", lifetime=600)
            async with http.get(url, allow_redirects=False) as resp:
                assert resp.status == 307
                location = resp.headers["Location"]
            assert location.startswith(endpoint)
            async with http.get(location) as resp:
                assert resp.status == 200 and await resp.read() == data
            async with http.get(location, headers={"Range": "bytes=0-9"}) as resp:
                assert resp.status == 206 and await resp.read() == data[:10]
            async with http.get(url) as resp:  # following the redirect
                assert resp.status == 200 and await resp.read() == data
            async with http.head(url, allow_redirects=False) as resp:  # HEAD answered by Ferrum
                assert resp.status == 200 and resp.headers["Content-Length"] == str(len(data))

            if version == "s3":  # a tampered presigned URL is refused by the S3 server itself
                prefix, rest = location.split("Signature=", 1)
                sig, _, tail = rest.partition("&")
                tampered = f"{prefix}Signature={'A' if sig[0] != 'A' else 'B'}{sig[1:]}" + (f"&{tail}" if tail else "")
                async with http.get(tampered) as resp:
                    assert resp.status == 403

            # The presigned URL expires with the temp URL.
            short = await store.temp_url("vm", "boot-2.iso", lifetime=2)
            async with http.get(short, allow_redirects=False) as resp:
                assert resp.status == 307
                short_location = resp.headers["Location"]
            async with http.get(short_location) as resp:
                assert resp.status == 200
            await asyncio.sleep(3.5)
            async with http.get(short_location) as resp:
                assert resp.status == 403
            async with http.get(short, allow_redirects=False) as resp:
                assert resp.status == 401

            # Nor does it outlive the object's delete_at.
            await store.put_bytes("vm", "expiring.img", b"e" * 10, delete_after=2)
            long_url = await store.temp_url("vm", "expiring.img", lifetime=600)
            async with http.get(long_url, allow_redirects=False) as resp:
                assert resp.status == 307
                capped = resp.headers["Location"]
            query = dict(part.split("=", 1) for part in capped.split("?", 1)[1].split("&"))
            if version == "s3v4":
                assert int(query["X-Amz-Expires"]) <= 2
            else:
                assert int(query["Expires"]) <= time.time() + 2
        finally:
            await store.close()


async def test_s3_orphan_sweep(database_url: str, moto_endpoint: str, tmp_path: Path) -> None:
    settings = s3_settings(
        database_url, tmp_path, moto_endpoint, s3_bucket="ferrum-orphans", orphan_grace=0.0, sweep_interval=3600.0
    )
    async with running_objectstore(settings) as service:
        store = ObjectStoreClient(service.grpc_address, token=service.internal_token)
        try:
            await store.put_bytes("orph", "kept.img", b"kept")
            session = aioboto3.Session()
            async with session.client(
                "s3",
                endpoint_url=moto_endpoint,
                region_name="us-east-1",
                aws_access_key_id="testing",
                aws_secret_access_key="testing",
            ) as s3:
                await s3.put_object(Bucket="ferrum-orphans", Key="0123456789abcdef0123456789abcdef", Body=b"stray")
                await s3.put_object(Bucket="ferrum-orphans", Key="someone-elses/file.txt", Body=b"foreign")
                await asyncio.sleep(1.1)  # S3 times have one-second resolution
                assert service.store is not None
                assert await service.store.sweep_orphans() == 1
                keys = [o["Key"] for o in (await s3.list_objects_v2(Bucket="ferrum-orphans"))["Contents"]]
            assert "0123456789abcdef0123456789abcdef" not in keys and "someone-elses/file.txt" in keys
            assert len(keys) == 2 and await store.get_bytes("orph", "kept.img") == b"kept"
        finally:
            await store.close()
