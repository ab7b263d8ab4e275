"""Virtualenvs for the peers Ferrum is tested against (IPA, Ironic, Cinder).

Each peer pins its own oslo libraries, so none may share Ferrum's environment.
One venv per peer lives under ``<repo>/.ferrum/cache/<name>-venv``, created on
first use and reused while its marker names the wanted requirement. An
exclusive file lock makes concurrent test workers (pytest-xdist) wait for one
install instead of racing two into the same directory.
"""

from __future__ import annotations

import fcntl
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CACHE = REPO / ".ferrum" / "cache"
VENV_TIMEOUT = 300
INSTALL_TIMEOUT = 1800


def venv_path(name: str) -> Path:
    """Where the peer ``name``'s virtualenv lives."""
    return CACHE / f"{name}-venv"


def ensure_peer_venv(name: str, requirement: str, *, venv: Path | None = None) -> Path:
    """A virtualenv with ``requirement`` (``pkg==version``, or several separated by
    spaces) installed; its python.

    Reinstalls from scratch when the marker names another requirement, so a
    version bump in a test never runs against the old peer.
    """
    venv = venv or venv_path(name)
    marker = venv / "ferrum-peer-requirement"
    python = venv / "bin" / "python"
    venv.parent.mkdir(parents=True, exist_ok=True)
    with open(venv.parent / f"{venv.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if marker.exists() and marker.read_text().split(" installed in ")[0] == requirement and python.exists():
            return python
        started = time.monotonic()
        shutil.rmtree(venv, ignore_errors=True)
        base = getattr(sys, "_base_executable", sys.executable)
        subprocess.run([base, "-m", "venv", str(venv)], check=True, capture_output=True, timeout=VENV_TIMEOUT)
        done = subprocess.run(
            [str(python), "-m", "pip", "install", "-q", *requirement.split()],
            capture_output=True,
            text=True,
            timeout=INSTALL_TIMEOUT,
            check=False,
        )
        if done.returncode != 0:
            raise RuntimeError(f"installing {requirement} into {venv} failed: {done.stderr[-2000:]}")
        took = time.monotonic() - started
        marker.write_text(f"{requirement} installed in {took:.1f}s\n")
        print(f"peer_venv: installed {requirement} into {venv} in {took:.1f}s", file=sys.stderr)
    return python
