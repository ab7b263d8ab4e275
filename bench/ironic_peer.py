"""OpenStack Ironic 39 as a benchmark peer: the all-in-one ``ironic`` process on
PostgreSQL, configured as ``/work/shared/ironic/ironic.conf.in`` is (noauth, no
RPC bus, fake hardware with fake interfaces, noop network and storage).

It differs from ``/work/shared/ironic/start.sh`` only in where things live, so
that it can run beside other engineers' copies: a free port instead of 6385,
and its own PostgreSQL cluster (Ferrum's embedded launcher, fsync on as in
``ferrum stack``) in a temporary directory instead of port 5433. Ironic itself
comes from ``tests/support/ironic_service.ensure_ironic_venv`` (installed once,
about a minute) plus ``psycopg2-binary``, which ``setup.sh`` installs too.
Both processes are stopped by PID.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from services.common.db.embedded import EmbeddedPostgres  # noqa: E402
from services.common.ports import unused_tcp_port  # noqa: E402
from tests.support.ironic_service import ensure_ironic_venv  # noqa: E402

INTERFACES = ("bios", "boot", "console", "deploy", "firmware", "inspect", "management", "power", "raid", "rescue")


def ironic_conf(workdir: Path, port: int, database: str) -> str:
    fake = "\n".join(f"enabled_{kind}_interfaces = fake" for kind in (*INTERFACES, "vendor"))
    return f"""[DEFAULT]
auth_strategy = noauth
rpc_transport = none
host = bench-ironic
debug = false
log_dir = {workdir}/log
log_file = ironic.log
state_path = {workdir}/state
enabled_hardware_types = fake-hardware
{fake}
enabled_network_interfaces = noop
enabled_storage_interfaces = noop
default_network_interface = noop
default_storage_interface = noop

[api]
host_ip = 127.0.0.1
port = {port}

[database]
connection = {database}

[dhcp]
dhcp_provider = none

[vnc]
enabled = false
"""


def _with_psycopg2(bin_dir: Path) -> None:
    python = str(bin_dir / "python")
    if subprocess.run([python, "-c", "import psycopg2"], capture_output=True, check=False).returncode == 0:
        return
    subprocess.run([python, "-m", "pip", "install", "-q", "psycopg2-binary"], check=True, timeout=600)


@contextlib.contextmanager
def ironic_peer(workdir: Path) -> Iterator[tuple[str, int]]:
    """``(url, pid)`` of a running Ironic 39 on PostgreSQL; everything stopped on exit."""
    bin_dir = ensure_ironic_venv()
    _with_psycopg2(bin_dir)
    for sub in ("log", "state"):
        (workdir / sub).mkdir(parents=True, exist_ok=True)
    postgres = EmbeddedPostgres(workdir / "postgres", fsync=True)
    postgres.start()
    proc: subprocess.Popen[bytes] | None = None
    try:
        postgres.create_database("ironic")
        database = postgres.database_url("ironic").replace("postgresql://", "postgresql+psycopg2://", 1)
        port = unused_tcp_port()
        conf = workdir / "ironic.conf"
        conf.write_text(ironic_conf(workdir, port, database))
        subprocess.run(
            [str(bin_dir / "ironic-dbsync"), "--config-file", str(conf), "upgrade"],
            check=True,
            capture_output=True,
            timeout=600,
        )
        with open(workdir / "log" / "ironic.stdout", "wb") as out:
            proc = subprocess.Popen(
                [str(bin_dir / "ironic"), "--config-file", str(conf)],
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=workdir,
                start_new_session=True,
            )
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"ironic exited ({proc.returncode}); see {workdir}/log")
            with (
                contextlib.suppress(OSError, urllib.error.URLError),
                urllib.request.urlopen(url + "/v1", timeout=2) as answer,
            ):
                if answer.status == 200:
                    break
            if time.monotonic() > deadline:
                raise RuntimeError(f"ironic did not answer within 120 s; see {workdir}/log")
            time.sleep(0.2)
        yield url, proc.pid
    finally:
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        postgres.stop()
