"""Ironic's attach/detach sequence against the real Cinder of cinder_service.py, over plain REST.

    PYTHONPATH=$PWD .venv/bin/python -m tests.support.cinder_smoke

Creates a 1 GiB volume, then does what ironic/common/cinder.py does
(reserve, initialize_connection with an iSCSI connector, attach, metadata;
begin_detaching, terminate_connection, detach) plus unreserve on a second
reservation, writes and reads bytes through the exported iSCSI target with
qemu-img (libiscsi, CHAP), and checks that an unknown volume is a 404 and a
stopped cinder-api a connection error. Prints each step's time.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Any

from tests.support.cinder_service import cinder_service

NODE_UUID = "1be26c0b-03f2-4d2d-ae87-c02d7f33c123"
CONNECTOR = {
    "initiator": "iqn.2026-11.io.ferrum:node-1",
    "host": NODE_UUID,
    "ip": "127.0.0.1",
    "multipath": False,
    "platform": "x86_64",
    "os_type": "linux2",
}


class Rest:
    def __init__(self, info: dict[str, Any]) -> None:
        self.base = f"{info['url']}/{info['project_id']}"
        self.headers = {**info["headers"], "Content-Type": "application/json"}
        self.logs = Path(info["logs"]) if info.get("logs") else None  # Cinder's own logs, for failures

    def api_log_tail(self, lines: int = 40) -> str:
        """The end of cinder-api's log: what a 500 from Cinder itself means (the logs go with the run)."""
        if self.logs is None:
            return "(no Cinder logs)"
        try:
            text = (self.logs / "cinder-api.log").read_text(errors="replace").splitlines()
        except OSError as exc:
            return f"(cinder-api.log unreadable: {exc})"
        return "\n".join(text[-lines:])

    def call(self, method: str, path: str, body: Any = None, timeout: float = 30) -> tuple[int, Any]:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.base + path, data=data, method=method, headers=self.headers)
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                raw = resp.read()
                return resp.status, json.loads(raw) if raw else None
        except urllib.error.HTTPError as exc:
            raw = exc.read()
            if exc.code >= 500:
                # Cinder's own fault: its log says why, and the log goes with the run. On
                # stderr, so pytest shows all of it with the failing test, uncut.
                print(
                    f"Cinder answered {exc.code} to {method} {path}; the end of cinder-api.log:\n"
                    f"{self.api_log_tail(80)}",
                    file=sys.stderr,
                )
            return exc.code, json.loads(raw) if raw else None

    def action(self, volume_id: str, name: str, args: Any = None) -> Any:
        status, body = self.call("POST", f"/volumes/{volume_id}/action", {name: args})
        if status >= 300:
            raise RuntimeError(f"{name} on {volume_id}: {status} {body}")
        return body

    def volume(self, volume_id: str) -> dict[str, Any]:
        status, body = self.call("GET", f"/volumes/{volume_id}")
        if status != 200:
            raise RuntimeError(f"GET volume {volume_id}: {status} {body}")
        volume: dict[str, Any] = body["volume"]
        return volume

    def wait_status(self, volume_id: str, wanted: str, timeout: float = 60) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            volume = self.volume(volume_id)
            if volume["status"] == wanted:
                return volume
            if volume["status"] == "error" or time.monotonic() > deadline:
                raise RuntimeError(f"volume {volume_id} is {volume['status']}, wanted {wanted}")
            time.sleep(0.2)


def iscsi_roundtrip(data: dict[str, Any]) -> None:
    """Write 4 KiB at offset 1 MiB through the target with qemu-img (CHAP) and read them back."""
    secret = data["auth_password"]
    spec = {
        "driver": "raw",
        "file": {
            "driver": "iscsi",
            "transport": "tcp",
            "portal": data["target_portal"],
            "target": data["target_iqn"],
            "lun": data["target_lun"],
            "user": data["auth_username"],
            "password-secret": "chap",
            "initiator-name": CONNECTOR["initiator"],
        },
    }
    obj = ["--object", f"secret,id=chap,data={secret}"]
    opts = _image_opts(spec)
    offset = 1024 * 1024
    for command in (f"write -P 0x5a {offset} 4096", f"read -P 0x5a {offset} 4096"):
        done = subprocess.run(
            ["qemu-io", *obj, "--image-opts", opts, "-c", command],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        if done.returncode != 0 or "4096/4096" not in done.stdout or "verification failed" in done.stdout:
            raise RuntimeError(f"qemu-io {command!r} over iSCSI failed: {done.stdout} {done.stderr}")
    info = subprocess.run(
        ["qemu-img", "info", *obj, "--image-opts", opts], capture_output=True, text=True, timeout=60, check=True
    )
    size_line = next(line for line in info.stdout.splitlines() if line.startswith("virtual size"))
    print(f"  iSCSI (qemu-io, CHAP): wrote and read back 4 KiB at 1 MiB via {data['target_portal']}; {size_line}")


def _image_opts(spec: dict[str, Any]) -> str:
    f = spec["file"]
    return (
        f"driver=raw,file.driver=iscsi,file.transport=tcp,file.portal={f['portal']},file.target={f['target']},"
        f"file.lun={f['lun']},file.user={f['user']},file.password-secret=chap,file.initiator-name={f['initiator-name']}"
    )


def main() -> int:
    timings: dict[str, float] = {}

    def step(name: str, t0: float) -> float:
        now = time.monotonic()
        timings[name] = round(now - t0, 3)
        print(f"{name}: {timings[name]:.3f}s")
        return now

    t = time.monotonic()
    with cinder_service() as info:
        t = step("start-up", t)
        rest = Rest(info)
        status, body = rest.call("POST", "/volumes", {"volume": {"size": 1, "name": "ferrum-smoke"}})
        assert status == 202, (status, body)
        vid = body["volume"]["id"]
        rest.wait_status(vid, "available")
        t = step("create 1 GiB volume -> available", t)

        volume = rest.volume(vid)
        assert volume["status"] == "available"
        rest.action(vid, "os-reserve")
        assert rest.volume(vid)["status"] == "attaching"
        t = step("os-reserve -> attaching", t)
        conn = rest.action(vid, "os-initialize_connection", {"connector": CONNECTOR})["connection_info"]
        t = step("os-initialize_connection", t)
        print("  connection_info:", json.dumps(conn, sort_keys=True))
        data = conn["data"]
        assert conn["driver_volume_type"] == "iscsi"
        assert data["target_portal"] == info["iscsi_portal"], data
        assert data["target_iqn"].endswith(vid) and data["target_lun"] == 1
        assert data["auth_method"] == "CHAP" and data["auth_username"] and data["auth_password"]
        iscsi_roundtrip(data)
        t = step("iSCSI write/read through the target", t)
        rest.action(
            vid,
            "os-attach",
            {"instance_uuid": NODE_UUID, "host_name": NODE_UUID, "mountpoint": "ironic_mountpoint"},
        )
        volume = rest.volume(vid)
        assert volume["status"] == "in-use", volume["status"]
        attachment = volume["attachments"][0]
        assert attachment["server_id"] == NODE_UUID, attachment
        t = step("os-attach -> in-use", t)
        meta = {f"ironic_node_{NODE_UUID}": json.dumps({"instance_uuid": NODE_UUID, "last_action": "attached"})}
        status, body = rest.call("POST", f"/volumes/{vid}/metadata", {"metadata": meta})
        assert status == 200, (status, body)
        got = rest.volume(vid)["metadata"]
        assert {k: got.get(k) for k in meta} == meta, got
        print("  metadata:", got)
        t = step("metadata", t)

        rest.action(vid, "os-begin_detaching")
        assert rest.volume(vid)["status"] == "detaching"
        rest.action(vid, "os-terminate_connection", {"connector": CONNECTOR})
        rest.action(vid, "os-detach", {"attachment_id": attachment["attachment_id"]})
        volume = rest.wait_status(vid, "available")
        assert volume["attachments"] == [], volume["attachments"]
        t = step("begin_detaching, terminate_connection, detach -> available", t)

        rest.action(vid, "os-reserve")
        rest.action(vid, "os-unreserve")
        assert rest.volume(vid)["status"] == "available"
        t = step("os-reserve + os-unreserve -> available", t)

        status, body = rest.call("GET", f"/volumes/{uuid.uuid4()}")
        assert status == 404, (status, body)
        print("  unknown volume:", status, body)
        t = step("unknown volume -> 404", t)

        status, _ = rest.call("DELETE", f"/volumes/{vid}")
        assert status == 202
        deadline = time.monotonic() + 60
        while rest.call("GET", f"/volumes/{vid}")[0] != 404:
            assert time.monotonic() < deadline, "volume not deleted"
            time.sleep(0.2)
        t = step("delete", t)

        # cinder-api down: stop just that process (the fixture's own PID) and call again
        service_api = info["pids"]["cinder-api"]
        os.killpg(service_api, 15)
        time.sleep(1.0)
        try:
            rest.call("GET", "/volumes", timeout=5)
        except (urllib.error.URLError, ConnectionError) as exc:
            print("  cinder-api down:", type(exc).__name__, exc)
        else:
            raise AssertionError("cinder-api still answers")
        t = step("cinder-api down -> connection error", t)
    step("stop everything", t)
    print(json.dumps(timings))
    return 0


if __name__ == "__main__":
    sys.exit(main())
