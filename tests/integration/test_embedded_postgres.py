"""Integration tests for the embedded PostgreSQL launcher (real server, no mocks)."""

from __future__ import annotations

import asyncio
import base64
import os
import pathlib
import shutil
import socket
import stat
import subprocess
import sys
import time

import asyncpg
import pytest

from services.common.db import credentials, embedded, embedded_access, migrate
from services.common.db.embedded import EmbeddedPostgres, EmbeddedPostgresError


def _process_gone(pid: int) -> bool:
    """True if ``pid`` no longer exists or is a zombie (PID 1 may not reap)."""
    try:
        stat_line = pathlib.Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat_line.rpartition(")")[2].split()[0] == "Z"


def _wait_gone(pid: int, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while not _process_gone(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _real_uid(pid: int) -> int:
    for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Uid:"):
            return int(line.split()[1])
    raise AssertionError(f"no Uid line for pid {pid}")


def _dead_pid() -> int:
    """A PID that certainly belonged to a process which has exited."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


async def _query(url: str, sql: str) -> object:
    conn = await asyncpg.connect(url, timeout=10)
    try:
        return await conn.fetchval(sql)
    finally:
        await conn.close()


async def _execute(url: str, sql: str) -> None:
    conn = await asyncpg.connect(url, timeout=10)
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


def test_start_query_restart_stop(tmp_path: pathlib.Path) -> None:
    pg = EmbeddedPostgres(tmp_path / "pg", fsync=False)
    url = pg.start()
    try:
        password = pg.service_password_file.read_text().strip()
        assert url.startswith(f"postgresql://ferrum:{password}@127.0.0.1:")
        assert url == pg.url
        assert pg.start() == url  # idempotent while running
        assert asyncio.run(_query(url, "SELECT 1")) == 1
        assert asyncio.run(_query(url, "SELECT current_user")) == "ferrum"
        assert asyncio.run(_query(pg.superuser_url(), "SELECT current_user")) == "postgres"

        pid = pg.pid
        assert pid is not None
        uid = _real_uid(pid)
        if os.geteuid() == 0:
            assert uid != 0, "postgres must not run as root"
        else:
            assert uid == os.geteuid()
        assert (tmp_path / "pg" / "pgdata" / "PG_VERSION").is_file()
        assert (tmp_path / "pg" / "postgres.log").is_file()

        pg.create_database("kept")
        kept = pg.database_url("kept")
        asyncio.run(_execute(kept, "CREATE TABLE persisted (v int); INSERT INTO persisted VALUES (42)"))

        pg.create_database("scratch db")
        pg.create_database("clone", template="scratch db")
        assert asyncio.run(_query(pg.database_url("clone"), "SELECT current_database()")) == "clone"
        pg.drop_database("clone")
        pg.drop_database("scratch db")
        pg.drop_database("never existed")  # --if-exists
        with pytest.raises(EmbeddedPostgresError, match="does not exist"):
            pg.create_database("x", template="no_such_template")

        pg.stop()
        assert _wait_gone(pid), f"postmaster {pid} still alive after stop()"
        assert pg.pid is None
        with pytest.raises(EmbeddedPostgresError):
            _ = pg.url

        # Restart on the same data dir: no initdb, data persists.
        url2 = pg.start()
        assert pg.pid not in (None, pid)
        assert url2 == url  # same port and password after a restart
        assert asyncio.run(_query(pg.database_url("kept"), "SELECT v FROM persisted")) == 42
    finally:
        pg.stop()
    pg.stop()  # stopping twice is harmless


def test_stale_postmaster_pid_is_removed(tmp_path: pathlib.Path) -> None:
    data_dir = tmp_path / "pg"
    with EmbeddedPostgres(data_dir, fsync=False) as pg:
        first_pid = pg.pid
        assert first_pid is not None
    assert _wait_gone(first_pid)

    pid_file = data_dir / "pgdata" / "postmaster.pid"
    for stale_pid in (_dead_pid(), os.getpid()):  # dead, and alive-but-not-postgres (PID reuse)
        pid_file.write_text(f"{stale_pid}\n{data_dir / 'pgdata'}\n1700000000\n5432\n\n\n")
        with EmbeddedPostgres(data_dir, fsync=False) as pg:
            assert pg.pid not in (None, stale_pid)
            assert asyncio.run(_query(pg.url, "SELECT 1")) == 1
        assert not pid_file.exists()


def test_crashed_server_is_recovered(tmp_path: pathlib.Path) -> None:
    data_dir = tmp_path / "pg"
    pg = EmbeddedPostgres(data_dir, fsync=False)
    pg.start()
    pid = pg.pid
    assert pid is not None
    os.kill(pid, 9)
    assert _wait_gone(pid)
    with EmbeddedPostgres(data_dir, fsync=False) as pg2:
        assert asyncio.run(_query(pg2.url, "SELECT 1")) == 1


def test_refuses_to_hijack_running_server(tmp_path: pathlib.Path) -> None:
    with EmbeddedPostgres(tmp_path / "pg", fsync=False) as pg:
        other = EmbeddedPostgres(tmp_path / "pg", fsync=False)
        with pytest.raises(EmbeddedPostgresError, match="already running"):
            other.start()
        assert pg.pid is not None


def test_long_data_dir_uses_short_socket_dir(tmp_path: pathlib.Path) -> None:
    data_dir = tmp_path / ("d" * 60) / ("e" * 60)
    assert len(str(data_dir)) > 107
    with EmbeddedPostgres(data_dir, fsync=False) as pg:
        sock_dir = pg._temp_socket_dir
        assert sock_dir is not None and str(sock_dir).startswith("/tmp/")
        assert sock_dir == pg.socket_dir
        assert stat.S_IMODE(sock_dir.stat().st_mode) == 0o700
        assert (sock_dir / f".s.PGSQL.{pg.port}").exists()
        assert asyncio.run(_query(pg.url, "SELECT 1")) == 1
    assert not sock_dir.exists()


def test_port_in_use(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocker = socket.socket()
    blocker.bind(("127.0.0.1", 0))
    blocker.listen()
    busy = blocker.getsockname()[1]
    try:
        # Fixed port: fail with the log tail in a one-line message.
        with pytest.raises(EmbeddedPostgresError) as info:
            EmbeddedPostgres(tmp_path / "pg", port=busy, fsync=False).start()
        message = str(info.value)
        assert "\n" not in message
        assert "could not" in message.lower() and str(busy) in message

        # Auto port: the probe raced with another process; the launcher retries.
        real_pick = embedded._pick_free_port
        picks = iter([busy])
        monkeypatch.setattr(embedded, "_pick_free_port", lambda host: next(picks, None) or real_pick(host))
        with EmbeddedPostgres(tmp_path / "pg", fsync=False) as pg:
            assert pg.port not in (None, busy)
            assert asyncio.run(_query(pg.url, "SELECT 1")) == 1
    finally:
        blocker.close()


def test_pginstall_bin_dir() -> None:
    bin_dir = embedded.pginstall_bin_dir()
    for name in ("initdb", "pg_ctl", "postgres", "createdb", "dropdb"):
        assert os.access(bin_dir / name, os.X_OK), name


# ---------------------------------------------------------------------------
# Access control (issue 16): no local user is trusted
# ---------------------------------------------------------------------------

RUNUSER = shutil.which("runuser") or "/usr/sbin/runuser"
AS_ROOT = os.geteuid() == 0
LEGACY_TRUST_HBA = """\
# TYPE  DATABASE        USER            ADDRESS                 METHOD
local   all             all                                     trust
host    all             all             127.0.0.1/32            trust
host    all             all             ::1/128                 trust
local   replication     all                                     trust
host    replication     all             127.0.0.1/32            trust
host    replication     all             ::1/128                 trust
"""


def _psql_as_other_user(
    pg: EmbeddedPostgres, host: str, *, user: str, password: str | None = None
) -> subprocess.CompletedProcess[str]:
    """``psql -c 'SELECT current_user'`` as the unprivileged ``nobody`` (as ourselves when not root).

    Not root, we cannot become another user; the checks still hold for us,
    since being the same OS user grants nothing without the password.
    """
    env = {
        "PATH": "/usr/bin:/bin",
        "PGPASSFILE": "/nonexistent/pgpass",
        "PGSSLMODE": "disable",
        "PGGSSENCMODE": "disable",
        "PGCONNECT_TIMEOUT": "10",
    }
    if password is not None:
        env["PGPASSWORD"] = password
    psql = str(embedded.pginstall_bin_dir() / "psql")
    cmd = [
        psql,
        "-X",
        "-w",
        "-h",
        host,
        "-p",
        str(pg.port),
        "-U",
        user,
        "-d",
        "postgres",
        "-Atc",
        "SELECT current_user",
    ]
    if AS_ROOT:
        cmd = [RUNUSER, "-u", "nobody", "--", *cmd]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=30, cwd="/", check=False)


def _refused(result: subprocess.CompletedProcess[str], reason: str) -> None:
    assert result.returncode != 0, f"connected: {result.stdout!r}"
    assert reason in result.stderr, result.stderr


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> object:
    """One server for the access checks, in a world-readable directory like the test fixtures' (0755)."""
    data_dir = tmp_path_factory.mktemp("secured")
    os.chmod(data_dir, 0o755)
    with EmbeddedPostgres(data_dir, fsync=False) as pg:
        pg.create_database("app")
        asyncio.run(migrate.upgrade(pg.database_url("app")))
        yield pg


def test_other_local_users_need_the_password_over_tcp(secured: EmbeddedPostgres) -> None:
    for role in ("postgres", "ferrum"):
        _refused(_psql_as_other_user(secured, "127.0.0.1", user=role), "no password supplied")
    su_password = secured.superuser_password_file.read_text().strip()
    for role in ("postgres", "ferrum"):
        _refused(
            _psql_as_other_user(secured, "127.0.0.1", user=role, password="wrong-" + su_password),
            f'password authentication failed for user "{role}"',
        )
    # Control: the same command with the real password connects, so the refusals above are the authentication's.
    allowed = _psql_as_other_user(secured, "127.0.0.1", user="postgres", password=su_password)
    assert allowed.returncode == 0 and allowed.stdout.strip() == "postgres", allowed.stderr


def test_unix_socket_is_closed_to_others_and_needs_the_password(secured: EmbeddedPostgres) -> None:
    socket_dir = str(secured.socket_dir)
    if AS_ROOT:
        _refused(_psql_as_other_user(secured, socket_dir, user="postgres"), "Permission denied")
        listing = subprocess.run(
            [RUNUSER, "-u", "nobody", "--", "ls", socket_dir], capture_output=True, text=True, check=False
        )
        assert listing.returncode != 0 and "Permission denied" in listing.stderr
    # Even the users who can reach the socket (the server's, root) must prove the password.
    psql = str(embedded.pginstall_bin_dir() / "psql")
    cmd = [psql, "-X", "-w", "-h", socket_dir, "-p", str(secured.port), "-U", "postgres", "-d", "postgres"]
    env = {"PATH": "/usr/bin:/bin", "PGPASSFILE": "/nonexistent/pgpass"}
    no_password = subprocess.run([*cmd, "-c", "SELECT 1"], capture_output=True, text=True, env=env, check=False)
    _refused(no_password, "no password supplied")
    password = secured.superuser_password_file.read_text().strip()
    with_password = subprocess.run(
        [*cmd, "-Atc", "SELECT 1"], capture_output=True, text=True, env={**env, "PGPASSWORD": password}, check=False
    )
    assert with_password.returncode == 0 and with_password.stdout.strip() == "1", with_password.stderr


def test_passwords_and_socket_directory_are_private(secured: EmbeddedPostgres) -> None:
    for path in (secured.superuser_password_file, secured.service_password_file):
        info = path.lstat()
        assert stat.S_ISREG(info.st_mode) and stat.S_IMODE(info.st_mode) == 0o600, path
        assert info.st_uid == os.geteuid(), path
        assert len(path.read_text().strip()) >= 40
    assert secured.superuser_password_file.read_text() != secured.service_password_file.read_text()
    socket_dir = secured.socket_dir.stat()
    assert stat.S_IMODE(socket_dir.st_mode) == 0o700  # was 0755 before start
    assert secured.pid is not None
    assert socket_dir.st_uid == _real_uid(secured.pid)  # the server's user
    assert (secured.pgdata / "pg_hba.conf").read_text() == embedded_access.HBA_CONF
    # Only the IPv4 loopback address is listened on (state 0A = LISTEN).
    listening = [
        line.split()[1]
        for table in ("/proc/net/tcp", "/proc/net/tcp6")
        for line in pathlib.Path(table).read_text().splitlines()[1:]
        if line.split()[3] == "0A" and line.split()[1].endswith(f":{secured.port:04X}")
    ]
    assert listening == [f"0100007F:{secured.port:04X}"]
    # Every password in the catalogue is a SCRAM verifier.
    methods = asyncio.run(
        _query(
            secured.superuser_url(),
            "SELECT array_agg(DISTINCT left(rolpassword, 14)) FROM pg_authid WHERE rolpassword IS NOT NULL",
        )
    )
    assert methods == ["SCRAM-SHA-256$"]


def test_service_role_is_not_a_superuser(secured: EmbeddedPostgres) -> None:
    url = secured.database_url("app")

    async def check() -> None:
        conn = await asyncpg.connect(url, timeout=10)
        try:
            role = await conn.fetchrow("SELECT * FROM pg_roles WHERE rolname = current_user")
            assert role is not None
            assert role["rolname"] == "ferrum"
            assert not any(
                role[k] for k in ("rolsuper", "rolcreaterole", "rolcreatedb", "rolreplication", "rolbypassrls")
            )
            assert await conn.fetchval("SELECT count(*) FROM pg_auth_members WHERE member = $1", role["oid"]) == 0
            assert (
                await conn.fetchval("SELECT pg_get_userbyid(datdba) FROM pg_database WHERE datname = 'app'") == "ferrum"
            )
            for statement in (
                "COPY (SELECT 1) TO PROGRAM 'id'",
                "COPY (SELECT 1) TO '/tmp/ferrum-must-not-exist'",
                "SELECT pg_read_file('pg_hba.conf')",
                "CREATE DATABASE other",
                "CREATE ROLE other",
                "ALTER ROLE ferrum SUPERUSER",
                "ALTER SYSTEM SET log_statement = 'all'",
                "SELECT rolpassword FROM pg_authid",
            ):
                with pytest.raises(asyncpg.InsufficientPrivilegeError):
                    await conn.execute(statement)
            assert not pathlib.Path("/tmp/ferrum-must-not-exist").exists()
        finally:
            await conn.close()

    asyncio.run(check())


def test_service_role_has_what_the_services_need(secured: EmbeddedPostgres) -> None:
    """DML and DDL in its database, LISTEN/NOTIFY (renderer), session advisory locks seen in pg_locks
    from another session (conductor liveness), and ending its own backends."""
    url = secured.database_url("app")

    async def check() -> None:
        listener = await asyncpg.connect(url, timeout=10)
        worker = await asyncpg.connect(url, timeout=10)
        try:
            heard: asyncio.Queue[str] = asyncio.Queue()
            await listener.add_listener("ferrum_node_events", lambda *args: heard.put_nowait(args[3]))
            sequence = await worker.fetchval(
                "INSERT INTO node_events (node_uuid, event) VALUES (gen_random_uuid(), 'test') RETURNING sequence"
            )
            assert await asyncio.wait_for(heard.get(), 10) == str(sequence)
            await worker.execute("CREATE TABLE scratch (v int); DROP TABLE scratch")

            assert await worker.fetchval("SELECT pg_try_advisory_lock(42)") is True
            assert await listener.fetchval("SELECT pg_try_advisory_lock(42)") is False
            holder = await listener.fetchval(
                "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND objid = 42 AND granted"
            )
            assert holder == worker.get_server_pid()
            assert await listener.fetchval("SELECT pg_terminate_backend($1)", holder) is True
        finally:
            await listener.close()
            await worker.close(timeout=5)

    asyncio.run(check())


def test_our_scram_verifier_is_the_servers(secured: EmbeddedPostgres) -> None:
    """The verifier Ferrum computes (so the plaintext never reaches the server) matches PostgreSQL's own."""

    async def stored_verifier() -> str:
        conn = await asyncpg.connect(secured.superuser_url(), timeout=10)
        try:
            await conn.execute("CREATE ROLE verifier_check PASSWORD 'pencil'")
            try:
                return str(await conn.fetchval("SELECT rolpassword FROM pg_authid WHERE rolname = 'verifier_check'"))
            finally:
                await conn.execute("DROP ROLE verifier_check")
        finally:
            await conn.close()

    stored = asyncio.run(stored_verifier())
    iterations, salt = stored.split("$")[1].split(":")
    assert (
        credentials.scram_sha256_verifier("pencil", salt=base64.b64decode(salt), iterations=int(iterations)) == stored
    )


def _make_legacy_state(data_dir: pathlib.Path) -> None:
    """What an older Ferrum left behind: a cluster trusting every local user, whose
    ``ferrum`` database the superuser created and migrated, a node in it, no password files."""
    with EmbeddedPostgres(data_dir, fsync=False) as pg:
        asyncio.run(_execute(pg.superuser_url(), "CREATE DATABASE ferrum"))
        asyncio.run(_execute(pg.superuser_url(), "DROP ROLE ferrum"))
        asyncio.run(migrate.upgrade(pg.superuser_url("ferrum")))
        asyncio.run(
            _execute(
                pg.superuser_url("ferrum"),
                "INSERT INTO nodes (uuid, name, driver, provision_state) VALUES (gen_random_uuid(), 'old-node', 'fake-hardware', 'enroll');"
                "ALTER ROLE postgres PASSWORD NULL",
            )
        )
    hba = data_dir / "pgdata" / "pg_hba.conf"
    with open(hba, "w") as fh:  # in place: the file keeps its owner
        fh.write(LEGACY_TRUST_HBA)
    for name in ("postgres.password", "ferrum.password"):
        (data_dir / name).unlink()


def test_cluster_of_an_older_ferrum_is_converted(tmp_path: pathlib.Path) -> None:
    data_dir = tmp_path / "pg"
    _make_legacy_state(data_dir)
    with EmbeddedPostgres(data_dir, fsync=False) as pg:
        pg.ensure_database("ferrum")
        assert (pg.pgdata / "pg_hba.conf").read_text() == embedded_access.HBA_CONF
        _refused(_psql_as_other_user(pg, "127.0.0.1", user="postgres"), "no password supplied")
        assert asyncio.run(_query(pg.superuser_url("ferrum"), embedded_access.objects_owned_sql("postgres"))) == 0

        url = pg.database_url("ferrum")
        assert asyncio.run(migrate.upgrade(url)) == []  # nothing lost, nothing re-applied
        assert (
            asyncio.run(_query(url, "SELECT pg_get_userbyid(datdba) FROM pg_database WHERE datname = 'ferrum'"))
            == "ferrum"
        )
        assert asyncio.run(_query(url, "SELECT name FROM nodes")) == "old-node"
        # What the next migration and the services do, as the service role: DDL, sequences, trigger functions.
        asyncio.run(
            _execute(
                url,
                "ALTER TABLE nodes ADD COLUMN later int; ALTER TABLE nodes DROP COLUMN later;"
                "INSERT INTO nodes (uuid, name, driver, provision_state) VALUES (gen_random_uuid(), 'new-node', 'fake-hardware', 'enroll');"
                "INSERT INTO node_events (node_uuid, event) SELECT uuid, 'x' FROM nodes",
            )
        )
        assert asyncio.run(_query(url, "SELECT count(*) FROM node_events")) == 2
    # The conversion happens once: a second start changes nothing and keeps the passwords.
    passwords = (pg.superuser_password_file.read_text(), pg.service_password_file.read_text())
    with EmbeddedPostgres(data_dir, fsync=False) as pg:
        pg.ensure_database("ferrum")
        assert (pg.superuser_password_file.read_text(), pg.service_password_file.read_text()) == passwords
        assert asyncio.run(_query(pg.database_url("ferrum"), "SELECT count(*) FROM nodes")) == 2


def test_deleting_a_password_file_rotates_it(tmp_path: pathlib.Path) -> None:
    data_dir = tmp_path / "pg"
    with EmbeddedPostgres(data_dir, fsync=False) as pg:
        old = {"postgres": pg.superuser_password_file.read_text(), "ferrum": pg.service_password_file.read_text()}
    pg.superuser_password_file.unlink()
    pg.service_password_file.unlink()
    with EmbeddedPostgres(data_dir, fsync=False) as pg:
        assert pg.superuser_password_file.read_text() != old["postgres"]
        assert pg.service_password_file.read_text() != old["ferrum"]
        assert asyncio.run(_query(pg.superuser_url(), "SELECT current_user")) == "postgres"
        assert asyncio.run(_query(pg.url, "SELECT current_user")) == "ferrum"
        for role, url in (("postgres", pg.superuser_url()), ("ferrum", pg.url)):
            with pytest.raises(asyncpg.InvalidPasswordError):
                asyncio.run(_query(credentials.url_with_password(url, old[role].strip()), "SELECT 1"))


def test_password_file_others_could_read_is_refused(tmp_path: pathlib.Path) -> None:
    data_dir = tmp_path / "pg"
    with EmbeddedPostgres(data_dir, fsync=False) as pg:
        pass
    pg.service_password_file.chmod(0o644)
    with pytest.raises(EmbeddedPostgresError, match="mode 0644, so others may have read it"):
        EmbeddedPostgres(data_dir, fsync=False).start()
    assert pg.pid is None  # refused before anything ran
    pg.service_password_file.unlink()
    pg.superuser_password_file.rename(tmp_path / "elsewhere")
    pg.superuser_password_file.symlink_to(tmp_path / "elsewhere")
    with pytest.raises(EmbeddedPostgresError, match="symlink"):
        EmbeddedPostgres(data_dir, fsync=False).start()
    assert pg.pid is None
