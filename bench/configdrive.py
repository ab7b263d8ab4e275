"""Config drive build time: Ferrum's pycdlib builder against genisoimage on the same files.

Two inputs: a dict with 1 MiB of user data, and one whose drive is about
60 MiB when every file is stored (user data of ~29 MiB, present in both
``openstack/2012-08-10`` and ``openstack/latest``). For each, the very same
file tree is also laid on disk once and ``genisoimage`` is run on it with
openstacksdk's arguments (CONTRACT 3.3) — the baseline Ironic uses. Ferrum is
timed from the dict to ISO bytes in memory (JSON encoding included), with
identical files sharing one extent (default) and with every copy stored
(same size as genisoimage's). The end-to-end string Nova sends is timed too:
openstacksdk's ``build`` (temp dir + genisoimage + gzip + base64) against
``build_configdrive`` + ``encode_configdrive``. Medians of ``--repeats`` runs;
figures only.

    .venv/bin/python bench/configdrive.py               # defaults: 1 MiB and 60 MiB, 5 repeats
    .venv/bin/python bench/configdrive.py --big-mib 64 --repeats 9
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from openstack.baremetal import configdrive as sdk_configdrive

from services.common.images import configdrive, iso9660

NODE = {"uuid": "1be26c0b-03f2-4d2e-ae87-c02d7f33c123", "name": "bench-node"}
PORTS = [
    {"uuid": f"port-{i}", "address": f"52:54:00:00:00:{i:02x}", "extra": {}, "internal_info": {}} for i in range(4)
]
GENISO_ARGS = [
    "-ldots",
    "-allow-lowercase",
    "-allow-multidot",
    "-l",
    "-publisher",
    "metalsmith",
    "-quiet",
    "-J",
    "-r",
    "-V",
    "config-2",
]


def median_seconds(fn: Callable[[], Any], repeats: int) -> tuple[float, Any]:
    times, result = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


def contents_with_user_data(size: int) -> dict[str, Any]:
    # base64 text of random bytes: what big user data usually is (scripts, certificates, archives)
    text = base64.b64encode(os.urandom(size * 3 // 4 + 3)).decode()[:size]
    return {
        "meta_data": {"hostname": "bench", "public_keys": {"0": "ssh-ed25519 AAAA bench"}},
        "user_data": text,
        "vendor_data": {"bench": True},
    }


def bench_case(label: str, contents: dict[str, Any], repeats: int, tmp: Path) -> None:
    files = configdrive.configdrive_files(NODE, PORTS, contents)
    tree = tmp / f"tree-{label}"
    for rel, data in files.items():
        (tree / rel).parent.mkdir(parents=True, exist_ok=True)
        (tree / rel).write_bytes(data)
    out = tmp / f"genisoimage-{label}.iso"

    def genisoimage() -> int:
        subprocess.run(
            ["genisoimage", "-o", str(out), *GENISO_ARGS, str(tree)], check=True, timeout=300, stderr=subprocess.DEVNULL
        )
        return out.stat().st_size

    def ours_shared() -> bytes:
        return configdrive.build_configdrive(NODE, PORTS, contents)

    def ours_full() -> bytes:
        return iso9660.write_iso(
            configdrive.configdrive_files(NODE, PORTS, contents), label=configdrive.LABEL, share_identical=False
        )

    def sdk_string() -> str:
        meta = dict(contents["meta_data"], uuid=NODE["uuid"], name=NODE["name"])
        network = json.loads(files["openstack/latest/network_data.json"])
        return sdk_configdrive.build(
            meta, user_data=contents["user_data"].encode(), network_data=network, vendor_data=contents["vendor_data"]
        )

    def ours_string() -> str:
        return configdrive.encode_configdrive(configdrive.build_configdrive(NODE, PORTS, contents))

    base_t, base_size = median_seconds(genisoimage, repeats)
    shared_t, shared_iso = median_seconds(ours_shared, repeats)
    full_t, full_iso = median_seconds(ours_full, repeats)
    print(f"\n== {label}: {len(files)} files, {sum(map(len, files.values())) / 2**20:.1f} MiB of file data")
    print(f"genisoimage (files on disk)       {base_t * 1000:9.1f} ms  iso {base_size / 2**20:6.1f} MiB  1.00x")
    print(
        f"ferrum build_configdrive (shared) {shared_t * 1000:9.1f} ms  iso {len(shared_iso) / 2**20:6.1f} MiB"
        f"  {shared_t / base_t:.2f}x"
    )
    print(
        f"ferrum write_iso (every copy)     {full_t * 1000:9.1f} ms  iso {len(full_iso) / 2**20:6.1f} MiB"
        f"  {full_t / base_t:.2f}x"
    )
    sdk_t, sdk_value = median_seconds(sdk_string, max(1, repeats // 2))
    ours_t, our_value = median_seconds(ours_string, max(1, repeats // 2))
    decode_t, _ = median_seconds(lambda: configdrive.decode_configdrive(our_value), max(1, repeats // 2))
    print(
        f"string Nova sends: openstacksdk build {sdk_t * 1000:9.1f} ms ({len(sdk_value) / 2**20:.1f} MiB), "
        f"ferrum build+encode {ours_t * 1000:9.1f} ms ({len(our_value) / 2**20:.1f} MiB)  {ours_t / sdk_t:.2f}x"
    )
    print(f"ferrum decode_configdrive          {decode_t * 1000:9.1f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--small-mib", type=float, default=1.0, help="user data size of the small case (MiB)")
    parser.add_argument("--big-mib", type=float, default=60.0, help="approximate drive size of the big case (MiB)")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    if not shutil.which("genisoimage"):
        raise SystemExit("genisoimage is not installed (apt-get install genisoimage)")
    print(f"cpu count {os.cpu_count()}, load average {os.getloadavg()[0]:.2f}; medians of {args.repeats} runs")
    with tempfile.TemporaryDirectory(prefix="ferrum-bench-cd-") as tmp:
        bench_case(
            f"{args.small_mib:g} MiB user data",
            contents_with_user_data(int(args.small_mib * 2**20)),
            args.repeats,
            Path(tmp),
        )
        # both version directories carry the user data, so half of it per copy
        bench_case(
            f"~{args.big_mib:g} MiB drive",
            contents_with_user_data(int(args.big_mib * 2**20) // 2 - 2**20),
            args.repeats,
            Path(tmp),
        )


if __name__ == "__main__":
    main()
