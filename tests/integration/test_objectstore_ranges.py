"""Temp-URL downloads against RFC 9110's Range, If-Range and precondition
rules (issue 16, item 11), on the real service with each backend: the
filesystem, and S3 proxied through the service (a real ``moto_server``),
each with the object stored as sent and encrypted at rest (``+sealed``:
ranges decrypt only the 64 KiB records they cover; SIZE spans two).
What iPXE's ``sanboot`` needs (HEAD for the size, single ranges as 206) is
checked first."""

from __future__ import annotations

import base64
import datetime
import email.utils
import hashlib
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from services.common.objectstore_client import ENCRYPT_AT_REST, ObjectStoreClient
from services.objectstore.backends.byte_ranges import MAX_RANGE_SPECS
from services.objectstore.testing import moto_server, running_objectstore
from tests.conftest import test_settings

SIZE = 100_000
VENV_BIN = Path(sys.executable).parent


@pytest.fixture(scope="module", params=["filesystem", "s3", "filesystem+sealed", "s3+sealed"])
async def service(request: pytest.FixtureRequest, database_url: str, tmp_path_factory: pytest.TempPathFactory):
    backend, _, sealed = request.param.partition("+")
    state = tmp_path_factory.mktemp(backend)
    security = {"secret_key": base64.b64encode(os.urandom(32)).decode()} if sealed else {}
    if backend == "filesystem":
        async with running_objectstore(test_settings(database_url, state, security=security)) as svc:
            yield svc
        return
    with moto_server(VENV_BIN) as endpoint:
        settings = test_settings(
            database_url,
            state,
            objectstore={
                "backend": "s3",
                "s3_endpoint_url": endpoint,
                "s3_bucket": "ferrum-ranges",
                "s3_access_key": "testing",
                "s3_secret_key": "testing",
            },
            security=security,
        )
        async with running_objectstore(settings) as svc:
            yield svc


@pytest.fixture(scope="module")
async def client(service) -> AsyncIterator[ObjectStoreClient]:
    store = ObjectStoreClient(service.grpc_address, token=service.internal_token)
    yield store
    await store.close()


@pytest.fixture(scope="module")
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(auto_decompress=False) as session:
        yield session


@pytest.fixture(scope="module")
def data() -> bytes:
    return os.urandom(SIZE)


@pytest.fixture(scope="module")
async def url(client: ObjectStoreClient, service, data: bytes) -> str:
    sealed = bool(service.settings.security.secret_key)
    container = f"ranges-{service.settings.objectstore.backend}{'-sealed' if sealed else ''}"
    metadata = {ENCRYPT_AT_REST: "true"} if sealed else {}
    await client.put_bytes(container, "boot.iso", data, content_type="application/x-iso9660-image", metadata=metadata)
    key_id = await service.pool.fetchval("SELECT sealed_key_id FROM objects WHERE container = $1", container)
    assert (key_id is not None) == sealed
    return await client.temp_url(container, "boot.iso", lifetime=600)


async def fetch(http: aiohttp.ClientSession, url: str, method: str = "GET", **headers: str):
    """(status, headers, body) with the header names given as keyword arguments (If_Range → If-Range)."""
    sent = {name.replace("_", "-"): value for name, value in headers.items()}
    async with http.request(method, url, headers=sent) as resp:
        return resp.status, resp.headers, await resp.read()


async def test_what_ipxe_sanboot_needs(http, url: str, data: bytes) -> None:
    status, headers, body = await fetch(http, url, "HEAD")
    assert status == 200 and headers["Content-Length"] == str(SIZE) and body == b""
    assert headers["Accept-Ranges"] == "bytes"
    status, headers, body = await fetch(http, url, Range="bytes=512-1023")  # iPXE's http_block_read
    assert status == 206 and body == data[512:1024]
    assert headers["Content-Range"] == f"bytes 512-1023/{SIZE}" and headers["Content-Length"] == "512"
    assert headers["Content-Type"] == "application/x-iso9660-image"


@pytest.mark.parametrize(
    "value,start,end",
    [("bytes=0-0", 0, 1), ("bytes=-10", SIZE - 10, SIZE), ("bytes=99990-", 99990, SIZE), ("BYTES=5-9", 5, 10)],
)
async def test_single_ranges(http, url: str, data: bytes, value: str, start: int, end: int) -> None:
    status, headers, body = await fetch(http, url, Range=value)
    assert status == 206 and body == data[start:end]
    assert headers["Content-Range"] == f"bytes {start}-{end - 1}/{SIZE}"
    status, headers, body = await fetch(http, url, "HEAD", Range=value)  # HEAD: what the GET would answer
    assert status == 206 and headers["Content-Length"] == str(end - start) and body == b""


@pytest.mark.parametrize("value", ["bytes=-0", f"bytes={SIZE}-", f"bytes={SIZE}-{SIZE + 5}, -0"])
async def test_unsatisfiable_ranges_are_416(http, url: str, value: str) -> None:
    status, headers, body = await fetch(http, url, Range=value)
    assert status == 416 and headers["Content-Range"] == f"bytes */{SIZE}" and body == b""


@pytest.mark.parametrize(
    "value",
    [
        "bytes=abc",
        "bytes=5-2",  # last before first: invalid
        "bytes=",
        "bytes=-",
        "bytes=1-2-3",
        "bytes=0x10-20",
        "bytes 0-5",  # no "="
        "pages=1-2",  # a unit this server does not know
        "items=0-5",
        ",,,",
        "bytes=0-1," + ",".join(f"{i * 10}-{i * 10 + 1}" for i in range(1, MAX_RANGE_SPECS + 1)),  # too many
    ],
)
async def test_junk_or_unknown_ranges_are_ignored(http, url: str, data: bytes, value: str) -> None:
    status, headers, body = await fetch(http, url, Range=value)
    assert status == 200 and body == data and "Content-Range" not in headers


async def test_multiple_ranges_are_multipart_byteranges(http, url: str, data: bytes) -> None:
    async with http.get(url, headers={"Range": "bytes=100-199, -50, 10-19"}) as resp:
        assert resp.status == 206
        assert resp.headers["Content-Type"].startswith("multipart/byteranges; boundary=")
        length = int(resp.headers["Content-Length"])
        reader = aiohttp.MultipartReader.from_response(resp)
        parts = []
        while (part := await reader.next()) is not None:
            assert isinstance(part, aiohttp.BodyPartReader)
            parts.append((part.headers["Content-Range"], part.headers["Content-Type"], await part.read()))
    # In order of position, each with its own Content-Range.
    assert parts == [
        (f"bytes 10-19/{SIZE}", "application/x-iso9660-image", data[10:20]),
        (f"bytes 100-199/{SIZE}", "application/x-iso9660-image", data[100:200]),
        (f"bytes {SIZE - 50}-{SIZE - 1}/{SIZE}", "application/x-iso9660-image", data[-50:]),
    ]
    status, headers, body = await fetch(http, url, "HEAD", Range="bytes=100-199, -50, 10-19")
    assert status == 206 and int(headers["Content-Length"]) == length and body == b""
    status, headers, body = await fetch(http, url, Range="bytes=100-199, -50, 10-19")
    assert len(body) == length  # the Content-Length is the body's


@pytest.mark.parametrize(
    "value,start,end",
    [
        ("bytes=0-9,5-14", 0, 15),  # overlapping: merged
        ("bytes=10-19,0-9", 0, 20),  # touching: merged
        (f"bytes=0-4,{SIZE + 10}-", 0, 5),  # one of two satisfiable: a plain 206
        ("bytes=0-,-1", 0, SIZE),  # the whole object, twice
    ],
)
async def test_ranges_that_come_to_one_span_are_a_plain_206(
    http, url: str, data: bytes, value: str, start: int, end: int
) -> None:
    status, headers, body = await fetch(http, url, Range=value)
    assert status == 206 and body == data[start:end]
    assert headers["Content-Range"] == f"bytes {start}-{end - 1}/{SIZE}"


async def test_if_range(http, url: str, data: bytes) -> None:
    _, headers, _ = await fetch(http, url, "HEAD")
    etag, modified = headers["ETag"], headers["Last-Modified"]
    assert etag == f'"{hashlib.sha256(data).hexdigest()}"'
    for validator in (etag, modified):  # still the client's version: the range is served
        status, _, body = await fetch(http, url, Range="bytes=0-9", If_Range=validator)
        assert status == 206 and body == data[:10], validator
    earlier = email.utils.format_datetime(
        email.utils.parsedate_to_datetime(modified) - datetime.timedelta(seconds=1), usegmt=True
    )
    for validator in ('"0123"', f"W/{etag}", earlier, "not a validator"):  # stale or unusable: the whole object
        status, headers, body = await fetch(http, url, Range="bytes=0-9", If_Range=validator)
        assert status == 200 and body == data and "Content-Range" not in headers, validator
    status, _, body = await fetch(http, url, If_Range='"0123"')  # no Range: If-Range is ignored
    assert status == 200 and body == data


async def test_preconditions(http, url: str, data: bytes) -> None:
    _, headers, _ = await fetch(http, url, "HEAD")
    etag, modified = headers["ETag"], headers["Last-Modified"]
    status, headers, body = await fetch(http, url, If_None_Match=f'W/"x", {etag}')
    assert status == 304 and body == b"" and headers["ETag"] == etag
    status, _, body = await fetch(http, url, If_Modified_Since=modified)
    assert status == 304 and body == b""
    status, _, body = await fetch(http, url, If_Match='"other"')
    assert status == 412 and body == b""
    status, _, body = await fetch(http, url, If_Unmodified_Since="Sun, 06 Nov 1994 08:49:37 GMT")
    assert status == 412
    status, _, body = await fetch(http, url, If_Match=etag, Range="bytes=1-2")
    assert status == 206 and body == data[1:3]
    status, _, body = await fetch(http, url, If_None_Match='"other"', If_Modified_Since=modified)
    assert status == 200 and body == data  # If-Modified-Since counts only without If-None-Match


async def test_empty_object(client: ObjectStoreClient, service, http) -> None:
    container = f"ranges-{service.settings.objectstore.backend}"
    await client.put_bytes(container, "empty.img", b"")
    url = await client.temp_url(container, "empty.img", lifetime=600)
    status, headers, body = await fetch(http, url)
    assert status == 200 and body == b"" and headers["Content-Length"] == "0"
    status, headers, _ = await fetch(http, url, Range="bytes=0-")
    assert status == 416 and headers["Content-Range"] == "bytes */0"
    status, _, body = await fetch(http, url, Range="bytes=-5")  # satisfiable, but no byte to name
    assert status == 200 and body == b""
