"""Ferrum as a user installs it: a wheel built from this checkout, and the
wheels of its runtime dependencies, for tests that install into a fresh venv.

* :func:`build_ferrum_wheel` copies the tracked sources (plus the generated
  ``ferrum/v1`` gRPC code, which the wheel ships) into a scratch directory and
  runs ``pip wheel --no-deps`` there, so the build leaves no ``build/`` or
  egg-info behind in the checkout. About 2 s.
* :func:`ensure_wheelhouse` keeps the dependency wheels under
  ``<repo>/.ferrum/cache/wheelhouse/<key>``, pinned to the versions installed
  in ``.venv`` (the ones the suite tests with), so the install test can run
  ``pip install --no-index``: 6.5 s to install, against about 12 s plus the
  network when resolving from an index. The key hashes ``pyproject.toml`` and
  those pins, so a changed dependency builds a new wheelhouse. Building one
  takes about 5 s with pip's cache warm; ``scripts/bootstrap.sh`` does it
  (``python -m tests.support.wheelhouse``) so the timed test run does not.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CACHE = REPO / ".ferrum" / "cache" / "wheelhouse"
PIP_TIMEOUT = 900.0  # a fresh clone downloads every dependency once


def run(argv: list[str], *, cwd: Path | None = None, timeout: float = PIP_TIMEOUT) -> str:
    """Run a build step; its stderr in the error when it fails."""
    result = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({result.returncode}):\n{result.stderr.strip()[-3000:]}")
    return result.stdout


def tracked_sources(root: Path = REPO) -> list[str]:
    """What the wheel is built from: the tracked files of the packaged trees."""
    out = run(["git", "-C", str(root), "ls-files", "-z", "services", "pyproject.toml", "README.md"])
    return [name for name in out.split("\0") if name]


def build_ferrum_wheel(dest: Path, *, root: Path = REPO) -> Path:
    """Build ``ferrum-*.whl`` into *dest* from a scratch copy of the checkout; return its path."""
    generated = root / "ferrum" / "v1"
    if not any(generated.glob("*_pb2.py")):
        raise RuntimeError(f"{generated} holds no generated code: run scripts/gen_protos.py first")
    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="ferrum-wheel-src-") as scratch:
        src = Path(scratch)
        for name in tracked_sources(root):
            target = src / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(root / name, target)
        shutil.copytree(root / "ferrum", src / "ferrum", ignore=shutil.ignore_patterns("__pycache__"))
        run(
            [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(dest), str(src)]
        )
    wheels = sorted(dest.glob("ferrum-*.whl"))
    if len(wheels) != 1:
        raise RuntimeError(f"expected one ferrum wheel in {dest}, found {[w.name for w in wheels]}")
    return wheels[0]


def installed_pins() -> str:
    """``pip freeze`` of this interpreter's environment, without Ferrum itself: the versions the suite runs."""
    out = run([sys.executable, "-m", "pip", "freeze", "--exclude-editable"], timeout=120)
    return "".join(line + "\n" for line in out.splitlines() if not line.lower().startswith("ferrum"))


def ensure_wheelhouse(*, root: Path = REPO) -> Path:
    """The directory of dependency wheels for ``pip install --no-index --find-links``; built when missing."""
    pins = installed_pins()
    key = hashlib.sha256((root / "pyproject.toml").read_bytes() + pins.encode()).hexdigest()[:16]
    house = CACHE / key
    if (house / ".complete").exists():
        return house
    CACHE.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="building-", dir=CACHE) as scratch:
        work = Path(scratch)
        constraints = work / "constraints.txt"
        constraints.write_text(pins)
        wheel = build_ferrum_wheel(work / "dist", root=root)
        wheels = work / "wheels"
        run([sys.executable, "-m", "pip", "wheel", "-q", "-w", str(wheels), "-c", str(constraints), str(wheel)])
        for stale in wheels.glob("ferrum-*.whl"):
            stale.unlink()  # each test installs the wheel it just built
        (wheels / ".complete").write_text(pins)
        shutil.rmtree(house, ignore_errors=True)
        wheels.rename(house)
    for old in CACHE.iterdir():
        if old != house and not old.name.startswith("building-"):
            shutil.rmtree(old, ignore_errors=True)
    return house


if __name__ == "__main__":
    print(ensure_wheelhouse())
