"""Ferrum installed from its wheel, the way a user installs it (issue 24).

The wheel is built from this checkout and installed into a fresh virtualenv
in a temporary directory, with only the dependency wheels of the wheelhouse
(tests/support/wheelhouse.py) and no index. The checkout is never on that
interpreter's path: it runs with ``-I`` (no PYTHONPATH, no script directory)
or as the venv's ``ferrum`` script, from a working directory outside the
checkout. Then:

* every module of the installed package imports, and every third-party module
  it imports is a declared dependency with a lower bound;
* ``ferrum stack --ephemeral`` serves ``/v1/openapi.yaml`` (package data),
  ``/boot.ipxe`` (templates) and creates a node over REST (migrations, the
  driver entry points), then stops on SIGTERM.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
import yaml

from tests.support.wheelhouse import build_ferrum_wheel, ensure_wheelhouse

ROOT = Path(__file__).resolve().parents[2]
API_VERSION = {"X-OpenStack-Ironic-API-Version": "1.56"}


def outside_env() -> dict[str, str]:
    """The environment without anything that points back into the checkout or configures Ferrum."""
    return {
        k: v for k, v in os.environ.items() if not k.startswith("FERRUM_") and k not in ("PYTHONPATH", "VIRTUAL_ENV")
    }


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv with the freshly built wheel installed from the wheelhouse alone; its directory."""
    house = ensure_wheelhouse()
    work = tmp_path_factory.mktemp("wheel")
    os.chmod(work, 0o755)  # as root, the embedded PostgreSQL runs as ferrum-pg and must reach its state dir
    wheel = build_ferrum_wheel(work / "dist")
    venv = work / "venv"
    # The venv gets no pip of its own (ensurepip costs 5 s): this interpreter's pip installs into it.
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=60)
    pip = [sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python")]
    subprocess.run(
        [*pip, "install", "-q", "--no-index", "--find-links", str(house), str(wheel)],
        check=True,
        timeout=300,
        cwd=work,
        env=outside_env(),
    )
    return venv


def test_installed_package_imports_and_declares_everything(installed: Path, tmp_path: Path) -> None:
    result = subprocess.run(
        [str(installed / "bin" / "python"), "-I", str(ROOT / "tests" / "support" / "wheel_imports.py")],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env=outside_env(),
        check=False,
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert Path(report["location"]).is_relative_to(installed), report["location"]
    assert report["modules"] > 200, report["modules"]
    assert report["failed"] == {}
    assert {"yaml", "grpc", "asyncpg", "aiohttp", "sushy"} <= set(report["imports"])
    assert report["undeclared"] == {}
    assert report["unbounded"] == []


@pytest.fixture(scope="module")
def installed_stack(installed: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """``ferrum stack --ephemeral`` from the venv, run in a directory outside the checkout."""
    cwd = tmp_path_factory.mktemp("wheel-stack")
    os.chmod(cwd, 0o755)
    ports = cwd / "ports.json"
    log = (cwd / "stack.log").open("w")
    process = subprocess.Popen(
        [str(installed / "bin" / "ferrum"), "stack", "--ephemeral", "--state-dir", "state", "--ports-file", str(ports)],
        cwd=cwd,
        env=outside_env(),
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 60
        while not (ports.exists() and ports.read_text().strip()):
            assert process.poll() is None, f"the installed stack exited:\n{(cwd / 'stack.log').read_text()[-3000:]}"
            assert time.monotonic() < deadline, "the installed stack did not start in 60 s"
            time.sleep(0.1)
        yield json.loads(ports.read_text())
        process.send_signal(signal.SIGTERM)
        assert process.wait(30) == 0, (cwd / "stack.log").read_text()[-3000:]
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(10)
        log.close()


def test_installed_stack_serves_openapi_ipxe_and_nodes(installed_stack: dict[str, str]) -> None:
    api = installed_stack["api REST (Ironic v1)"]
    spec = requests.get(f"{api}/v1/openapi.yaml", timeout=10)
    assert spec.status_code == 200, spec.text[:500]
    document = yaml.safe_load(spec.text)
    assert document["openapi"].startswith("3.") and "/v1/nodes" in document["paths"]

    boot = requests.get(installed_stack["ipxe HTTP"], timeout=10)
    assert boot.status_code == 200 and boot.text.startswith("#!ipxe"), boot.text[:300]

    created = requests.post(
        f"{api}/v1/nodes", json={"driver": "fake-hardware", "name": "from-wheel"}, headers=API_VERSION, timeout=10
    )
    assert created.status_code == 201, created.text
    node = requests.get(f"{api}/v1/nodes/from-wheel", headers=API_VERSION, timeout=10).json()
    assert node["uuid"] == created.json()["uuid"] and node["provision_state"] == "enroll"
    assert node["conductor"], "no conductor took the node"
