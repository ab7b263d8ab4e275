"""A real OpenStack Cinder on this machine, for tests of the ``cinder`` storage interface.

:func:`cinder_service` is a (synchronous) context manager that brings up

* ``cinder`` from PyPI (``CINDER_VERSION``) in its own virtualenv,
  ``<repo>/.ferrum/cache/cinder-venv``, created on first use and reused
  (never in Ferrum's own environment: Cinder pins its own library versions);
* RabbitMQ from Debian as its own ``rabbitmq-server`` (user ``rabbitmq``,
  a private epmd, node name, mnesia and log dirs), AMQP and Erlang
  distribution on 127.0.0.1 at free ports; the system service never runs;
* a PostgreSQL database of its own (Ferrum's embedded launcher, ``cinder-manage
  db sync``), as a deployed Cinder has. Not SQLite: three processes writing one
  SQLite file refuse a transaction that read before another committed ("database
  is locked", without waiting), which on a loaded machine turned Cinder's volume
  create and metadata updates into 500s;
* ``cinder-api`` (Cinder's own eventlet WSGI server, one worker, auth
  ``noauth``), ``cinder-scheduler`` and ``cinder-volume``, the real processes;
* a real volume backend: Cinder's LVM driver on a volume group on a loop
  device, exported over iSCSI (CHAP on) by Debian's userspace ``tgtd`` at
  127.0.0.1 and an ephemeral port, through ``target_helper = tgtadm``.

This kernel has no device-mapper, so LVM cannot activate a logical volume.
LVM runs with ``activation = 0`` in a private lvm.conf (real allocation and
metadata on the PV) and ``tests/support/lvm_loop_shim.py``, first on
cinder-volume's PATH as ``lvcreate``/``lvremove``/``lvextend``/``lvchange``, maps each LV
onto a loop device over the same extents of the PV's backing file, which is
what dm-linear would do. Everything else (the driver, tgt-admin/tgtadm,
privsep, the iSCSI target's data) is Cinder's and tgt's own code.

Cinder's processes run as root (the LVM driver and tgt need it) with privsep
started directly (``helper_command = privsep-helper``, no sudo/rootwrap).
tgtd gets a private control socket (``TGT_IPC_SOCKET`` in the work dir) that
cinder-volume's tgtadm calls inherit, and tgt-admin finds Cinder's target
files through an ``include`` line in ``/etc/tgt/conf.d/ferrum-cinder-*.conf``
(Cinder's documented tgt set-up), removed on exit.

Everything is stopped by the PIDs started here, and the VG, loop devices, tgt
targets and conf file are removed; a crashed earlier run's leftovers (loop
devices over deleted files, a dangling conf.d include) are cleaned at start.
Run ``python -m tests.support.cinder_smoke`` for Ironic's whole attach/detach
sequence against it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from services.common.db.embedded import EmbeddedPostgres
from services.common.ports import unused_tcp_port
from tests.support.peer_venv import ensure_peer_venv, venv_path

LOG = logging.getLogger(__name__)

CINDER_VERSION = "29.0.0"
PSYCOPG2_VERSION = "2.9.13"  # oslo.db's PostgreSQL driver, in Cinder's own venv
REPO = Path(__file__).resolve().parents[2]
VENV = venv_path("cinder")
APT_PACKAGES = {  # Debian package: a file it installs
    "rabbitmq-server": "/usr/lib/rabbitmq/bin/rabbitmq-server",
    "lvm2": "/sbin/lvcreate",
    "tgt": "/usr/sbin/tgtd",
    "qemu-utils": "/usr/bin/qemu-io",  # the smoke script's iSCSI read/write (libiscsi is in qemu-block-extra)
    "qemu-block-extra": "/usr/lib/x86_64-linux-gnu/qemu/block-iscsi.so",
}
WORK_PREFIX = "ferrum-cinder-"
CONF_D = Path("/etc/tgt/conf.d")
PV_SIZE = 12 * 1024**3  # sparse: only what volumes write takes disk space
START_TIMEOUT = 120.0  # seconds from processes started to cinder-volume up with its pool
RABBIT_TIMEOUT = 45.0
STOP_TIMEOUT = 10.0
LOG_TAIL = 30
_LVM_BIN = "/sbin"


class _Step:
    """Timing of the start-up steps (printed once started, and in the info dict)."""

    def __init__(self) -> None:
        self.t0 = time.monotonic()
        self.times: dict[str, float] = {}
        self._last = self.t0

    def mark(self, name: str) -> None:
        now = time.monotonic()
        self.times[name] = round(now - self._last, 2)
        self._last = now

    @property
    def total(self) -> float:
        return round(time.monotonic() - self.t0, 2)


def _run(*cmd: str, env: dict[str, str] | None = None, timeout: float = 120.0, check: bool = True) -> str:
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout, check=False)
    if check and done.returncode != 0:
        raise RuntimeError(
            f"{' '.join(cmd)} failed ({done.returncode}): {(done.stderr or done.stdout).strip()[-2000:]}"
        )
    return done.stdout


def _tail(path: Path, lines: int = LOG_TAIL) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return f"(no {path})"
    return f"--- last lines of {path} ---\n" + "\n".join(text[-lines:])


# -- installation ------------------------------------------------------------------------------


def ensure_apt_packages() -> None:
    """rabbitmq-server, lvm2 and tgt from Debian, without starting their system services."""
    missing = [pkg for pkg, exe in APT_PACKAGES.items() if not os.path.exists(exe)]
    if not missing:
        return
    policy = Path("/usr/sbin/policy-rc.d")
    added_policy = False
    if not policy.exists():  # keep invoke-rc.d from starting rabbitmq-server/tgt as system services
        policy.write_text("#!/bin/sh\nexit 101\n")
        policy.chmod(0o755)
        added_policy = True
    try:
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        if not list(Path("/var/lib/apt/lists").glob("*Packages*")):
            _run("apt-get", "update", "-q", env=env, timeout=600)
        _run("apt-get", "install", "-y", "-q", *missing, env=env, timeout=900)
    finally:
        if added_policy:
            policy.unlink()


def ensure_cinder_venv() -> Path:
    """A virtualenv with cinder ``CINDER_VERSION``; its python. Reused when present."""
    return ensure_peer_venv("cinder", f"cinder=={CINDER_VERSION} psycopg2-binary=={PSYCOPG2_VERSION}")


# -- leftovers of crashed runs -----------------------------------------------------------------


def _clean_stale() -> None:
    """Loop devices over deleted ferrum-cinder files, conf.d includes of vanished dirs, dangling /dev links."""
    with contextlib.suppress(Exception):
        for dev in json.loads(_run("losetup", "-J", "-l"))["loopdevices"]:
            back = dev.get("back-file") or ""
            if f"/{WORK_PREFIX}" in back and (back.endswith("(deleted)") or not os.path.exists(back)):
                _run("losetup", "-d", dev["name"], check=False)
    for conf in CONF_D.glob("ferrum-cinder-*.conf"):
        with contextlib.suppress(OSError):
            include = conf.read_text().split()[1]
            if not Path(include).parent.exists():
                conf.unlink()
    for link_dir in (Path("/dev/mapper"), *Path("/dev").glob("ferrumcinder*")):
        for link in link_dir.glob("ferrumcinder*") if link_dir.name == "mapper" else link_dir.iterdir():
            if link.is_symlink() and not link.exists():
                link.unlink(missing_ok=True)
        if link_dir.name.startswith("ferrumcinder") and not any(link_dir.iterdir()):
            link_dir.rmdir()


# -- the service -------------------------------------------------------------------------------


class CinderService:
    """One Cinder with its RabbitMQ, tgtd and LVM volume group; :func:`cinder_service` drives it."""

    def __init__(self, python: Path) -> None:
        self.python = python
        self.bin = python.parent
        self.token = uuid.uuid4().hex[:8]
        self.work = Path(tempfile.mkdtemp(prefix=WORK_PREFIX, dir="/tmp"))
        self.work.chmod(0o755)
        self.logs = self.work / "log"
        self.logs.mkdir()
        self.vg = f"ferrumcinder{self.token}"
        self.project_id = uuid.uuid4().hex
        self.host = f"ferrum-cinder-{self.token}"
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.pv_file = self.work / "pv.img"
        self.pv_loop: str | None = None
        self.conf_d = CONF_D / f"ferrum-cinder-{self.token}.conf"
        self.tgt_dir = self.work / "tgt"
        self.lvm_dir = self.work / "lvm"
        self.shim_dir = self.work / "bin"
        self.api_port = 0
        self.iscsi_port = 0
        self.amqp_port = 0
        self.postgres = EmbeddedPostgres(self.work / "postgres", fsync=False)

    # environment -------------------------------------------------------------------------------

    def lvm_env(self) -> dict[str, str]:
        return {
            "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
            "LC_ALL": "C",
            "LVM_SYSTEM_DIR": str(self.lvm_dir),
            "LVM_SUPPRESS_FD_WARNINGS": "1",
        }

    def cinder_env(self) -> dict[str, str]:
        return {
            "PATH": f"{self.shim_dir}:{self.bin}:/usr/sbin:/usr/bin:/sbin:/bin",
            "HOME": str(self.work),
            "LANG": "C.UTF-8",
            "TGT_IPC_SOCKET": str(self.tgt_dir / "socket"),
            # every LVM command cinder runs (some without its LVM_SYSTEM_DIR prefix) reads our lvm.conf
            "LVM_SYSTEM_DIR": str(self.lvm_dir),
            "LVM_SUPPRESS_FD_WARNINGS": "1",
        }

    def rabbit_env(self, epmd_port: int, dist_port: int) -> dict[str, str]:
        rabbit = self.work / "rabbitmq"
        return {
            "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
            "HOME": "/var/lib/rabbitmq",  # its .erlang.cookie
            "LANG": "C.UTF-8",
            "ERL_EPMD_ADDRESS": "127.0.0.1",
            "ERL_EPMD_PORT": str(epmd_port),
            "RABBITMQ_NODENAME": f"ferrum-{self.token}@localhost",
            "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
            "RABBITMQ_NODE_PORT": str(self.amqp_port),
            "RABBITMQ_DIST_PORT": str(dist_port),
            "RABBITMQ_MNESIA_BASE": str(rabbit / "mnesia"),
            "RABBITMQ_LOG_BASE": str(rabbit / "log"),
            "RABBITMQ_CONFIG_FILE": str(rabbit / "rabbitmq"),
            "RABBITMQ_ADVANCED_CONFIG_FILE": str(rabbit / "advanced.config"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(rabbit / "enabled_plugins"),
            "RABBITMQ_PID_FILE": str(rabbit / "pid"),
            "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS": (
                "-kernel inet_dist_use_interface {127,0,0,1} "
                f"-kernel inet_dist_listen_min {dist_port} -kernel inet_dist_listen_max {dist_port}"
            ),
        }

    def _spawn(self, name: str, cmd: list[str], env: dict[str, str], *, user: str | None = None) -> None:
        log = open(self.logs / f"{name}.log", "ab")  # noqa: SIM115 - the child holds it
        try:
            prefix = ["setpriv", "--pdeathsig", "KILL"] if shutil.which("setpriv") else []
            self.procs[name] = subprocess.Popen(
                [*prefix, *cmd],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=str(self.work),
                user=user,
                group=user,
                start_new_session=True,
            )
        finally:
            log.close()

    def _check_alive(self, *names: str) -> None:
        for name in names:
            proc = self.procs.get(name)
            if proc is not None and proc.poll() is not None:
                raise RuntimeError(f"{name} exited with status {proc.returncode}\n{_tail(self.logs / f'{name}.log')}")

    # start -------------------------------------------------------------------------------------

    def start(self) -> dict[str, Any]:
        steps = _Step()
        _clean_stale()
        self._start_rabbitmq()  # boots in the background while the rest is set up
        steps.mark("rabbitmq launched")
        self._make_volume_group()
        steps.mark("volume group")
        self._start_tgtd()
        steps.mark("tgtd")
        self.postgres.start()
        self.postgres.create_database("cinder")
        steps.mark("postgres")
        conf = self._write_conf()
        _run(
            str(self.bin / "cinder-manage"),
            "--config-file",
            str(conf),
            "db",
            "sync",
            env=self.cinder_env(),
            timeout=300,
        )
        steps.mark("db sync")
        self._wait_rabbitmq()
        steps.mark("rabbitmq up")
        commands = {
            name: [str(self.bin / name), "--config-file", str(conf), "--log-file", str(self.logs / f"{name}.log")]
            for name in ("cinder-api", "cinder-scheduler", "cinder-volume")
        }
        for name, cmd in commands.items():
            self._spawn(name, cmd, self.cinder_env())
        self._wait_cinder()
        steps.mark("cinder up")
        info = {
            "url": f"http://127.0.0.1:{self.api_port}/v3",
            "project_id": self.project_id,
            "token": f"ferrum:{self.project_id}",
            "headers": {"X-Auth-Token": f"ferrum:{self.project_id}", "Accept": "application/json"},
            "api_port": self.api_port,
            "iscsi_portal": f"127.0.0.1:{self.iscsi_port}",
            "volume_backend_host": f"{self.host}@lvm#lvm",
            "volume_group": self.vg,
            "work_dir": str(self.work),
            "logs": str(self.logs),
            "tgt_ipc_socket": str(self.tgt_dir / "socket"),
            "pids": {name: proc.pid for name, proc in self.procs.items()},
            "startup_seconds": steps.total,
            "startup_steps": steps.times,
        }
        msg = f"cinder_service: Cinder {CINDER_VERSION} up in {steps.total:.1f}s {steps.times} at {info['url']}"
        LOG.warning("%s", msg)
        print(msg, file=sys.stderr)
        return info

    def _start_rabbitmq(self) -> None:
        rabbit = self.work / "rabbitmq"
        for sub in ("mnesia", "log"):
            (rabbit / sub).mkdir(parents=True)
        (rabbit / "rabbitmq.conf").write_text("loopback_users = none\n")
        (rabbit / "advanced.config").write_text("[].\n")
        (rabbit / "enabled_plugins").write_text("[].\n")
        shutil.chown(rabbit, "rabbitmq", "rabbitmq")
        for path in rabbit.rglob("*"):
            shutil.chown(path, "rabbitmq", "rabbitmq")
        epmd_port, dist_port, self.amqp_port = unused_tcp_port(), unused_tcp_port(), unused_tcp_port()
        env = self.rabbit_env(epmd_port, dist_port)
        # Our own epmd in the foreground: one erl would otherwise daemonize a shared one that outlives us.
        self._spawn("epmd", ["epmd", "-address", "127.0.0.1", "-port", str(epmd_port)], env, user="rabbitmq")
        self._spawn("rabbitmq", ["/usr/lib/rabbitmq/bin/rabbitmq-server"], env, user="rabbitmq")

    def _wait_rabbitmq(self) -> None:
        deadline = time.monotonic() + RABBIT_TIMEOUT
        while True:
            self._check_alive("epmd", "rabbitmq")
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.amqp_port), 0.5) as sock:
                sock.sendall(b"AMQP\x00\x00\x09\x01")  # a real broker answers the protocol header
                sock.settimeout(2)
                if sock.recv(8).startswith(b"\x01\x00\x00"):
                    return
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"rabbitmq-server did not accept AMQP on 127.0.0.1:{self.amqp_port} in {RABBIT_TIMEOUT:g}s\n"
                    f"{_tail(self.logs / 'rabbitmq.log')}"
                )
            time.sleep(0.2)

    def _make_volume_group(self) -> None:
        self.lvm_dir.mkdir()
        # activation = 0: no device-mapper here (see the module doc); the filter keeps
        # this LVM to our loop device alone.
        (self.lvm_dir / "lvm.conf").write_text(
            "global {\n  activation = 0\n  use_lvmlockd = 0\n}\n"
            "devices {\n  use_devicesfile = 0\n  obtain_device_list_from_udev = 0\n"
            '  external_device_info_source = "none"\n  filter = [ "a|^/dev/loop[0-9]+$|", "r|.*|" ]\n}\n'
            "activation {\n  udev_sync = 0\n  udev_rules = 0\n  monitoring = 0\n}\n"
            "backup {\n  backup = 0\n  archive = 0\n}\n"
        )
        with open(self.pv_file, "wb") as f:
            f.truncate(PV_SIZE)
        self.pv_loop = _run("losetup", "--find", "--show", str(self.pv_file)).strip()
        env = self.lvm_env()
        _run("pvcreate", "-q", self.pv_loop, env=env)
        _run("vgcreate", "-q", self.vg, self.pv_loop, env=env)
        self.shim_dir.mkdir()
        shim = self.shim_dir / "lvm_loop_shim.py"
        shutil.copy(Path(__file__).with_name("lvm_loop_shim.py"), shim)
        shim.chmod(0o755)
        (self.shim_dir / "lvm-loop-shim.json").write_text(
            json.dumps(
                {
                    "vg": self.vg,
                    "pv_file": str(self.pv_file),
                    "real_dir": _LVM_BIN,
                    "state_dir": str(self.work / "lv-loops"),
                }
            )
        )
        for tool in ("lvcreate", "lvremove", "lvextend", "lvchange"):
            (self.shim_dir / tool).symlink_to(shim)

    def _tgtadm(self, *args: str, check: bool = True) -> str:
        env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "TGT_IPC_SOCKET": str(self.tgt_dir / "socket")}
        return _run("tgtadm", "-C", "0", *args, env=env, timeout=15, check=check)

    def _start_tgtd(self) -> None:
        self.tgt_dir.mkdir()
        env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "TGT_IPC_SOCKET": str(self.tgt_dir / "socket")}
        self._spawn("tgtd", ["tgtd", "-f", "-C", "0", "--iscsi", "portal=127.0.0.1:0"], env)
        deadline = time.monotonic() + 15
        while True:
            self._check_alive("tgtd")
            with contextlib.suppress(RuntimeError):
                listing = self._tgtadm("--lld", "iscsi", "--op", "show", "--mode", "portal")
                portals = [line.split()[1].rsplit(",", 1)[0] for line in listing.splitlines() if "Portal:" in line]
                # tgtd that cannot bind falls back to every interface at 3260: refuse that.
                if len(portals) != 1 or not portals[0].startswith("127.0.0.1:"):
                    raise RuntimeError(f"tgtd listens on {portals}, not on one 127.0.0.1 portal")
                self.iscsi_port = int(portals[0].rsplit(":", 1)[1])
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"tgtd did not answer on its control socket\n{_tail(self.logs / 'tgtd.log')}")
            time.sleep(0.1)
        volumes = self.work / "tgt-volumes"
        volumes.mkdir()
        CONF_D.mkdir(parents=True, exist_ok=True)
        self.conf_d.write_text(f"include {volumes}/*\n")

    def _write_conf(self) -> Path:
        self.api_port = unused_tcp_port()
        state = self.work / "state"
        state.mkdir()
        helper = f"{self.bin / 'privsep-helper'} --config-file {self.work / 'cinder.conf'}"
        conf = self.work / "cinder.conf"
        conf.write_text(
            f"""[DEFAULT]
host = {self.host}
my_ip = 127.0.0.1
auth_strategy = noauth
transport_url = rabbit://guest:guest@127.0.0.1:{self.amqp_port}/
state_path = {state}
api_paste_config = {VENV / "etc" / "cinder" / "api-paste.ini"}
osapi_volume_listen = 127.0.0.1
osapi_volume_listen_port = {self.api_port}
osapi_volume_workers = 1
enabled_backends = lvm
default_volume_type = __DEFAULT__
report_interval = 2
periodic_interval = 5
debug = true
use_stderr = false
rpc_response_timeout = 30

[database]
connection = {self.postgres.database_url("cinder").replace("postgresql://", "postgresql+psycopg2://", 1)}

[oslo_concurrency]
lock_path = {state / "locks"}

[coordination]
backend_url = file://{state / "coordination"}

[cinder_sys_admin]
helper_command = {helper}

[privsep_osbrick]
helper_command = {helper}

[lvm]
volume_driver = cinder.volume.drivers.lvm.LVMVolumeDriver
volume_backend_name = lvm
volume_group = {self.vg}
lvm_type = default
lvm_conf_file = {self.lvm_dir / "lvm.conf"}
volume_clear = none
target_helper = tgtadm
target_protocol = iscsi
target_ip_address = 127.0.0.1
target_port = {self.iscsi_port}
volumes_dir = {self.work / "tgt-volumes"}
use_chap_auth = true
"""
        )
        return conf

    def _get(self, path: str, timeout: float = 3.0) -> Any:
        req = urllib.request.Request(
            f"http://127.0.0.1:{self.api_port}/v3/{self.project_id}{path}",
            headers={"X-Auth-Token": f"ferrum:{self.project_id}", "Accept": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return json.loads(resp.read())

    def _wait_cinder(self) -> None:
        """cinder-volume ``up`` in os-services and its pool known to the scheduler."""
        deadline = time.monotonic() + START_TIMEOUT
        last = "no answer yet"
        while True:
            self._check_alive("cinder-api", "cinder-scheduler", "cinder-volume", "rabbitmq", "tgtd")
            try:
                services = self._get("/os-services")["services"]
                volume = [s for s in services if s["binary"] == "cinder-volume"]
                last = f"services {[(s['binary'], s['host'], s['state']) for s in services]}"
                if volume and all(s["state"] == "up" for s in volume):
                    pools = self._get("/scheduler-stats/get_pools")["pools"]
                    last += f", pools {[p['name'] for p in pools]}"
                    if pools:
                        return
            except (OSError, urllib.error.URLError, ValueError, KeyError) as exc:
                last = f"{type(exc).__name__}: {exc}"
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"Cinder did not come up in {START_TIMEOUT:g}s (last: {last})\n"
                    + "\n".join(
                        _tail(self.logs / f"{n}.log") for n in ("cinder-api", "cinder-scheduler", "cinder-volume")
                    )
                )
            time.sleep(0.5)

    # stop --------------------------------------------------------------------------------------

    def _stop_process(self, name: str) -> None:
        proc = self.procs.pop(name, None)
        if proc is None or proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)
        # the session's other members (cinder-api's worker, erl_child_setup, ...)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)

    def _our_leftover_pids(self) -> list[int]:
        """Processes whose command line names this run's work dir (privsep daemons detach from cinder-volume)."""
        pids = []
        marker = str(self.work).encode()
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) == os.getpid():
                continue
            with contextlib.suppress(OSError):
                if marker in (entry / "cmdline").read_bytes():
                    pids.append(int(entry.name))
        return pids

    def stop(self) -> None:
        errors: list[str] = []
        for name in ("cinder-api", "cinder-volume", "cinder-scheduler"):
            try:
                self._stop_process(name)
            except Exception as exc:
                errors.append(f"{name}: {exc}")
        for pid in self._our_leftover_pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        try:
            self._stop_tgtd()
        except Exception as exc:
            errors.append(f"tgtd: {exc}")
        for name in ("rabbitmq", "epmd"):
            try:
                self._stop_process(name)
            except Exception as exc:
                errors.append(f"{name}: {exc}")
        try:
            self.postgres.stop()
        except Exception as exc:
            errors.append(f"postgres: {exc}")
        self.conf_d.unlink(missing_ok=True)
        try:
            self._remove_volume_group()
        except Exception as exc:
            errors.append(f"lvm: {exc}")
        if errors:
            LOG.error("cinder_service: cleanup problems: %s (work dir kept: %s)", errors, self.work)
            raise RuntimeError(f"cinder_service cleanup: {errors}; logs in {self.logs}")
        if os.environ.get("FERRUM_CINDER_KEEP_LOGS"):
            kept = Path(tempfile.gettempdir()) / f"ferrum-cinder-logs-{self.token}"
            shutil.copytree(self.logs, kept)
            print(f"cinder_service: logs kept in {kept}", file=sys.stderr)
        shutil.rmtree(self.work, ignore_errors=True)

    def _stop_tgtd(self) -> None:
        proc = self.procs.get("tgtd")
        if proc is None:
            return
        if proc.poll() is None:
            listing = self._tgtadm("--lld", "iscsi", "--op", "show", "--mode", "target", check=False)
            for line in listing.splitlines():
                if line.startswith("Target "):
                    tid = line.split()[1].rstrip(":")
                    self._tgtadm(
                        "--lld", "iscsi", "--op", "delete", "--mode", "target", "--tid", tid, "--force", check=False
                    )
            # tgtd ignores SIGTERM; it exits on "delete system" once it has no target left.
            self._tgtadm("--op", "delete", "--mode", "system", check=False)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(5)
        self._stop_process("tgtd")

    def _remove_volume_group(self) -> None:
        state = self.work / "lv-loops"
        if state.exists():
            for record in state.iterdir():
                if record.name.startswith("."):
                    continue
                mapper = Path("/dev/mapper") / f"{self.vg}-{record.name.replace('-', '--')}"
                for link in (Path("/dev") / self.vg / record.name, mapper):
                    link.unlink(missing_ok=True)
                _run("losetup", "-d", record.read_text().strip(), check=False)
        vg_dir = Path("/dev") / self.vg
        if vg_dir.is_dir():
            shutil.rmtree(vg_dir, ignore_errors=True)
        if self.pv_loop:
            env = self.lvm_env()
            _run("vgremove", "-f", "-q", self.vg, env=env, check=False)
            _run("pvremove", "-f", "-q", self.pv_loop, env=env, check=False)
        # every loop device still over our PV file (the PV's and any LV the shim mapped)
        for dev in json.loads(_run("losetup", "-J", "-l") or '{"loopdevices": []}').get("loopdevices", []):
            if (dev.get("back-file") or "").startswith(str(self.pv_file)):
                _run("losetup", "-d", dev["name"], check=False)
        mapper_dir = Path("/dev/mapper")
        with contextlib.suppress(OSError):
            if mapper_dir.is_dir() and not any(mapper_dir.iterdir()):
                mapper_dir.rmdir()
        self.pv_loop = None


@contextlib.contextmanager
def cinder_service() -> Iterator[dict[str, Any]]:
    """A running Cinder (see the module doc); yields its url, project_id, auth headers and details.

    Raises RuntimeError with the relevant log lines when something does not start.
    """
    if os.geteuid() != 0:
        raise RuntimeError("cinder_service needs root (loop devices, LVM, tgtd, rabbitmq's user switch)")
    ensure_apt_packages()
    python = ensure_cinder_venv()
    service = CinderService(python)
    try:
        info = service.start()
    except BaseException:
        with contextlib.suppress(Exception):
            service.stop()
        raise
    try:
        yield info
    finally:
        service.stop()


if __name__ == "__main__":
    # scripts/bootstrap.sh: install what the real-Cinder tests need now, so the test run
    # does not spend its time on a pip install (python -m tests.support.cinder_service).
    ensure_apt_packages()
    ensure_cinder_venv()
