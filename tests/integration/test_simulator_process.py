"""``ferrum simulator`` as an operator runs it: a process, stopped by SIGTERM."""

from __future__ import annotations

import base64
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import requests

FERRUM = str(Path(sys.executable).parent / "ferrum")


def test_simulator_process_serves_redfish_and_stops_on_sigterm(tmp_path: Path) -> None:
    ports = tmp_path / "ports.json"
    proc = subprocess.Popen(
        [
            FERRUM,
            "simulator",
            "--machines",
            "3",
            "--state-dir",
            str(tmp_path / "state"),
            "--port",
            "0",
            "--ports-file",
            str(ports),
            "--username",
            "admin",
            "--password",
            "pw",
            "--disk-size",
            "16MiB",
            "--boot-url",
            "http://127.0.0.1:9/boot.ipxe",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while not (ports.exists() and ports.read_text()):
            assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
            assert time.monotonic() < deadline, "no ports file within 60 s"
            time.sleep(0.1)
        url = json.loads(ports.read_text())["simulator"]
        auth = {"Authorization": "Basic " + base64.b64encode(b"admin:pw").decode()}
        systems = requests.get(url + "/redfish/v1/Systems", headers=auth, timeout=10).json()
        assert systems["Members@odata.count"] == 3
        assert requests.get(url + "/redfish/v1/Systems", timeout=10).status_code == 401
        inventory = json.loads((tmp_path / "state" / "machines.json").read_text())
        assert [m["driver_info"]["redfish_username"] for m in inventory["machines"]] == ["admin"] * 3
        assert sorted(p.name for p in (tmp_path / "state" / "disks").iterdir()) == [
            "sim-0000.img",
            "sim-0001.img",
            "sim-0002.img",
        ]
        # Power one on: no DHCP server answers at --boot-url, so the firmware falls through to the empty disk.
        first = systems["Members"][0]["@odata.id"]
        resp = requests.post(
            url + first + "/Actions/ComputerSystem.Reset", json={"ResetType": "On"}, headers=auth, timeout=10
        )
        assert resp.status_code == 204
        deadline = time.monotonic() + 30
        while requests.get(url + "/simulator/machines/sim-0000", timeout=10).json()["status"] != "no_bootable_device":
            assert time.monotonic() < deadline, "the machine did not finish booting"
            time.sleep(0.1)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            output, _ = proc.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            output, _ = proc.communicate(timeout=10)
    assert proc.returncode == 0, output
    assert "3 machines, Redfish at" in output


def test_bad_options_exit_2_with_a_clear_message(tmp_path: Path) -> None:
    for args, text in (
        (["--machines", "0"], "--machines"),
        (["--disk-size", "lots"], "invalid size"),
        (["--username", "u"], "both --username and --password"),
        (["--boot-url", "tftp://x/boot"], "--boot-url"),
        (["--power-delay", "5,1"], "power delay"),
        (["--power-delay", "soon"], "power delay"),
    ):
        run = subprocess.run(
            [FERRUM, "simulator", "--state-dir", str(tmp_path), "--port", "0", *args],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert run.returncode == 2, (args, run.stderr)
        assert text in run.stderr, (args, run.stderr)


def test_open_files_limit_is_raised_for_many_machines(tmp_path: Path) -> None:
    import resource

    ports = tmp_path / "ports.json"
    proc = subprocess.Popen(
        [
            "sh",  # lowers the soft limit in the child before exec (preexec_fn is unsafe with threads)
            "-c",
            'ulimit -S -n 256 && exec "$0" "$@"',
            FERRUM,
            "simulator",
            "--machines",
            "300",
            "--state-dir",
            str(tmp_path / "state"),
            "--port",
            "0",
            "--ports-file",
            str(ports),
            "--disk-size",
            "8MiB",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while not (ports.exists() and ports.read_text()):
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.1)
        limits = Path(f"/proc/{proc.pid}/limits").read_text()
        soft = int(next(line for line in limits.splitlines() if line.startswith("Max open files")).split()[3])
        hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        # Every ferrum process lifts its soft limit to the hard one at start (docs/security.md,
        # "File descriptors"): at least the 300 machines' share, and room for the listener's cap.
        assert soft == hard and soft >= min(300 * 6 + 1024, hard) and soft > 256
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=20)
    assert proc.returncode == 0
