"""kubernetes-validate (PyPI) in its own virtualenv, for checking deploy/kubernetes/.

It validates resources against the JSON schemas of a Kubernetes release that
ship inside the package, so it needs no cluster and no network at test time.
It lives in ``<repo>/.ferrum/cache/kube-validate`` (never in Ferrum's own
environment, as with the Cinder venv): 144 MB, about 40 s to create, which
``scripts/bootstrap.sh`` does (``python -m tests.support.kube_validate``).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
VENV = REPO / ".ferrum" / "cache" / "kube-validate"
VERSION = "1.37.0"  # its default Kubernetes schema version is the same number
KUBERNETES_VERSION = "1.30.0"  # the oldest release the manifests promise to fit (gRPC probes are GA since 1.27)


def validator() -> Path:
    """The ``kubernetes-validate`` program, installed first when missing."""
    program = VENV / "bin" / "kubernetes-validate"
    stamp = VENV / f".installed-{VERSION}"
    if program.exists() and stamp.exists():
        return program
    base = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base, "-m", "venv", "--clear", str(VENV)], check=True, capture_output=True, timeout=300)
    result = subprocess.run(
        [str(VENV / "bin" / "pip"), "install", "-q", f"kubernetes-validate=={VERSION}"],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    if result.returncode != 0:
        raise RuntimeError(f"installing kubernetes-validate failed:\n{result.stderr[-3000:]}")
    stamp.touch()
    return program


if __name__ == "__main__":
    print(validator())
