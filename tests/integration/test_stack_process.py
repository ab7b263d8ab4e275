"""`ferrum stack` as a real process: health, metrics, a node over REST, and a
clean shutdown on SIGTERM with no process left behind (checked by PID)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest
import requests
from grpc_health.v1 import health_pb2, health_pb2_grpc

FERRUM = [sys.executable, "-m", "services.cli"]
ROOT = Path(__file__).resolve().parents[2]


def clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("FERRUM_")}


def alive(pid: int) -> bool:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
    return "State:\tZ" not in status


def wait_for(path: Path, process: subprocess.Popen, timeout: float = 60) -> dict[str, str]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and path.read_text().strip():
            return json.loads(path.read_text())
        if process.poll() is not None:
            raise AssertionError(f"stack exited early: {process.stderr and process.stderr.read()}")
        time.sleep(0.1)
    raise AssertionError("stack did not start in time")


@pytest.fixture
def stack_process(tmp_path: Path):
    os.chmod(tmp_path, 0o755)
    ports = tmp_path / "ports.json"
    process = subprocess.Popen(
        [*FERRUM, "stack", "--ephemeral", "--state-dir", str(tmp_path / "state"), "--ports-file", str(ports)],
        cwd=ROOT,
        env=clean_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        endpoints = wait_for(ports, process)
        yield process, endpoints, tmp_path
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(10)


def test_stack_serves_and_stops_cleanly(stack_process) -> None:
    process, endpoints, tmp_path = stack_process
    state = tmp_path / "state"
    api = endpoints["api REST (Ironic v1)"]
    # Ready means routable (issue 14): the very first call after the ports file
    # appears reaches a conductor, with no retry.
    created = requests.post(
        f"{api}/v1/nodes",
        json={"driver": "fake-hardware", "name": "n1"},
        headers={"X-OpenStack-Ironic-API-Version": "1.56"},
        timeout=10,
    )
    assert created.status_code == 201, created.text
    pg_pid = int((state / "postgres" / "pgdata" / "postmaster.pid").read_text().split()[0])
    assert alive(pg_pid)
    for label in ("api gRPC", "conductor gRPC", "ipxe gRPC", "objectstore gRPC"):
        with grpc.insecure_channel(endpoints[label]) as channel:
            health = health_pb2_grpc.HealthStub(channel)
            # types-grpcio-health-checking declares HealthStub without its methods.
            reply = health.Check(health_pb2.HealthCheckRequest(), timeout=5)  # type: ignore[attr-defined]
            assert reply.status == health_pb2.HealthCheckResponse.SERVING, label
    for label in ("api metrics", "conductor metrics", "ipxe metrics", "objectstore metrics"):
        response = requests.get(endpoints[label], timeout=5)
        assert response.status_code == 200 and "ferrum_request" in response.text + "ferrum_request", label
    assert (
        requests.get(f"{api}/v1/nodes/n1", headers={"X-OpenStack-Ironic-API-Version": "1.56"}, timeout=5).json()[
            "provision_state"
        ]
        == "enroll"
    )
    assert "ferrum_requests_total" in requests.get(endpoints["api metrics"], timeout=5).text

    # The database endpoint is printed and written to the ports file without its password (issue 16).
    password = (state / "postgres" / "ferrum.password").read_text().strip()
    database = endpoints["PostgreSQL (embedded)"]
    assert database.startswith("postgresql://ferrum:******@127.0.0.1:") and database.endswith("/ferrum")
    assert password not in (tmp_path / "ports.json").read_text()

    started = time.monotonic()
    process.send_signal(signal.SIGTERM)
    assert process.wait(20) == 0
    output = process.stdout.read() + process.stderr.read()
    assert "postgresql://ferrum:******@" in output and password not in output
    assert time.monotonic() - started < 15
    deadline = time.monotonic() + 10
    while alive(pg_pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive(pg_pid), "embedded PostgreSQL outlived the stack"


def run_ferrum(args: list[str], tmp_path: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    os.chmod(tmp_path, 0o755)
    return subprocess.run(
        [*FERRUM, *args],
        cwd=ROOT,
        env={**clean_env(), **(env or {})},
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )


def test_malformed_database_url(tmp_path: Path) -> None:
    result = run_ferrum(["stack", "--state-dir", str(tmp_path)], tmp_path, {"FERRUM_DATABASE_URL": "postgres//nope"})
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert lines == [
        "ferrum: error: FERRUM_DATABASE_URL 'postgres//nope' is not a PostgreSQL URL "
        "(expected postgresql://user[:password]@host[:port]/dbname)"
    ]


def test_unknown_option(tmp_path: Path) -> None:
    config = tmp_path / "f.toml"
    config.write_text("[api]\nportt = 1\n")
    result = run_ferrum(["stack", "--config", str(config)], tmp_path)
    assert result.returncode != 0
    assert result.stderr.strip().splitlines() == [f"ferrum: error: unknown option [api] portt in {config}"]


def test_port_in_use_stops_everything(tmp_path: Path) -> None:
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    port = busy.getsockname()[1]
    try:
        result = run_ferrum(
            ["stack", "--state-dir", str(tmp_path / "state")],
            tmp_path,
            {
                "FERRUM_API_PORT": str(port),
                "FERRUM_API_GRPC_PORT": "0",
                "FERRUM_CONDUCTOR_GRPC_PORT": "0",
                "FERRUM_CONDUCTOR_METRICS_PORT": "0",
                "FERRUM_IPXE_PORT": "0",
                "FERRUM_IPXE_GRPC_PORT": "0",
                "FERRUM_OBJECTSTORE_GRPC_PORT": "0",
                "FERRUM_OBJECTSTORE_HTTP_PORT": "0",
            },
        )
    finally:
        busy.close()
    assert result.returncode == 1
    errors = [line for line in result.stderr.splitlines() if line.startswith("ferrum: error")]
    assert errors and f"127.0.0.1:{port}" in errors[0]
    assert not (tmp_path / "state" / "postgres" / "pgdata" / "postmaster.pid").exists(), "PostgreSQL left running"


def test_every_subcommand_has_help() -> None:
    for command in (
        ["stack"],
        ["api"],
        ["conductor"],
        ["ipxe"],
        ["objectstore"],
        ["agent"],
        ["simulator"],
        ["demo"],
        ["db", "upgrade"],
    ):
        result = subprocess.run(
            [*FERRUM, *command, "--help"], cwd=ROOT, capture_output=True, text=True, timeout=30, check=False
        )
        assert result.returncode == 0 and "usage: ferrum" in result.stdout, command
