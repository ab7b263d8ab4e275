"""Integration tests for the embedded PostgreSQL launcher (real server, no mocks)."""

from __future__ import annotations

import asyncio
import os
import pathlib
import socket
import subprocess
import sys
import time

import asyncpg
import pytest

from services.common.db import embedded
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
        assert url.startswith("postgresql://postgres@127.0.0.1:")
        assert url == pg.url
        assert pg.start() == url  # idempotent while running
        assert asyncio.run(_query(url, "SELECT 1")) == 1
        assert asyncio.run(_query(url, "SELECT current_user")) == "postgres"

        pid = pg.pid
        assert pid is not None
        uid = _real_uid(pid)
        if os.geteuid() == 0:
            assert uid != 0, "postgres must not run as root"
        else:
            assert uid == os.geteuid()
        assert (tmp_path / "pg" / "pgdata" / "PG_VERSION").is_file()
        assert (tmp_path / "pg" / "postgres.log").is_file()

        asyncio.run(_execute(url, "CREATE TABLE persisted (v int); INSERT INTO persisted VALUES (42)"))

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
        assert asyncio.run(_query(url2, "SELECT v FROM persisted")) == 42
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
