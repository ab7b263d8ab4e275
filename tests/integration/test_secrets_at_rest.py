"""Secrets at rest end to end (issue 16): a live stack with a key file, the
machine simulator, real PostgreSQL and the object store on the filesystem.

A Redfish node deployed over REST with a config drive: PostgreSQL holds no
BMC password, agent token or config drive in the clear (checked with SQL),
the object store's file is not the ISO, and yet the conductor powers the
machine with the password and the agent writes the very ISO. Then a value
copied to another node does not decrypt, ``ferrum db rotate-key`` moves
everything to a second key so the first can go, a missing key fails clearly,
and a deployment that had no key gets encrypted by the same command."""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import hashlib
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from services.common import errors
from services.common.db.node_secrets import NodeSecrets
from services.common.db.nodes import NodeRepository
from services.common.db.objects import ObjectRepository
from services.common.images.configdrive import build_configdrive, encode_configdrive
from services.common.keyring import Keyring
from services.common.sealed_values import PREFIX
from services.demo_image import build_demo_image
from services.objectstore.backends.filesystem import FilesystemBackend
from services.objectstore.sealed_objects import ObjectSealing
from services.rotate_key import rotate
from services.runtime import ALL_SERVICES_ORDER, RunningStack
from services.simulator.options import SimulatorOptions
from services.simulator.service import Simulator
from tests.conftest import test_settings
from tests.restclient import call, wait_state

USER, PASSWORD = "admin", "bmc-Pa55word-at-rest"
KEY_1, KEY_2 = os.urandom(32), os.urandom(32)
CONTAINER = "ironic_configdrive_container"


def write_keys(path: Path, *keys: tuple[str, bytes]) -> None:
    path.write_text("".join(f"{key_id}:{base64.b64encode(key).decode()}\n" for key_id, key in keys))
    path.chmod(0o600)


@pytest.fixture(scope="module")
async def env(database_url: str, tmp_path_factory: pytest.TempPathFactory) -> Any:
    tmp = tmp_path_factory.mktemp("atrest")
    key_file = tmp / "secret.keys"
    write_keys(key_file, ("k1", KEY_1))
    settings = test_settings(
        database_url,
        tmp / "state",
        # Every drive goes to the object store here (a small one would stay inline), so the
        # deploy below shows both: the inline string the verb writes, then the sealed upload.
        conductor={"hostname": "atrest-conductor", "deploy_callback_timeout": 60.0, "configdrive_upload_threshold": 0},
        security={"secret_key_file": str(key_file)},
    )
    stack = RunningStack()
    await stack.start(settings, list(ALL_SERVICES_ORDER))
    simulator = Simulator(
        SimulatorOptions(
            machines=1,
            state_dir=str(tmp / "machines"),
            boot_url=stack.endpoints["ipxe HTTP"],
            username=USER,
            password=PASSWORD,
            disk_size=64 * 1024 * 1024,
        ).validate()
    )
    await simulator.start()
    session = aiohttp.ClientSession()
    try:
        yield {
            "stack": stack,
            "sim": simulator,
            "api": stack.endpoints["api REST (Ironic v1)"],
            "session": session,
            "settings": settings,
            "key_file": key_file,
            "pool": stack.pool,
            "objects_root": tmp / "state" / "objects",
            "state": {},
            "tmp": tmp,
        }
    finally:
        await session.close()
        await stack.close()
        await simulator.stop()


def objectstore_client(env: dict[str, Any]) -> Any:
    return next(s for s in env["stack"].services if s.name == "conductor").objectstore


async def enroll(env: dict[str, Any], name: str, password: str, system: str, kernel: str) -> dict[str, Any]:
    _, node = await call(
        env,
        "POST",
        "/v1/nodes",
        {
            "name": name,
            "driver": "redfish",
            "boot_interface": "ipxe",
            "deploy_interface": "direct",
            "driver_info": {
                "redfish_address": env["sim"].redfish_url,
                "redfish_system_id": system,
                "redfish_username": USER,
                "redfish_password": password,
                "deploy_kernel": kernel,
                "deploy_ramdisk": kernel,
            },
        },
        expect=201,
    )
    return node


async def watch_sealed_columns(pool: Any, node_uuid: str, seen: dict[str, set[str]], stop: asyncio.Event) -> None:
    """What SQL shows of the agent token and the config drive while the deploy runs."""
    while not stop.is_set():
        row = await pool.fetchrow(
            "SELECT driver_internal_info->>'agent_secret_token' AS token, instance_info->>'configdrive' AS drive "
            "FROM nodes WHERE uuid = $1::uuid",
            node_uuid,
        )
        for key in ("token", "drive"):
            if row[key] is not None:
                seen[key].add(row[key])
        await asyncio.sleep(0.02)


async def test_deploy_over_rest_keeps_every_secret_encrypted_at_rest(env: dict[str, Any]) -> None:
    store, machine, pool = objectstore_client(env), env["sim"].machines[0], env["pool"]
    image = build_demo_image(env["tmp"] / "images", size_mib=16, marker="at rest")
    await store.put_file("images", "disk.raw", image.path)
    image_url = await store.temp_url("images", "disk.raw", lifetime=600)
    node = await enroll(env, machine.name, PASSWORD, machine.system_path, image_url)
    env["state"]["node"] = node
    assert node["driver_info"]["redfish_password"] == "******"  # the api masks as before

    # In PostgreSQL: no password, only ciphertext under key k1.
    stored = await pool.fetchrow(
        "SELECT driver_info, driver_info::text AS text FROM nodes WHERE uuid = $1::uuid", node["uuid"]
    )
    assert PASSWORD not in stored["text"]
    assert stored["driver_info"]["redfish_password"].startswith(f"{PREFIX}k1:")
    assert stored["driver_info"]["redfish_username"] == USER  # not a secret: as sent

    await call(env, "POST", "/v1/ports", {"node_uuid": node["uuid"], "address": machine.macs[0]}, expect=201)
    await call(
        env,
        "PATCH",
        f"/v1/nodes/{node['uuid']}",
        [
            {"op": "add", "path": "/instance_info/image_source", "value": image_url},
            {"op": "add", "path": "/instance_info/image_os_hash_algo", "value": "sha256"},
            {"op": "add", "path": "/instance_info/image_os_hash_value", "value": image.sha256},
        ],
        expect=200,
    )
    for verb, state in (("manage", "manageable"), ("provide", "available")):
        await call(env, "PUT", f"/v1/nodes/{node['uuid']}/states/provision", {"target": verb}, expect=202)
        await wait_state(env, node["uuid"], state)

    iso = build_configdrive(
        {"uuid": node["uuid"], "name": machine.name}, [], {"meta_data": {"hostname": "sealed.example"}}
    )
    env["state"]["iso"] = iso
    seen: dict[str, set[str]] = {"token": set(), "drive": set()}
    stop = asyncio.Event()
    watcher = asyncio.create_task(watch_sealed_columns(pool, node["uuid"], seen, stop))
    try:
        await call(
            env,
            "PUT",
            f"/v1/nodes/{node['uuid']}/states/provision",
            {"target": "active", "configdrive": encode_configdrive(iso)},
            expect=202,
        )
        active = await wait_state(env, node["uuid"], "active", timeout=180)
    finally:
        stop.set()
        await watcher
    # The conductor read the password (Redfish powered the machine on) and the token (heartbeats were accepted).
    assert active["power_state"] == "power on" and active["last_error"] is None and machine.power_state == "On"
    assert seen["token"] and all(v.startswith(f"{PREFIX}k1:") for v in seen["token"])
    assert seen["drive"] and all(v.startswith(f"{PREFIX}k1:") for v in seen["drive"])  # inline drive, then its URL

    # The agent got the plaintext ISO: the machine's OS read its hostname, and the disk holds the ISO byte for byte.
    deadline = time.monotonic() + 60
    while machine.os_report is None:
        assert time.monotonic() < deadline, "the machine did not boot its disk"
        await asyncio.sleep(0.1)
    assert machine.os_report["config_drive"]["meta_data"]["hostname"] == "sealed.example"
    assert iso in Path(machine.disk_path).read_bytes()

    # The object store keeps the drive sealed: its file is not the ISO, its row keeps the ISO's sha256.
    row = await pool.fetchrow("SELECT * FROM objects WHERE container = $1", CONTAINER)
    assert row["sealed_key_id"] == "k1" and row["sha256"] == hashlib.sha256(iso).hexdigest()
    raw = (env["objects_root"] / "data" / row["backend_key"][:2] / row["backend_key"]).read_bytes()
    assert raw.startswith(b"FRMSEAL1") and iso[32768:33000] not in raw and b"sealed.example" not in raw

    # Its temp URL answers the ISO itself, whole and by range.
    url = await store.temp_url(CONTAINER, f"configdrive-{node['uuid']}", lifetime=600)
    async with env["session"].get(url) as resp:
        assert resp.status == 200 and await resp.read() == iso
    async with env["session"].get(url, headers={"Range": "bytes=32768-32773,-100"}) as resp:
        assert resp.status == 206
        body = await resp.read()
    assert iso[32768:32774] in body and iso[-100:] in body


async def test_a_password_copied_to_another_node_does_not_decrypt(env: dict[str, Any]) -> None:
    first = env["state"]["node"]
    second = await enroll(env, "copy-target", "other-password", "/redfish/v1/Systems/none", "http://k")
    await env["pool"].execute(
        "UPDATE nodes SET driver_info = jsonb_set(driver_info, '{redfish_password}', "
        " (SELECT driver_info->'redfish_password' FROM nodes WHERE uuid = $1::uuid)) WHERE uuid = $2::uuid",
        first["uuid"],
        second["uuid"],
    )
    status, body = await call(env, "GET", f"/v1/nodes/{second['uuid']}")
    assert status == 500 and "copied from another node or field" in body["error_message"]
    _, fine = await call(env, "GET", f"/v1/nodes/{first['uuid']}", expect=200)  # the original still reads
    assert fine["driver_info"]["redfish_password"] == "******"
    await env["pool"].execute("DELETE FROM nodes WHERE uuid = $1::uuid", second["uuid"])


def run_rotate_key(env: dict[str, Any]) -> str:
    """``ferrum db rotate-key`` as an operator runs it, against the stack's database and object store."""
    settings = env["settings"]
    environ = {k: v for k, v in os.environ.items() if not k.startswith("FERRUM_")}
    environ["FERRUM_SECURITY_SECRET_KEY_FILE"] = str(env["key_file"])
    environ["PYTHONPATH"] = str(Path(__file__).resolve().parents[2])
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "services.cli",
            "db",
            "rotate-key",
            "--database-url",
            settings.database.url,
            "--state-dir",
            settings.state_dir,
            "--batch-size",
            "1",
        ],
        env=environ,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


async def test_rotate_key_then_the_old_key_can_go(env: dict[str, Any]) -> None:
    node, iso, pool = env["state"]["node"], env["state"]["iso"], env["pool"]
    old_object = await pool.fetchrow("SELECT backend_key FROM objects WHERE container = $1", CONTAINER)
    write_keys(env["key_file"], ("k2", KEY_2), ("k1", KEY_1))  # the new key first, the old one still readable
    output = run_rotate_key(env)
    assert "under key 'k2': re-encrypted 1 node(s) and 1 object(s)" in output
    assert "re-encrypted 0 node(s) and 0 object(s)" in run_rotate_key(env)  # idempotent

    stored = await pool.fetchval(
        "SELECT driver_info->>'redfish_password' FROM nodes WHERE uuid = $1::uuid", node["uuid"]
    )
    assert stored.startswith(f"{PREFIX}k2:")
    row = dict(await pool.fetchrow("SELECT * FROM objects WHERE container = $1", CONTAINER))
    assert row["sealed_key_id"] == "k2" and row["backend_key"] != old_object["backend_key"]
    assert not (env["objects_root"] / "data" / old_object["backend_key"][:2] / old_object["backend_key"]).exists()

    # k1 leaves the file: everything still reads with k2 alone.
    write_keys(env["key_file"], ("k2", KEY_2))
    only_k2 = Keyring.from_config(env["settings"].security)
    assert only_k2.ids == ("k2",)
    again = await NodeRepository(pool, secrets=NodeSecrets(only_k2)).get(node["uuid"])
    assert again["driver_info"]["redfish_password"] == PASSWORD
    backend = FilesystemBackend(env["objects_root"])
    sealing = ObjectSealing(only_k2, containers=(CONTAINER,))
    assert b"".join([c async for c in sealing.read(backend, row, offset=0, length=row["size"])]) == iso

    # The running services still hold only k1: they refuse clearly instead of answering garbage.
    status, body = await call(env, "GET", f"/v1/nodes/{node['uuid']}")
    assert status == 500 and "key 'k2', which is not configured" in body["error_message"]
    url = await objectstore_client(env).temp_url(CONTAINER, row["name"], lifetime=60)
    async with env["session"].get(url) as resp:
        assert resp.status == 500 and "cannot be decrypted" in await resp.text()
    with pytest.raises(errors.SecretUnreadable, match="does not decrypt with key 'k2'"):
        await NodeRepository(pool, secrets=NodeSecrets(Keyring([("k2", KEY_1)]))).get(node["uuid"])


async def test_a_deployment_without_a_key_gets_encrypted_by_rotate_key(env: dict[str, Any], tmp_path: Path) -> None:
    pool = env["pool"]
    plain = NodeRepository(pool, secrets=NodeSecrets(Keyring()))
    node = await plain.create(
        {"driver": "fake-hardware", "provision_state": "enroll", "driver_info": {"ipmi_password": "plain-old"}}
    )
    assert (
        await pool.fetchval("SELECT driver_info->>'ipmi_password' FROM nodes WHERE id = $1", node["id"]) == "plain-old"
    )
    backend = FilesystemBackend(tmp_path / "objects")
    await backend.start()
    upload = backend.begin_upload("a" * 32)
    await upload.write(b"old config drive")
    size, digest = await upload.commit()
    repo = ObjectRepository(pool)
    await repo.upsert(
        {
            "container": CONTAINER,
            "name": "configdrive-legacy",
            "content_type": "application/octet-stream",
            "backend_key": "a" * 32,
            "usage_count": 0,
            "metadata": {},
            "size": size,
            "sha256": digest,
        },
        delete_after=0,
        max_container_size=10**9,
    )
    keys = tmp_path / "keys"
    write_keys(keys, ("k3", os.urandom(32)))
    settings = dataclasses.replace(
        env["settings"],
        security=dataclasses.replace(env["settings"].security, secret_key_file=str(keys)),
        objectstore=dataclasses.replace(env["settings"].objectstore, root=str(tmp_path / "objects")),
    )
    # Only what this test made is plain; the deploy's values are under k2 and k2 is not in this keyring,
    # so take them out of the way first.
    await pool.execute("DELETE FROM nodes WHERE id <> $1", node["id"])
    await pool.execute("DELETE FROM objects WHERE name <> 'configdrive-legacy'")
    report = await rotate(pool, settings)
    assert (report.key_id, report.nodes_rewritten, report.objects_rewritten) == ("k3", 1, 1)
    assert (
        await pool.fetchval("SELECT driver_info->>'ipmi_password' FROM nodes WHERE id = $1", node["id"])
    ).startswith(f"{PREFIX}k3:")
    row = dict(await pool.fetchrow("SELECT * FROM objects WHERE name = 'configdrive-legacy'"))
    assert row["sealed_key_id"] == "k3" and b"old config drive" not in backend.path(row["backend_key"]).read_bytes()
    ring = Keyring.from_config(settings.security)
    assert (await NodeRepository(pool, secrets=NodeSecrets(ring)).get(node["uuid"]))["driver_info"] == {
        "ipmi_password": "plain-old"
    }
    sealing = ObjectSealing(ring, containers=(CONTAINER,))
    assert b"".join([c async for c in sealing.read(backend, row, offset=4, length=6)]) == b"config"
