"""HTTP PUT uploads to signed upload URLs, on a real object store service
(filesystem backend) over real sockets: the fast front door (Content-Length
bodies), the aiohttp route (chunked bodies), keep-alive and pipelining next
to downloads on one connection, refusals, limits, cancelled and stalled
uploads, and put_file's fallback to gRPC."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
from collections.abc import AsyncIterator
from pathlib import Path
from urllib.parse import urlsplit

import aiohttp
import aiohttp.web
import pytest

from services.common import errors
from services.common.objectstore_client import ObjectStoreClient
from services.common.ports import unused_tcp_port
from services.objectstore import upload_front_door
from services.objectstore.tempurl import to_base36
from services.objectstore.testing import running_objectstore, wait_until
from tests.conftest import test_settings

MiB = 1024 * 1024


def files_under(path: Path) -> list[Path]:
    return sorted(p for p in path.rglob("*") if p.is_file())


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("objects")


@pytest.fixture(scope="module")
async def service(database_url: str, root: Path, tmp_path_factory: pytest.TempPathFactory):
    settings = test_settings(
        database_url,
        tmp_path_factory.mktemp("state"),
        objectstore={"root": str(root), "max_object_size": 10 * MiB, "max_container_size": 14 * MiB},
    )
    async with running_objectstore(settings) as svc:
        yield svc


@pytest.fixture(scope="module")
async def client(service):
    store = ObjectStoreClient(service.grpc_address, token=service.internal_token)
    yield store
    await store.close()


@pytest.fixture(scope="module")
async def http():
    async with aiohttp.ClientSession(auto_decompress=False) as session:
        yield session


def read_replies(raw: bytes) -> list[tuple[int, dict[str, str], bytes]]:
    """Split raw HTTP/1.1 replies (each with a Content-Length) into (status, headers, body)."""
    replies = []
    while raw:
        head, _, rest = raw.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
        length = int(headers.get("content-length", "0"))
        replies.append((int(lines[0].split()[1]), headers, rest[:length]))
        raw = rest[length:]
    return replies


async def exchange(url: str, *parts: bytes, pause: float = 0.0) -> bytes:
    """Send ``parts`` on one connection (pausing between them), then read until the server closes."""
    split = urlsplit(url)
    reader, writer = await asyncio.open_connection(split.hostname, split.port)
    try:
        for part in parts:
            writer.write(part)
            await writer.drain()
            if pause:
                await asyncio.sleep(pause)
        return await asyncio.wait_for(reader.read(), 20)
    finally:
        writer.close()


def put_head(url: str, length: int, *extra: str, connection: str = "keep-alive") -> bytes:
    split = urlsplit(url)
    lines = [
        f"PUT {split.path} HTTP/1.1",
        f"Host: {split.netloc}",
        f"Content-Length: {length}",
        f"Connection: {connection}",
        *extra,
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


async def test_put_file_round_trip_over_http(client: ObjectStoreClient, service, http, tmp_path: Path) -> None:
    data = os.urandom(6 * MiB + 123)  # more than one 4 MiB receive buffer
    source = tmp_path / "disk.img"
    source.write_bytes(data)
    digest = hashlib.sha256(data).hexdigest()
    info = await client.put_file(
        "up",
        "images/disk.img",
        source,
        content_type="application/x-raw-disk-image",
        metadata={"Node": "n-1", "ünïcode": "välue"},
        delete_after=3600,
        usage_count=2,
        sha256=digest,
    )
    assert info.size == len(data) and info.sha256 == digest and info.usage_count == 2
    assert dict(info.metadata) == {"Node": "n-1", "ünïcode": "välue"}
    assert info.content_type == "application/x-raw-disk-image" and info.delete_at is not None
    stat = await client.stat("up", "images/disk.img")
    assert stat == info
    assert await client.get_bytes("up", "images/disk.img") == data

    # It went over HTTP, not gRPC: the front door's route counted it.
    async with http.get(f"{service.http_url}/metrics") as resp:
        text = await resp.text()
    assert 'method="PUT /u/{token}/{container}/{name}",protocol="http",service="objectstore"} 1.0' in text
    assert 'method="Put",protocol="grpc"' not in text

    # An empty file, and replacing an object, work the same way.
    empty = tmp_path / "empty"
    empty.write_bytes(b"")
    info = await client.put_file("up", "images/disk.img", empty)
    assert info.size == 0 and info.sha256 == hashlib.sha256(b"").hexdigest()
    assert await client.get_bytes("up", "images/disk.img") == b""
    await client.delete("up", "images/disk.img")


async def test_wrong_sha256_or_bad_headers_store_nothing(client: ObjectStoreClient, root: Path, tmp_path: Path) -> None:
    source = tmp_path / "x.bin"
    source.write_bytes(os.urandom(MiB))
    before = files_under(root)
    with pytest.raises(errors.InvalidParameterValue, match="sha256 mismatch"):
        await client.put_file("bad", "x.bin", source, sha256="0" * 64)
    with pytest.raises(errors.InvalidParameterValue, match="sha256 mismatch"):
        await client.put_file("bad", "x.bin", source, sha256="0" * 64, via="grpc")
    url = await client.temp_url("bad", "x.bin", lifetime=60, method="PUT")
    for header, fragment in (
        ("X-Delete-After: soon", b"X-Delete-After"),
        ("X-Object-Metadata: [1, 2]", b"X-Object-Metadata"),
        ("X-Object-Sha256: abc", b"X-Object-Sha256"),
        ("Content-Type: nonsense", b"MIME type"),
        ("X-Object-Usage-Count: -1", b"X-Object-Usage-Count"),
    ):
        [(status, _headers, body)] = read_replies(await exchange(url, put_head(url, 5, header) + b"hello"))
        assert status == 400 and fragment in body, (header, body)
        assert json.loads(body)["error"]["name"] == "InvalidParameterValue"
    assert await client.stat("bad", "x.bin") is None
    assert files_under(root) == before


async def test_refusals_reveal_nothing_and_store_nothing(client: ObjectStoreClient, service, http, root: Path) -> None:
    url = await client.temp_url("refuse", "boot.iso", lifetime=600, method="PUT")
    assert url.startswith(service.public_url + "/u/") and url.endswith("/refuse/boot.iso")
    base, rest = url.split("/u/", 1)
    token, tail = rest.split("/", 1)
    expires, sig = token.split(".")
    flipped = ("A" if sig[0] != "A" else "B") + sig[1:]
    before = files_under(root)
    for bad, status in (
        (f"{base}/u/{expires}.{flipped}/{tail}", 403),  # tampered signature
        (f"{base}/u/{token}/refuse/other.iso", 403),  # another name
        (f"{base}/u/{token}/other/boot.iso", 403),  # another container
        (f"{base}/u/{to_base36(int(expires, 36) + 1)}.{sig}/{tail}", 403),  # another expiry
        (f"{base}/u/garbage/{tail}", 404),
    ):
        async with http.put(bad, data=b"payload") as resp:
            assert resp.status == status, bad
            assert json.loads(await resp.read())["error"]["message"] in ("temp URL signature invalid", "not found")
    # An upload URL does not download, and a download URL does not upload.
    async with http.get(url) as resp:
        assert resp.status == 405
    await client.put_bytes("refuse", "there.iso", b"bytes")
    download = await client.temp_url("refuse", "there.iso", lifetime=600)
    async with http.put(download, data=b"overwrite") as resp:
        assert resp.status == 405
    assert await client.get_bytes("refuse", "there.iso") == b"bytes"

    short = await client.temp_url("refuse", "late.iso", lifetime=1, method="PUT")
    await asyncio.sleep(2.1)
    async with http.put(short, data=b"late") as resp:
        assert resp.status == 401 and json.loads(await resp.read())["error"]["name"] == "Unauthorized"
    assert await client.stat("refuse", "late.iso") is None and await client.stat("refuse", "boot.iso") is None
    assert len(files_under(root)) == len(before) + 1  # there.iso only
    await client.delete("refuse", "there.iso")
    with pytest.raises(errors.InvalidParameterValue):
        await client.temp_url("refuse", "../escape", lifetime=60, method="PUT")


async def test_limits_answer_413_before_or_during_the_body(
    client: ObjectStoreClient, root: Path, tmp_path: Path
) -> None:
    before = files_under(root)
    url = await client.temp_url("lim", "huge.iso", lifetime=60, method="PUT")
    # Over the object limit: refused from the head alone, no 100 Continue, no body read.
    raw = await exchange(url, put_head(url, 11 * MiB, "Expect: 100-continue"))
    [(status, headers, body)] = read_replies(raw)
    assert status == 413 and json.loads(body)["error"]["name"] == "PayloadTooLarge"
    assert headers["connection"] == "close"

    # Over the container limit (14 MiB): found while receiving; the client still reads the answer.
    first = tmp_path / "first"
    first.write_bytes(os.urandom(9 * MiB))
    await client.put_file("lim", "first.iso", first)
    with pytest.raises(errors.PayloadTooLarge, match="container"):
        await client.put_file("lim", "second.iso", first)
    assert [o.name for o in await client.list("lim")] == ["first.iso"]
    await client.delete("lim", "first.iso")
    await wait_until(lambda: files_under(root) == before, timeout=5)


async def test_cancelled_or_stalled_upload_leaves_nothing(
    client: ObjectStoreClient, root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = files_under(root)
    url = await client.temp_url("cut", "half.iso", lifetime=60, method="PUT")
    split = urlsplit(url)
    reader, writer = await asyncio.open_connection(split.hostname, split.port)
    writer.write(put_head(url, 8 * MiB) + os.urandom(5 * MiB))
    await writer.drain()
    await wait_until(lambda: len(files_under(root / "tmp")) == 1, timeout=5)  # the upload is under way
    writer.close()
    await wait_until(lambda: files_under(root) == before, timeout=10)
    assert await client.stat("cut", "half.iso") is None

    # A client that stops sending is cut off after the stall timeout.
    monkeypatch.setattr(upload_front_door, "BODY_STALL_TIMEOUT", 1.0)
    reader, writer = await asyncio.open_connection(split.hostname, split.port)
    writer.write(put_head(url, 8 * MiB) + os.urandom(MiB))
    await writer.drain()
    try:
        answer = await asyncio.wait_for(reader.read(), 10)
    except ConnectionResetError:
        answer = b""
    assert answer == b""  # closed without an answer
    writer.close()
    await wait_until(lambda: files_under(root) == before, timeout=10)
    assert await client.stat("cut", "half.iso") is None


async def test_keep_alive_put_then_get_and_pipelining(client: ObjectStoreClient, service) -> None:
    url = await client.temp_url("ka", "a.img", lifetime=60, method="PUT")
    data = os.urandom(300_000)
    split = urlsplit(url)
    # Two fast PUTs, the second pipelined behind the first body, on one connection.
    url_b = await client.temp_url("ka", "b.img", lifetime=60, method="PUT")
    raw = await exchange(url, put_head(url, len(data)) + data + put_head(url_b, 3, connection="close") + b"abc")
    replies = read_replies(raw)
    assert [r[0] for r in replies] == [201, 201]
    assert json.loads(replies[0][2])["sha256"] == hashlib.sha256(data).hexdigest()
    assert replies[0][1]["connection"] == "keep-alive" and replies[1][1]["connection"] == "close"
    assert await client.get_bytes("ka", "b.img") == b"abc"
    # Both requests in the first read: the second head comes with the first body.
    raw = await exchange(url, put_head(url, 3) + b"xyz" + put_head(url_b, 3, connection="close") + b"uvw")
    assert [r[0] for r in read_replies(raw)] == [201, 201]
    assert await client.get_bytes("ka", "a.img") == b"xyz" and await client.get_bytes("ka", "b.img") == b"uvw"

    # A fast PUT, then a download on the same connection: aiohttp takes it over.
    download = urlsplit(await client.temp_url("ka", "b.img", lifetime=60))
    get = f"GET {download.path} HTTP/1.1\r\nHost: {split.netloc}\r\nConnection: close\r\n\r\n".encode()
    raw = await exchange(url, put_head(url, 4) + b"four", get, pause=0.2)
    replies = read_replies(raw)
    assert [r[0] for r in replies] == [201, 200] and replies[1][2] == b"uvw"
    assert await client.get_bytes("ka", "a.img") == b"four"


async def test_expect_continue_and_chunked_bodies(client: ObjectStoreClient, http) -> None:
    url = await client.temp_url("ex", "c.img", lifetime=60, method="PUT")
    split = urlsplit(url)
    reader, writer = await asyncio.open_connection(split.hostname, split.port)
    writer.write(put_head(url, 5, "Expect: 100-continue", connection="close"))
    await writer.drain()
    assert await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5) == b"HTTP/1.1 100 Continue\r\n\r\n"
    writer.write(b"hello")
    [(status, _, body)] = read_replies(await asyncio.wait_for(reader.read(), 10))
    writer.close()
    assert status == 201 and json.loads(body)["size"] == 5

    # Chunked (no Content-Length) goes through aiohttp's route, with the same outcome.
    pieces = [os.urandom(100_000) for _ in range(7)]

    async def chunked() -> AsyncIterator[bytes]:
        for piece in pieces:
            yield piece

    async with http.put(url, data=chunked(), headers={"X-Object-Metadata": '{"via": "chunked"}'}) as resp:
        assert resp.status == 201, await resp.text()
        answer = await resp.json()
    assert answer["sha256"] == hashlib.sha256(b"".join(pieces)).hexdigest() and answer["metadata"] == {"via": "chunked"}
    assert await client.get_bytes("ex", "c.img") == b"".join(pieces)


async def test_bad_request_heads(client: ObjectStoreClient, service) -> None:
    url = await client.temp_url("heads", "h.img", lifetime=60, method="PUT")
    split = urlsplit(url)
    no_length = f"PUT {split.path} HTTP/1.1\r\nHost: x\r\n\r\n".encode()
    [(status, _, _)] = read_replies(await exchange(url, no_length))
    assert status == 411
    [(status, _, _)] = read_replies(await exchange(url, put_head(url, 1, "X-Big: " + "a" * 70_000)))
    assert status == 431
    [(status, _, _)] = read_replies(await exchange(url, b"PUT /u/\x01 HTTP/1.1\r\nHost: x\r\n\r\n"))
    assert status == 400
    assert await client.stat("heads", "h.img") is None


@pytest.mark.parametrize("public", ["closed port", "proxy refusing PUT"])
async def test_put_file_falls_back_to_grpc_when_http_uploads_cannot_work(
    database_url: str, tmp_path_factory: pytest.TempPathFactory, tmp_path: Path, public: str
) -> None:
    async def refuse(request: aiohttp.web.Request) -> aiohttp.web.Response:
        await request.read()
        return aiohttp.web.Response(status=405, text="<html>405 Not Allowed</html>")

    proxy = aiohttp.web.Application()
    proxy.router.add_route("*", "/{tail:.*}", refuse)
    runner = aiohttp.web.AppRunner(proxy)
    await runner.setup()
    port = unused_tcp_port()
    if public == "proxy refusing PUT":
        await aiohttp.web.TCPSite(runner, "127.0.0.1", port).start()
    settings = test_settings(
        database_url,
        tmp_path_factory.mktemp("state"),
        objectstore={"root": str(tmp_path_factory.mktemp("fallback")), "public_url": f"http://127.0.0.1:{port}"},
    )
    source = tmp_path / "f.bin"
    source.write_bytes(os.urandom(MiB + 1))
    try:
        async with running_objectstore(settings) as svc:
            store = ObjectStoreClient(svc.grpc_address, token=svc.internal_token)
            try:
                info = await store.put_file("fb", "f.bin", source)
                assert info.size == MiB + 1
                assert await store.get_bytes("fb", "f.bin") == source.read_bytes()
            finally:
                await store.close()
    finally:
        await runner.cleanup()


async def test_stopping_the_service_mid_upload_leaves_nothing(
    database_url: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    root = tmp_path_factory.mktemp("stopping")
    settings = test_settings(database_url, tmp_path_factory.mktemp("state"), objectstore={"root": str(root)})
    async with running_objectstore(settings) as svc:
        store = ObjectStoreClient(svc.grpc_address, token=svc.internal_token)
        try:
            url = await store.temp_url("stop", "mid.iso", lifetime=60, method="PUT")
        finally:
            await store.close()
        split = urlsplit(url)
        reader, writer = await asyncio.open_connection(split.hostname, split.port)
        writer.write(put_head(url, 20 * MiB) + os.urandom(6 * MiB))
        await writer.drain()
        await wait_until(lambda: len(files_under(root / "tmp")) == 1, timeout=5)
    # The service has stopped with the upload half done.
    assert files_under(root) == []
    with contextlib.suppress(ConnectionResetError):
        assert await asyncio.wait_for(reader.read(), 5) == b""
    writer.close()
    async with running_objectstore(settings) as svc:
        store = ObjectStoreClient(svc.grpc_address, token=svc.internal_token)
        try:
            assert await store.stat("stop", "mid.iso") is None
        finally:
            await store.close()
