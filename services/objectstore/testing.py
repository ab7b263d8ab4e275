"""Helpers that tests and benchmarks share: an object store service in this
process, and real S3-protocol servers (moto, s3rver) as child processes on
127.0.0.1, always stopped by their PID."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

from services.common.config import Settings
from services.common.db.pool import create_pool
from services.common.ports import unused_tcp_port
from services.objectstore.service import ObjectStoreService

REPO = Path(__file__).resolve().parents[2]
S3RVER_CACHE = REPO / ".ferrum" / "cache" / "s3rver"


@contextlib.asynccontextmanager
async def running_objectstore(settings: Settings) -> AsyncIterator[ObjectStoreService]:
    """An ObjectStoreService with its own pool, stopped on exit."""
    pool = await create_pool(settings.database.url, min_size=1, max_size=20)
    service = ObjectStoreService(settings, pool)
    try:
        await service.start()
        yield service
    finally:
        try:
            await service.stop()
        finally:
            await pool.close()


def _wait_listening(port: int, proc: subprocess.Popen[bytes], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited early with status {proc.returncode}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return
        time.sleep(0.1)
    raise TimeoutError(f"nothing listens on 127.0.0.1:{port} after {timeout}s")


def stop_process(proc: subprocess.Popen[bytes], timeout: float = 10.0) -> None:
    """SIGTERM the child by PID, then SIGKILL if it lingers."""
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout)


@contextlib.contextmanager
def moto_server(venv_bin: Path) -> Iterator[str]:
    """``moto_server`` on an ephemeral 127.0.0.1 port; yields its endpoint URL."""
    port = unused_tcp_port()
    proc = subprocess.Popen(
        [str(venv_bin / "moto_server"), "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        _wait_listening(port, proc, 60.0)
        yield f"http://127.0.0.1:{port}"
    finally:
        stop_process(proc)


def ensure_s3rver() -> Path:
    """The s3rver executable, installed from npm into the repo's cache on first use."""
    binary = S3RVER_CACHE / "node_modules" / ".bin" / "s3rver"
    if not binary.exists():
        npm = shutil.which("npm")
        if npm is None:
            raise RuntimeError("npm is not installed, so s3rver cannot be installed")
        S3RVER_CACHE.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [npm, "install", "--no-audit", "--no-fund", "--prefix", str(S3RVER_CACHE), "s3rver"],
            check=True,
            timeout=300,
            stdout=subprocess.DEVNULL,
        )
    return binary


@contextlib.contextmanager
def s3rver() -> Iterator[str]:
    """s3rver (checks signatures; keys S3RVER/S3RVER) on an ephemeral port."""
    binary = ensure_s3rver()
    port = unused_tcp_port()
    with tempfile.TemporaryDirectory(prefix="ferrum-s3rver-") as data:
        proc = subprocess.Popen(
            [str(binary), "--address", "127.0.0.1", "--port", str(port), "--directory", data, "--silent"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            _wait_listening(port, proc, 60.0)
            yield f"http://127.0.0.1:{port}"
        finally:
            stop_process(proc)


async def wait_until(predicate: object, *, timeout: float = 20.0, interval: float = 0.05) -> None:
    """Poll an (async) zero-argument predicate until true; bounded."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = predicate()  # type: ignore[operator]
        if asyncio.iscoroutine(result):
            result = await result
        if result:
            return
        await asyncio.sleep(interval)
    raise AssertionError(f"condition not met within {timeout}s")
