"""A real OpenStack Ironic 39 on this machine, for the interop tests (issue 22).

:func:`ensure_ironic_venv` installs ``ironic`` (``IRONIC_VERSION``) from PyPI
into its own virtualenv, ``<repo>/.ferrum/cache/ironic-venv`` (Ironic pins its
own oslo libraries; never into Ferrum's environment). ``scripts/bootstrap.sh``
runs ``python -m tests.support.ironic_service`` so the timed test run does not
pay for the install.

:func:`ironic_service` runs the all-in-one ``ironic`` process (API and
conductor in one, ``rpc_transport = none``, ``auth_strategy = noauth``) on
127.0.0.1 and a free port, with a private SQLite database (``ironic-dbsync``
creates it), so nothing is shared with ``/work/shared/ironic`` (port 6385,
PostgreSQL 5433) or another test. Hardware is ``fake-hardware`` with fake
power and boot and the ``direct`` deploy interface: the conductor drives a
real deploy agent through its command API. The process is stopped by its
PID.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from services.common.ports import unused_tcp_port
from tests.support.peer_venv import ensure_peer_venv

IRONIC_VERSION = "39.0.0"
REPO = Path(__file__).resolve().parents[2]
START_TIMEOUT = 90.0
STOP_TIMEOUT = 10.0


def ensure_ironic_venv(version: str = IRONIC_VERSION) -> Path:
    """A virtualenv with ironic ``version``; its bin directory. Reused when present."""
    return ensure_peer_venv("ironic", f"ironic=={version}").parent


def schema_template(bin_dir: Path) -> Path:
    """An empty Ironic database made once by ``ironic-dbsync create_schema`` (about 5 s);
    each service starts from a copy of it."""
    template = bin_dir.parent / f"ferrum-schema-{IRONIC_VERSION}.sqlite"
    with open(bin_dir.parent / "ferrum-schema.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if template.exists():
            return template
        partial = template.with_suffix(".partial")
        partial.unlink(missing_ok=True)
        conf = bin_dir.parent / "ferrum-schema.conf"
        conf.write_text(f"[database]\nconnection = sqlite:///{partial}\n")
        subprocess.run(
            [str(bin_dir / "ironic-dbsync"), "--config-file", str(conf), "create_schema"],
            check=True,
            capture_output=True,
            timeout=300,
        )
        partial.rename(template)
    return template


def ironic_conf(workdir: Path, port: int) -> str:
    """The config: fake hardware, ``direct`` deploy, no cleaning, plain-HTTP agents, SQLite."""
    interfaces = "\n".join(
        f"enabled_{kind}_interfaces = fake"
        for kind in ("bios", "boot", "console", "firmware", "inspect", "power", "raid", "rescue", "vendor")
    )
    return f"""[DEFAULT]
auth_strategy = noauth
rpc_transport = none
host = ferrum-interop-ironic
debug = true
log_dir = {workdir}/log
log_file = ironic.log
state_path = {workdir}/state
enabled_hardware_types = fake-hardware
{interfaces}
enabled_deploy_interfaces = direct,fake
# The fake management interface only knows PXE, and the direct deploy sets the
# boot device to disk: nodes use noop management.
enabled_management_interfaces = noop,fake
default_deploy_interface = direct
enabled_network_interfaces = noop
enabled_storage_interfaces = noop
default_network_interface = noop
default_storage_interface = noop

[api]
host_ip = 127.0.0.1
port = {port}

[database]
connection = sqlite:///{workdir}/ironic.sqlite

[dhcp]
dhcp_provider = none

[service_catalog]
# The API URL the conductor hands the ramdisk (no keystone catalog here).
endpoint_override = http://127.0.0.1:{port}

[conductor]
automated_clean = false

[agent]
# The agent is given the image's own URL (no conductor-side cache or HTTP server).
image_download_source = http
# Ferrum's agent heartbeats with a plain-HTTP callback URL here.
require_tls = false
# Fake power never reads "off" after the agent's soft power off: give up on it quickly.
post_deploy_get_power_state_retries = 1
post_deploy_get_power_state_retry_interval = 1
command_timeout = 30

[deploy]
http_url = http://127.0.0.1:{port}/unused
http_root = {workdir}/httpboot

[vnc]
enabled = false
"""


@dataclass
class IronicService:
    url: str
    workdir: Path
    proc: subprocess.Popen[bytes]

    @property
    def log(self) -> Path:
        return self.workdir / "log" / "ironic.log"

    def tail(self, lines: int = 60) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return f"(no {self.log})"


def _wait_up(url: str, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"ironic exited ({proc.returncode}); see {log}")
        with contextlib.suppress(OSError, urllib.error.URLError), urllib.request.urlopen(url + "/v1", timeout=2) as r:
            if r.status == 200:
                return
        time.sleep(0.2)
    raise RuntimeError(f"ironic did not answer at {url} within {START_TIMEOUT}s; see {log}")


@contextlib.contextmanager
def ironic_service(workdir: Path, bin_dir: Path | None = None) -> Iterator[IronicService]:
    """Ironic's API and conductor at ``http://127.0.0.1:<free port>``; stopped by PID on exit."""
    bin_dir = bin_dir or ensure_ironic_venv()
    for sub in ("log", "state", "httpboot"):
        (workdir / sub).mkdir(parents=True, exist_ok=True)
    port = unused_tcp_port()
    conf = workdir / "ironic.conf"
    conf.write_text(ironic_conf(workdir, port))
    shutil.copyfile(schema_template(bin_dir), workdir / "ironic.sqlite")
    with open(workdir / "log" / "ironic.stdout", "wb") as out:
        proc = subprocess.Popen(
            [str(bin_dir / "ironic"), "--config-file", str(conf)],
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=workdir,
            start_new_session=True,
        )
    service = IronicService(url=f"http://127.0.0.1:{port}", workdir=workdir, proc=proc)
    try:
        _wait_up(service.url, proc, service.log)
        yield service
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


if __name__ == "__main__":  # scripts/bootstrap.sh: install now, not in the timed test run
    ready = ensure_ironic_venv()
    print(json.dumps({"bin": str(ready), "schema": str(schema_template(ready))}))
