"""Writing an image onto a ramdisk's disk over iSCSI, from the conductor.

The login is libiscsi's, inside ``qemu-img`` (``--target-image-opts
driver=iscsi,...``): a userspace initiator, so the conductor needs no
kernel module, no ``iscsiadm`` and no root. CHAP's secret reaches qemu-img
through a ``secret`` object read from a 0600 file, never on its command line
(which every local user can read in ``/proc``).

The image's format is never guessed from its bytes: qemu-img is told the
format, a qcow2 that names a backing or data file is refused (opening it
would read a file of the conductor's choosing from the image's choosing), and
the image's virtual size must fit the LUN (seed 002's ``_check_image_size``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from services.common import errors
from services.common.child_process import dies_with_parent
from services.common.iscsi_chap import chap_credentials

__all__ = [
    "IscsiLogin",
    "WriteResult",
    "chap_credentials",
    "image_facts",
    "read_range",
    "target_size",
    "write_image",
    "write_range",
]

LOG = logging.getLogger(__name__)
QCOW2_MAGIC = b"QFI\xfb"
FORMATS = ("raw", "qcow2")
DEFAULT_PORT = 3260
_IQN = re.compile(r"^iqn\.\d{4}-\d{2}\.[a-z0-9][a-z0-9.-]*(:[A-Za-z0-9.:_-]+)?$")


def valid_iqn(iqn: str) -> bool:
    return bool(_IQN.match(iqn)) and len(iqn) <= 223


@dataclass(frozen=True)
class IscsiLogin:
    """Where and as whom the conductor logs in."""

    address: str
    port: int
    iqn: str
    username: str
    password: str
    initiator_iqn: str
    lun: int = 1
    # A write whose qemu-img moves less than STALL_BYTES for this long is killed and fails:
    # qemu's iSCSI driver retries a lost connection for ever (tested: a connection cut
    # midway, refused reconnects, a request timeout set: qemu-img never returned).
    stall_timeout: float = 60.0

    def image_opts(self, secret_id: str, *, offset: int | None = None, size: int | None = None) -> str:
        """qemu's option string for the LUN; with ``offset``/``size``, for that
        byte range of it (qemu's ``raw`` driver over the ``iscsi`` one)."""
        host = f"[{self.address}]" if ":" in self.address else self.address
        parts = {
            "driver": "iscsi",
            "transport": "tcp",
            "portal": f"{host}:{self.port}",
            "target": self.iqn,
            "lun": str(self.lun),
            "user": self.username,
            "password-secret": secret_id,
            "initiator-name": self.initiator_iqn,
        }
        for key, value in parts.items():
            if "," in value:
                raise errors.InvalidParameterValue(f"iSCSI {key} {value!r} holds a character qemu cannot take")
        if offset is None:
            return ",".join(f"{k}={v}" for k, v in parts.items())
        return ",".join([f"driver=raw,offset={offset},size={size}", *(f"file.{k}={v}" for k, v in parts.items())])


@dataclass(frozen=True)
class WriteResult:
    format: str
    virtual_size: int
    disk_size: int
    seconds: float


STALL_BYTES = 64 * 1024  # qemu's idle loop alone writes 8 bytes to an eventfd every second or so


def _io_bytes(pid: int) -> int | None:
    """Bytes a process has read and written through system calls (sockets and files), or None."""
    try:
        fields = dict(line.split(": ", 1) for line in Path(f"/proc/{pid}/io").read_text().splitlines())
        return int(fields["rchar"]) + int(fields["wchar"])
    except (OSError, KeyError, ValueError):
        return None


async def _watch_progress(proc: asyncio.subprocess.Process, stall_timeout: float) -> float:
    """Returns (the seconds it waited) once ``proc`` has moved less than STALL_BYTES in
    ``stall_timeout`` seconds; runs until cancelled otherwise, or for ever without /proc."""
    tick = max(0.05, min(1.0, stall_timeout / 5))
    mark, since = _io_bytes(proc.pid), time.monotonic()
    while True:
        await asyncio.sleep(tick)
        now = _io_bytes(proc.pid)
        if now is None or mark is None:
            mark, since = now, time.monotonic()
            continue
        if now - mark >= STALL_BYTES:
            mark, since = now, time.monotonic()
        elif time.monotonic() - since >= stall_timeout:
            return time.monotonic() - since


async def _run(*argv: str, what: str, timeout: float | None = None, stall_timeout: float | None = None) -> str:
    proc = await asyncio.create_subprocess_exec(
        *dies_with_parent(),
        *argv,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    watch = asyncio.ensure_future(_watch_progress(proc, stall_timeout)) if stall_timeout else None
    try:
        async with asyncio.timeout(timeout):
            run = asyncio.ensure_future(proc.communicate())
            done, _ = await asyncio.wait([run, *([watch] if watch else [])], return_when=asyncio.FIRST_COMPLETED)
            if run not in done:
                run.cancel()
                assert watch is not None
                raise errors.ImageError(
                    f"{what} failed: it stalled, no progress for {watch.result():.0f} s "
                    "(the connection to the target was lost?)"
                )
            out, err = run.result()
    except BaseException:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()
        raise
    finally:
        if watch is not None:
            watch.cancel()
    if proc.returncode != 0:
        text = (err or out).decode(errors="replace").strip().splitlines()
        raise errors.ImageError(f"{what} failed: {text[-1] if text else f'exit status {proc.returncode}'}")
    return out.decode(errors="replace")


def sniff_format(path: Path) -> str:
    with open(path, "rb") as f:
        return "qcow2" if f.read(4) == QCOW2_MAGIC else "raw"


async def image_facts(path: Path, declared: str = "") -> tuple[str, int]:
    """The image's format and virtual size. ``declared`` (instance_info's
    ``image_disk_format``) must match what the bytes are."""
    found = await asyncio.to_thread(sniff_format, path)
    if declared and declared not in FORMATS:
        raise errors.ImageFormatError(
            f"The iSCSI deploy writes raw and qcow2 images; image_disk_format is {declared!r}"
        )
    if declared and declared != found:
        raise errors.ImageFormatError(
            f"The image is {found}, but instance_info image_disk_format says {declared}: refusing to write it"
        )
    info = json.loads(await _run("qemu-img", "info", "--output=json", "-f", found, str(path), what="Reading the image"))
    specific = (info.get("format-specific") or {}).get("data") or {}
    if info.get("backing-filename") or info.get("full-backing-filename") or specific.get("data-file"):
        raise errors.ImageFormatError("The image names a backing or data file: refusing to open it")
    return found, int(info["virtual-size"])


def _write_secret(password: str, work_dir: str | None) -> str:
    fd, path = tempfile.mkstemp(prefix="ferrum-chap-", dir=work_dir)
    try:
        os.write(fd, password.encode())
    finally:
        os.close(fd)
    return path


def _unlink(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


@contextlib.asynccontextmanager
async def _chap_object(login: IscsiLogin, work_dir: str | None) -> AsyncIterator[tuple[str, str]]:
    """qemu-img's ``--object secret,id=chap,...`` arguments, the CHAP secret in a
    0600 file that exists for the block only."""
    path = await asyncio.to_thread(_write_secret, login.password, work_dir)
    try:
        yield ("--object", f"secret,id=chap,file={path}")
    finally:
        await asyncio.to_thread(_unlink, path)


async def target_size(login: IscsiLogin, *, work_dir: str | None = None, timeout: float = 60.0) -> int:
    """The LUN's size in bytes (a login and a READ CAPACITY)."""
    async with _chap_object(login, work_dir) as chap:
        out = await _run(
            "qemu-img",
            "info",
            "--output=json",
            *chap,
            "--image-opts",
            login.image_opts("chap"),
            what=f"Logging in to the iSCSI target {login.iqn} at {login.address}:{login.port}",
            timeout=timeout,
        )
    return int(json.loads(out)["virtual-size"])


DEFAULT_SESSIONS = 4
SPLIT_MIN_BYTES = 512 * 1024 * 1024  # below this, one session: a login costs more than it wins
SPLIT_ALIGN = 1024 * 1024


def split_ranges(size: int, sessions: int) -> list[tuple[int, int]]:
    """``sessions`` MiB-aligned (offset, length) ranges covering ``[0, size)``."""
    if sessions <= 1 or size <= SPLIT_ALIGN:
        return [(0, size)]
    step = max(SPLIT_ALIGN, -(-size // sessions // SPLIT_ALIGN) * SPLIT_ALIGN)
    return [(offset, min(step, size - offset)) for offset in range(0, size, step)]


def _source_opts(image: Path, fmt: str, offset: int, length: int) -> str:
    """One byte range of the image's *guest* view: qemu's raw driver over the image's format."""
    name = str(image).replace(",", ",,")
    inner = (
        f"file.driver=file,file.filename={name}"
        if fmt == "raw"
        else (f"file.driver={fmt},file.file.driver=file,file.file.filename={name}")
    )
    return f"driver=raw,offset={offset},size={length},{inner}"


async def write_image(
    image: Path,
    login: IscsiLogin,
    *,
    declared_format: str = "",
    work_dir: str | None = None,
    login_timeout: float = 60.0,
    write_timeout: float | None = None,
    sessions: int = DEFAULT_SESSIONS,
    split_min_bytes: int = SPLIT_MIN_BYTES,
) -> WriteResult:
    """Check the image against the LUN, then convert it onto the LUN.

    ``-n``: the LUN exists and is not assumed to be zeroed, so the image's
    holes are written as zeroes (the disk may hold a previous tenant's data).
    ``-W -m 16``: sixteen requests in flight (qemu-img's most), out of
    order, which keeps the network and the ramdisk's disk busy at once.
    A large image is written by ``sessions`` qemu-img at once, each its own
    iSCSI session on its own range of the disk: one session is bound by
    tgtd's per-connection data path (bench/iscsi_deploy.py)."""
    fmt, virtual = await image_facts(image, declared_format)
    disk = await target_size(login, work_dir=work_dir, timeout=login_timeout)
    if virtual > disk:
        raise errors.ImageError(f"The image ({virtual} bytes) is larger than the disk it is written to ({disk} bytes)")
    ranges = split_ranges(virtual, sessions if virtual >= split_min_bytes else 1)
    started = time.monotonic()
    if len(ranges) == 1:
        await convert_into(image, fmt, login, work_dir=work_dir, timeout=write_timeout)
    else:
        await _all_or_none(
            [
                convert_into(
                    image,
                    fmt,
                    login,
                    offset=offset,
                    size=length,
                    source_range=True,
                    work_dir=work_dir,
                    timeout=write_timeout,
                )
                for offset, length in ranges
            ]
        )
    seconds = time.monotonic() - started
    LOG.info(
        "image written over iSCSI iqn=%s format=%s bytes=%d sessions=%d seconds=%.2f rate=%.0fMiB/s",
        login.iqn,
        fmt,
        virtual,
        len(ranges),
        seconds,
        virtual / max(seconds, 1e-6) / 2**20,
    )
    return WriteResult(format=fmt, virtual_size=virtual, disk_size=disk, seconds=seconds)


async def _all_or_none(jobs: list[Any]) -> None:
    """Run the writers together; the first failure cancels the rest (their qemu-img is
    killed) and is raised."""
    tasks = [asyncio.ensure_future(job) for job in jobs]
    try:
        for task in asyncio.as_completed(tasks):
            await task
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def convert_into(
    image: Path,
    fmt: str,
    login: IscsiLogin,
    *,
    offset: int | None = None,
    size: int | None = None,
    skip_holes: bool = False,
    source_range: bool = False,
    work_dir: str | None = None,
    timeout: float | None = None,
) -> None:
    """Convert ``image`` onto the LUN: all of it at the LUN's start, or into the
    byte range ``[offset, offset+size)`` (a partition; with ``source_range``,
    the image's own bytes of that range, one share of a split write).
    ``skip_holes`` leaves the image's unallocated ranges untouched, for a file
    system just made whose holes it never wrote. ``-W -m 16``: sixteen
    requests in flight (qemu-img's most), out of order."""
    if source_range and offset is not None and size is not None:
        source = ["--image-opts", _source_opts(image, fmt, offset, size)]
    else:
        source = ["-f", fmt, str(image)]
    async with _chap_object(login, work_dir) as chap:
        await _run(
            "qemu-img",
            "convert",
            "-n",
            *(["--target-is-zero"] if skip_holes else []),
            "-W",
            "-m",
            "16",
            *source,
            *chap,
            "--target-image-opts",
            login.image_opts("chap", offset=offset, size=size),
            what=f"Writing the image to the iSCSI target {login.iqn} at {login.address}:{login.port}",
            timeout=timeout,
            stall_timeout=login.stall_timeout,
        )


async def read_range(
    login: IscsiLogin, offset: int, size: int, *, work_dir: str | None = None, timeout: float = 120.0
) -> bytes:
    """``size`` bytes of the LUN from ``offset``."""
    fd, out = tempfile.mkstemp(prefix="ferrum-lun-", dir=work_dir)
    os.close(fd)
    try:
        async with _chap_object(login, work_dir) as chap:
            await _run(
                "qemu-img",
                "convert",
                *chap,
                "--image-opts",
                login.image_opts("chap", offset=offset, size=size),
                "-O",
                "raw",
                out,
                what=f"Reading the iSCSI target {login.iqn}",
                timeout=timeout,
            )
        return await asyncio.to_thread(Path(out).read_bytes)
    finally:
        await asyncio.to_thread(_unlink, out)


async def write_range(
    login: IscsiLogin, offset: int, data: bytes, *, work_dir: str | None = None, timeout: float = 120.0
) -> None:
    """Write ``data`` onto the LUN at ``offset``."""
    fd, src = tempfile.mkstemp(prefix="ferrum-lun-", dir=work_dir)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)
    try:
        await convert_into(Path(src), "raw", login, offset=offset, size=len(data), work_dir=work_dir, timeout=timeout)
    finally:
        await asyncio.to_thread(_unlink, src)


def describe(result: WriteResult) -> dict[str, Any]:
    return {
        "format": result.format,
        "bytes": result.virtual_size,
        "disk_bytes": result.disk_size,
        "seconds": round(result.seconds, 3),
    }
