"""Objects encrypted at rest on the S3 backend (a real ``moto_server``): the
bucket holds ciphertext, temp URLs answer the plaintext (proxied even in
``presigned`` mode, which would hand out ciphertext), gRPC Get reads any
range, HTTP PUT uploads are sealed too, and rotation re-encrypts in the
bucket. (Ranges against RFC 9110 on sealed objects: test_objectstore_ranges.py.)"""

from __future__ import annotations

import base64
import hashlib
import os
import sys
from pathlib import Path

import aioboto3
import aiohttp
import pytest

from services.common.keyring import Keyring
from services.common.objectstore_client import ENCRYPT_AT_REST, ObjectStoreClient
from services.objectstore.reseal import reseal_objects
from services.objectstore.sealed_objects import RECORD_BYTES, ObjectSealing
from services.objectstore.testing import moto_server, running_objectstore
from tests.conftest import test_settings

VENV_BIN = Path(sys.executable).parent
KEY_1, KEY_2 = os.urandom(32), os.urandom(32)
BUCKET = "ferrum-sealed"
DRIVES = "ironic_configdrive_container"


@pytest.fixture(scope="module")
def moto_endpoint():
    with moto_server(VENV_BIN) as endpoint:
        yield endpoint


@pytest.fixture(scope="module")
async def service(database_url: str, moto_endpoint: str, tmp_path_factory: pytest.TempPathFactory):
    settings = test_settings(
        database_url,
        tmp_path_factory.mktemp("s3sealed"),
        objectstore={
            "backend": "s3",
            "s3_endpoint_url": moto_endpoint,
            "s3_bucket": BUCKET,
            "s3_access_key": "testing",
            "s3_secret_key": "testing",
            "s3_part_size": 5 * 1024 * 1024,
            "download_mode": "presigned",
        },
        security={"secret_key": base64.b64encode(KEY_1).decode()},
    )
    async with running_objectstore(settings) as svc:
        yield svc


@pytest.fixture(scope="module")
async def client(service):
    store = ObjectStoreClient(service.grpc_address, token=service.internal_token)
    yield store
    await store.close()


async def bucket_bytes(endpoint: str, key: str) -> bytes:
    session = aioboto3.Session()
    async with session.client(
        "s3",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    ) as s3:
        reply = await s3.get_object(Bucket=BUCKET, Key=key)
        return await reply["Body"].read()


async def test_a_config_drive_is_ciphertext_in_the_bucket_and_plaintext_to_its_reader(
    service, client: ObjectStoreClient, moto_endpoint: str
) -> None:
    drive = os.urandom(12 * 1024 * 1024 + 5)  # multipart in the bucket, 193 records
    info = await client.put_bytes(DRIVES, "configdrive-n1", drive)
    assert info.sha256 == hashlib.sha256(drive).hexdigest() and info.size == len(drive)
    row = await service.pool.fetchrow("SELECT backend_key, sealed_key_id FROM objects WHERE name = 'configdrive-n1'")
    raw = await bucket_bytes(moto_endpoint, row["backend_key"])
    assert row["sealed_key_id"] is not None and raw.startswith(b"FRMSEAL1") and drive[:4096] not in raw

    url = await client.temp_url(DRIVES, "configdrive-n1", lifetime=600)
    async with aiohttp.ClientSession() as http:
        async with http.get(url, allow_redirects=False) as resp:  # presigned mode, yet no redirect to ciphertext
            assert resp.status == 200 and await resp.read() == drive
        edge = f"bytes={RECORD_BYTES - 3}-{RECORD_BYTES + 2}"
        async with http.get(url, headers={"Range": edge}, allow_redirects=False) as resp:
            assert resp.status == 206 and await resp.read() == drive[RECORD_BYTES - 3 : RECORD_BYTES + 3]
    middle = await client.get_bytes(DRIVES, "configdrive-n1", offset=5_000_000, length=3 * RECORD_BYTES)
    assert middle == drive[5_000_000 : 5_000_000 + 3 * RECORD_BYTES]


async def test_plain_objects_keep_the_presigned_redirect(client: ObjectStoreClient) -> None:
    await client.put_bytes("images", "kernel", b"not a secret")
    url = await client.temp_url("images", "kernel", lifetime=600)
    async with aiohttp.ClientSession() as http, http.get(url, allow_redirects=False) as resp:
        assert resp.status == 307


async def test_http_put_uploads_asking_for_it_are_sealed(service, client: ObjectStoreClient, tmp_path: Path) -> None:
    path = tmp_path / "user-data"
    path.write_bytes(b"#cloud-config\npassword: hunter2\n" * 1000)
    await client.put_file("userdata", "u1", path, metadata={ENCRYPT_AT_REST: "true"}, via="http")
    row = await service.pool.fetchrow("SELECT sealed_key_id FROM objects WHERE container = 'userdata'")
    assert row["sealed_key_id"] is not None
    assert await client.get_bytes("userdata", "u1") == path.read_bytes()


async def test_rotation_re_encrypts_in_the_bucket(service, client: ObjectStoreClient, moto_endpoint: str) -> None:
    drive = await client.get_bytes(DRIVES, "configdrive-n1")
    store = service.store
    rotated = ObjectSealing(
        Keyring([("k2", KEY_2), *[(i, KEY_1) for i in store.sealing.keyring.ids]]), containers=(DRIVES,)
    )
    assert await reseal_objects(store.repo, store.backend, rotated, batch_size=1) == 2  # the drive and the user data
    assert await reseal_objects(store.repo, store.backend, rotated) == 0
    row = dict(await service.pool.fetchrow("SELECT * FROM objects WHERE name = 'configdrive-n1'"))
    assert row["sealed_key_id"] == "k2" and (await bucket_bytes(moto_endpoint, row["backend_key"]))[9:11] == b"k2"
    only_k2 = ObjectSealing(Keyring([("k2", KEY_2)]), containers=(DRIVES,))
    assert b"".join([c async for c in only_k2.read(store.backend, row, offset=0, length=row["size"])]) == drive
