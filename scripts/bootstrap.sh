#!/usr/bin/env bash
# Prepare a fresh clone: Debian packages the tests need, a virtualenv with
# Ferrum and its test extras, and the generated gRPC code. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"

# Debian packages the tests and the demo use (one per line in scripts/apt-packages.txt).
need_apt=()
while read -r pkg; do
    [ -z "$pkg" ] || [ "${pkg#\#}" != "$pkg" ] && continue
    dpkg -s "$pkg" >/dev/null 2>&1 || need_apt+=("$pkg")
done < scripts/apt-packages.txt
if [ "${#need_apt[@]}" -gt 0 ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "bootstrap: installing Debian packages: ${need_apt[*]}"
    export DEBIAN_FRONTEND=noninteractive
    (apt-get install -y --no-install-recommends "${need_apt[@]}" >/dev/null 2>&1 \
        || (apt-get update >/dev/null 2>&1 && apt-get install -y --no-install-recommends "${need_apt[@]}" >/dev/null)) \
        || echo "bootstrap: warning: could not install ${need_apt[*]}"
fi

if [ ! -x .venv/bin/python ]; then
    echo "bootstrap: creating .venv"
    "$PYTHON" -m venv .venv
fi
stamp=.venv/.ferrum-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
    echo "bootstrap: installing Ferrum and test dependencies into .venv (takes a few minutes the first time)"
    .venv/bin/python -m pip install -q --upgrade pip
    .venv/bin/python -m pip install -q -e '.[test]' --config-settings editable_mode=compat
    touch "$stamp"
fi
echo "bootstrap: generating gRPC code from protos/"
.venv/bin/python scripts/gen_protos.py
# The wheels of Ferrum's runtime dependencies, for the test that installs Ferrum's own
# wheel into a fresh venv with no index (tests/integration/test_wheel_install.py).
.venv/bin/python -m tests.support.wheelhouse >/dev/null || echo "bootstrap: warning: could not build the wheelhouse (tests/support/wheelhouse.py)"
# kubernetes-validate in its own venv, for the Kubernetes manifests' schema check
# (tests/unit/test_kubernetes_manifests.py).
.venv/bin/python -m tests.support.kube_validate >/dev/null || echo "bootstrap: warning: could not install kubernetes-validate (tests/support/kube_validate.py)"
# The QEMU tests' Debian kernel and busybox initramfs, fetched now rather than
# while a test's stack is running (a download that stalls the event loop past the
# heartbeat timeout looks like a dead conductor).
.venv/bin/python -m tests.e2e.bootfiles >/dev/null || echo "bootstrap: warning: could not fetch the QEMU tests' kernel (tests/e2e/bootfiles.py)"
# The real-VM tests' deploy ramdisk and demo OS image (issue 20), built from Debian
# packages now rather than while a test's stack runs; later runs find them current.
.venv/bin/python -m tests.e2e.vmfiles >/dev/null || echo "bootstrap: warning: could not build the real-VM tests' ramdisk (tests/e2e/vmfiles.py)"
# The real Cinder the cinder storage tests run against (its own virtualenv, RabbitMQ and
# LVM from Debian) and the NFS server of the NFS-root test, installed now, not mid-run.
.venv/bin/python -m tests.support.cinder_service >/dev/null || echo "bootstrap: warning: could not install Cinder (tests/support/cinder_service.py)"
.venv/bin/python -c "from tests.e2e.nfs_server import ensure_nfs_packages; ensure_nfs_packages()" >/dev/null || echo "bootstrap: warning: could not install NFS-Ganesha (tests/e2e/nfs_server.py)"
# The interop tests' real peers (issue 22): ironic-python-agent 13 and Ironic 39, each in
# its own venv under .ferrum/cache (they pin their own oslo libraries), plus Ironic's
# empty SQLite schema; installed now so the timed test run does not pay for them.
install_interop_peers() {
    .venv/bin/python -m tests.support.ipa_agent >/dev/null \
        || echo "bootstrap: warning: could not install ironic-python-agent (tests/support/ipa_agent.py)"
    .venv/bin/python -m tests.support.ironic_service >/dev/null \
        || echo "bootstrap: warning: could not install Ironic (tests/support/ironic_service.py)"
}
install_interop_peers
