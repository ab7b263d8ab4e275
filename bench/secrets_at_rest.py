"""What encryption at rest costs (docs/security.md, "Secrets at rest").

- a node row with a Redfish password, an agent token and an inline config
  drive: sealing it for a write and opening it after a read, against the
  same row with no key (the walk alone), microseconds per row;
- an object of --mib MiB on the filesystem backend: written plain and
  sealed, read whole plain and sealed, and a 512-byte Range read of a
  sealed object, MiB/s and milliseconds.

No database and no service: the same code the repositories and the object
store call, timed in this process. Figures only; nothing passes or fails.

    .venv/bin/python bench/secrets_at_rest.py
    .venv/bin/python bench/secrets_at_rest.py --rows 20000 --mib 256
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
import uuid
from pathlib import Path

from services.common.db.node_secrets import NodeSecrets
from services.common.images.configdrive import build_configdrive, encode_configdrive
from services.common.keyring import Keyring
from services.objectstore.backends import Upload
from services.objectstore.backends.filesystem import FilesystemBackend
from services.objectstore.sealed_objects import ObjectSealing

MiB = 1024 * 1024


def node_row(drive: str) -> dict:
    return {
        "driver_info": {
            "redfish_address": "https://10.0.0.1",
            "redfish_system_id": "/redfish/v1/Systems/1",
            "redfish_username": "admin",
            "redfish_password": "bmc-password",
            "deploy_kernel": "http://images/k",
            "deploy_ramdisk": "http://images/r",
        },
        "driver_internal_info": {"agent_secret_token": "t" * 43, "agent_url": "http://10.0.0.2:9999"},
        "instance_info": {"image_source": "http://images/disk.raw", "configdrive": drive, "root_gb": 10},
    }


def per_row(label: str, rows: int, work) -> float:
    runs = []
    for _ in range(5):
        started = time.perf_counter()
        for _ in range(rows):
            work()
        runs.append((time.perf_counter() - started) / rows * 1e6)
    median = statistics.median(runs)
    print(f"  {label:<48} {median:8.1f} us/row")
    return median


def bench_rows(rows: int) -> None:
    node_uuid = str(uuid.uuid4())
    iso = build_configdrive({"uuid": node_uuid, "name": "n"}, [], {"meta_data": {"hostname": "bench"}})
    drive = encode_configdrive(iso)
    keyed = NodeSecrets(Keyring([("k1", os.urandom(32))]))
    plain = NodeSecrets(Keyring())
    values = node_row(drive)
    sealed = {"uuid": node_uuid, **keyed.seal(node_uuid, values)}
    print(f"node rows (config drive inline: {len(drive)} bytes of base64)")
    per_row("seal for a write, no key (the walk)", rows, lambda: plain.seal(node_uuid, values))
    per_row("seal for a write, with a key", rows, lambda: keyed.seal(node_uuid, values))
    per_row("open after a read, no key (the walk)", rows, lambda: plain.open({"uuid": node_uuid, **values}))
    per_row("open after a read, with a key", rows, lambda: keyed.open(dict(sealed)))
    without_drive = {**values, "instance_info": {"image_source": "http://images/disk.raw"}}
    sealed_small = {"uuid": node_uuid, **keyed.seal(node_uuid, without_drive)}
    per_row("open after a read, with a key, drive uploaded", rows, lambda: keyed.open(dict(sealed_small)))


async def bench_objects(mib: int) -> None:
    data = os.urandom(mib * MiB)
    sealing = ObjectSealing(Keyring([("k1", os.urandom(32))]), containers=("drives",))
    with tempfile.TemporaryDirectory(prefix="ferrum-bench-") as tmp:
        backend = FilesystemBackend(Path(tmp))
        await backend.start()

        async def write(sealed: bool) -> tuple[float, dict]:
            key = uuid.uuid4().hex
            upload: Upload = backend.begin_upload(key)
            key_id = None
            if sealed:
                upload, key_id = sealing.begin(upload, container="drives", name=key)
            started = time.perf_counter()
            for start in range(0, len(data), 4 * MiB):
                await upload.write(data[start : start + 4 * MiB])
            size, digest = await upload.commit()
            elapsed = time.perf_counter() - started
            row = {"container": "drives", "name": key, "size": size, "sha256": digest, "backend_key": key}
            return elapsed, {**row, "sealed_key_id": key_id}

        async def read(row: dict, offset: int, length: int) -> float:
            started = time.perf_counter()
            if row["sealed_key_id"]:
                stream = sealing.read(backend, row, offset=offset, length=length)
            else:
                stream = backend.read(row["backend_key"], offset=offset, length=length, chunk_size=MiB)
            async for _ in stream:
                pass
            return time.perf_counter() - started

        print(f"objects ({mib} MiB, filesystem backend, page cache warm)")
        for sealed in (False, True):
            writes, reads, ranges = [], [], []
            for _ in range(3):
                elapsed, row = await write(sealed)
                writes.append(elapsed)
                reads.append(await read(row, 0, row["size"]))
                ranges.append(await read(row, row["size"] // 2, 512))
            label = "sealed" if sealed else "plain "
            print(
                f"  {label} write {mib / statistics.median(writes):7.0f} MiB/s   read {mib / statistics.median(reads):7.0f} MiB/s"
                f"   512-byte range {statistics.median(ranges) * 1000:6.2f} ms"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=5000)
    parser.add_argument("--mib", type=int, default=64)
    args = parser.parse_args()
    bench_rows(args.rows)
    asyncio.run(bench_objects(args.mib))


if __name__ == "__main__":
    main()
