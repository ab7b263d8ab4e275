"""Expose a disk (a block device or an image file) as an iSCSI target with userspace tgtd.

The conductor writes an image to a machine by logging in to this target with
libiscsi (``qemu-img convert ... driver=iscsi``), so the agent needs neither
an image download nor a kernel iSCSI target. One :class:`IscsiTarget` runs one
``tgtd`` in the foreground, serving one target (tid 1) with one LUN (lun 1),
guarded twice: CHAP (the per-deploy secret of :func:`chap_credentials`, which
the conductor derives from the same deploy key) and, unless the spec says
otherwise, an ACL naming the conductor's initiator.

Several targets can run side by side in one process (the simulator runs many
agents at once), so nothing here is shared between instances:

* each tgtd gets its own control socket through ``TGT_IPC_SOCKET`` in a
  directory of its own, instead of tgtd's shared ``/var/run/tgtd/socket.N``;
  the control port ``N`` is still picked at random (tgtd accepts 0..32767)
  and a start that finds it taken is retried with another. A tgtd that loses
  the port's lock lives on for a moment while the holder answers on the same
  socket, so readiness also checks (in /proc/locks) that our PID holds it;
* processes are stopped by the PID this object started, never by name.

What tgtd 1.0.85 (Debian 12) does that shapes this module:

* its SIGTERM handler does nothing, held targets or not: it exits on
  ``tgtadm --op delete --mode system`` once it has no target left, 0.1 s
  later. :meth:`IscsiTarget.stop` deletes the target (``--force``), which
  closes the sessions and the disk, and then kills tgtd: nothing is left in it
  to lose. Only when that delete fails does it ask the system to stop, send
  SIGTERM for versions that honour it, and SIGKILL after a short wait;
* when it cannot bind the requested portal it does not fail: it logs the
  error and listens on its defaults, ``0.0.0.0:3260`` and ``[::]:3260``, i.e.
  on every interface. The portal list is therefore checked against the spec
  before any target exists, and a mismatch is a failed start;
* it leaves its socket and lock files behind even on a clean exit;
* ``tgtadm`` sends its options as one ``key=value,key=value`` string that
  tgtd splits on commas, so a comma in a path or a user name would be misread:
  :class:`TargetSpec` refuses them (and everything qemu's option parser or an
  iSCSI name would not carry);
* its defaults cut a write into 8 KiB data PDUs (``MaxRecvDataSegmentLength``)
  and 256 KiB bursts, and write through the page cache. :data:`TARGET_PARAMS`
  and ``bsoflags=direct`` (when the disk takes 512-byte direct I/O) took the
  conductor's 2 GiB write from 3.4-4.7 s to 1.5-1.9 s (docs/deploy.md);
* it receives every connection on one thread, into a freshly allocated buffer
  per write: :data:`TGTD_MALLOC_TUNABLES` keeps glibc from handing those pages
  back to the kernel between writes, which halved tgtd's CPU time per GiB.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import os
import re
import secrets
import shutil
import signal
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from services.common import direct_write, errors
from services.common.child_process import dies_with_parent

LOG = logging.getLogger(__name__)
# iSCSI session parameters the target offers (RFC 7143 section 13): data PDUs of 256 KiB
# instead of tgtd's 8 KiB, and bursts as long as the protocol allows, so a large write is
# a few PDUs and no extra R2T round trips. libiscsi (qemu-img) accepts them as they are.
TARGET_PARAMS = (
    ("MaxRecvDataSegmentLength", "262144"),
    ("MaxBurstLength", "16776192"),
    ("FirstBurstLength", "16776192"),
)

# glibc malloc settings for tgtd (GLIBC_TUNABLES). tgtd allocates a fresh buffer for each
# SCSI write's data (valloc of up to 2 MiB) and frees it once written; with glibc's defaults
# those buffers are mmapped or trimmed off the heap and handed back to the kernel, so every
# 4 KiB page of every write was faulted in and zero-filled again: 262,000 minor faults and
# 0.8 s of tgtd's 1.0 s of CPU for 1 GiB of data. Serving buffers from a heap that is never
# trimmed, on transparent huge pages where the kernel allows them (``madvise`` mode), cut that
# to about 1,000 faults and 0.4-0.5 s (docs/deploy.md). The cost: tgtd keeps its peak of
# in-flight write buffers (the initiators' queue depth times 2 MiB) until it exits, which it
# does when the deploy ends. Unknown tunables are ignored by older glibc; a GLIBC_TUNABLES
# already in the environment comes after these, so an operator's own values win.
TGTD_MALLOC_TUNABLES = (
    ("glibc.malloc.mmap_threshold", "33554432"),  # glibc's ceiling (32 MiB): no write buffer is mmapped
    ("glibc.malloc.trim_threshold", "1073741824"),  # freed buffers stay in the heap for the next write
    ("glibc.malloc.hugetlb", "1"),  # madvise(MADV_HUGEPAGE) the heap: 2 MiB pages, 512x fewer faults
)

# tgtd and tgtadm parse -C into a C short and refuse values above 32767; the
# high part of that range keeps clear of the default 0 and hand-picked ports.
CONTROL_PORT_MIN = 20000
CONTROL_PORT_MAX = 32767
START_ATTEMPTS = 8  # control ports tried before giving up
READY_TIMEOUT = 10.0  # seconds for a new tgtd to answer on its control socket
TGTADM_TIMEOUT = 10.0  # seconds for one tgtadm request
STOP_TIMEOUT = 3.0  # seconds between the polite stop and SIGKILL
TID = 1
LUN = 1

# CHAP: RFC 7143 asks for secrets of at least 96 bits (12 bytes); tgtd copies
# the secret into a 256-byte buffer, so 255 characters is its ceiling.
CHAP_PASSWORD_MIN = 12
CHAP_PASSWORD_MAX = 255
IQN_MAX = 223  # RFC 3720's limit on an iSCSI name, in bytes
_SUN_PATH_MAX = 107  # a unix socket path, without its NUL
_COLLISION = "another tgtd is using"  # tgtd's message when the control port's lock is held
# tgtd's start-up chatter in a container or VM, left out of quoted log tails.
_LOG_NOISE = (
    "Failed to initialize RDMA",
    "can't adjust oom-killer",
    "can't adjust nr_open",
    "work_timer_start(",
    "bs_init(",
    "bs_thread_open(",
)

_IQN = re.compile(
    r"(iqn\.[0-9]{4}-[0-9]{2}\.[A-Za-z0-9][A-Za-z0-9.:-]*|eui\.[0-9A-Fa-f]{16}|naa\.[0-9A-Fa-f]{16}(?:[0-9A-Fa-f]{16})?)"
)
# A CHAP user name travels in tgtadm's comma-separated request and in qemu's
# option string: no commas, no spaces, nothing that needs quoting.
_CHAP_USER = re.compile(r"[A-Za-z0-9._:@+-]{1,255}")
# A secret may hold any printable ASCII but the space and the comma (tgtadm
# passes it on its command line; a comma in a qemu option value must be doubled).
_CHAP_SECRET = re.compile(r"[\x21-\x2b\x2d-\x7e]+")


def _refuse(message: str) -> errors.InvalidParameterValue:
    return errors.InvalidParameterValue(message)


def takes_direct_io(path: str) -> bool:
    """Whether tgtd may open ``path`` with O_DIRECT (``bsoflags=direct``): a 512-byte
    direct read at offset 0 works. The LUN has 512-byte blocks, so an initiator may
    write 512 bytes (a partition table); a 4Kn disk, or a file system without
    O_DIRECT (tmpfs before Linux 6.6), would fail those, and keeps the page cache."""
    flag = getattr(os, "O_DIRECT", 0)
    if not flag:
        return False
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | flag)
    except OSError:
        return False
    try:
        os.preadv(fd, [direct_write.aligned_buffer(512)], 0)
    except OSError:
        return False
    finally:
        os.close(fd)
    return True


def _check_iscsi_name(value: str, what: str) -> None:
    if len(value.encode()) > IQN_MAX or not _IQN.fullmatch(value):
        raise _refuse(f"{what} {value!r} is not an iSCSI name (iqn.YYYY-MM.domain[:id], eui. or naa.)")


@dataclass(frozen=True)
class TargetSpec:
    """What to serve and to whom; checked when built, so a bad value is the
    caller's error (InvalidParameterValue) and never reaches tgtadm."""

    iqn: str  # per-deploy target IQN, e.g. iqn.2008-10.org.openstack:<node uuid>
    backing_path: str  # absolute path of a block device or a disk image file
    chap_username: str
    chap_password: str
    initiator_iqn: str  # only this initiator may log in (ACL); "" lets any in, still with CHAP
    listen_host: str = "127.0.0.1"  # an IP address literal: tgtd's portal list is compared with it
    portal_port: int = 0  # 0 = an ephemeral port chosen by the kernel

    def __post_init__(self) -> None:
        _check_iscsi_name(self.iqn, "target IQN")
        if self.initiator_iqn:
            _check_iscsi_name(self.initiator_iqn, "initiator IQN")
        path = self.backing_path
        if not path.startswith("/") or any(c in path for c in ",\n\0"):
            # tgtd splits the logical unit's options on commas; tgtd's working
            # directory is not the caller's business.
            raise _refuse(f"backing path {path!r} must be absolute and hold no comma or newline")
        if not _CHAP_USER.fullmatch(self.chap_username):
            raise _refuse(f"CHAP user name {self.chap_username!r} must be 1-255 of A-Z a-z 0-9 . _ : @ + -")
        secret = self.chap_password
        if not CHAP_PASSWORD_MIN <= len(secret) <= CHAP_PASSWORD_MAX or not _CHAP_SECRET.fullmatch(secret):
            raise _refuse(
                f"CHAP secret must be {CHAP_PASSWORD_MIN}-{CHAP_PASSWORD_MAX} printable ASCII characters, "
                "without spaces or commas"
            )
        try:
            ipaddress.ip_address(self.listen_host)
        except ValueError:
            raise _refuse(f"listen host {self.listen_host!r} must be an IP address") from None
        if not 0 <= self.portal_port <= 65535:
            raise _refuse(f"portal port {self.portal_port} is not a TCP port")

    def portal_option(self) -> str:
        """tgtd's ``--iscsi portal=`` value (an IPv6 address in brackets)."""
        host = self.listen_host
        if ipaddress.ip_address(host).version == 6:
            host = f"[{host}]"
        return f"portal={host}:{self.portal_port}"


@dataclass(frozen=True)
class Portal:
    """Where an initiator reaches the target: the address tgtd listens on and its real port."""

    address: str
    port: int


def _parse_portals(text: str) -> list[Portal]:
    """``Portal: 127.0.0.1:43853,1`` / ``Portal: [::1]:35445,1`` lines of ``--mode portal --op show``."""
    found = []
    for line in text.splitlines():
        label, _, value = line.strip().partition(":")
        if label != "Portal" or not value:
            continue
        hostport = value.strip().rsplit(",", 1)[0]  # ",1" is the portal group tag
        host, _, port = hostport.rpartition(":")
        host = host.strip("[]")
        if host and port.isdigit():
            found.append(Portal(host, int(port)))
    return found


class IscsiTarget:
    """One tgtd process serving one target.

    ``start`` and ``stop`` may be called from any task; a lock orders them.
    A failed start leaves nothing behind, and ``stop`` is safe to repeat.
    """

    def __init__(
        self, spec: TargetSpec, *, tgtd: str = "tgtd", tgtadm: str = "tgtadm", work_dir: str | None = None
    ) -> None:
        self.spec = spec
        self._tgtd = tgtd
        self._tgtadm_path = tgtadm
        self._work_dir_arg = work_dir
        self._work_dir: Path | None = None
        self._owns_work_dir = False
        self._control_dir: Path | None = None
        self._control_port: int | None = None
        self._log_path: Path | None = None
        self._log_offset = 0  # where this start's part of the log begins
        self._process: asyncio.subprocess.Process | None = None
        self._portal: Portal | None = None
        self._lock = asyncio.Lock()

    @property
    def portal(self) -> Portal | None:
        """The portal of the running target; None when not started or stopped."""
        return self._portal

    @property
    def running(self) -> bool:
        """Started, and its tgtd has not exited."""
        return self._portal is not None and self._process is not None and self._process.returncode is None

    @property
    def pid(self) -> int | None:
        """The tgtd process's PID while this object owns it (to check it went away)."""
        return self._process.pid if self._process is not None else None

    @property
    def control_port(self) -> int | None:
        """tgtd's ``-C`` value; with ``TGT_IPC_SOCKET`` set to :attr:`control_socket_base`
        an operator's ``tgtadm -C`` reaches this tgtd."""
        return self._control_port

    @property
    def control_socket_base(self) -> str | None:
        """The ``TGT_IPC_SOCKET`` value of this tgtd (its socket is this plus ``.<control port>``)."""
        return str(self._control_dir / "socket") if self._control_dir is not None else None

    @property
    def log_path(self) -> Path | None:
        """tgtd's output of the last start (removed by ``stop`` when the work dir was a temporary one)."""
        return self._log_path

    async def start(self) -> Portal:
        """Start tgtd, create the target, its LUN, CHAP account and ACL, and return the real portal.

        Raises AgentError (with tgtadm's error and the tail of tgtd's log) when
        anything fails, after stopping whatever it had started.
        """
        async with self._lock:
            if self._process is not None:
                raise errors.AgentError(f"iSCSI target {self.spec.iqn} is already started")
            try:
                await asyncio.to_thread(self._prepare_dirs)
                portal = await self._launch()
                await self._configure()
            except BaseException as exc:
                await self._teardown()
                if isinstance(exc, errors.AgentError) or not isinstance(exc, Exception):
                    raise
                raise errors.AgentError(f"cannot start the iSCSI target {self.spec.iqn}: {exc}") from exc
            self._portal = portal
            LOG.info(
                "iSCSI target %s serves %s at %s:%d (tgtd pid %s)",
                self.spec.iqn,
                self.spec.backing_path,
                portal.address,
                portal.port,
                self.pid,
            )
            return portal

    async def stop(self) -> None:
        """Delete the target and stop tgtd; does nothing when already stopped and never raises for that."""
        async with self._lock:
            if self._process is not None:
                LOG.info("stopping iSCSI target %s (tgtd pid %s)", self.spec.iqn, self._process.pid)
            await self._teardown()

    # -- start ---------------------------------------------------------------------------------

    def _prepare_dirs(self) -> None:
        """Create the work dir (a temporary one by default) and a private control-socket dir in it.

        The control dir is private so that no other tgtd, of this process or
        another, can share its socket; a unix socket path is short, so a long
        work dir gets its control dir in the system's temporary directory.
        """
        if self._work_dir_arg is None:
            self._work_dir = Path(tempfile.mkdtemp(prefix="ferrum-tgt-"))
            self._owns_work_dir = True
        else:
            self._work_dir = Path(self._work_dir_arg)
            self._work_dir.mkdir(parents=True, exist_ok=True)
            self._owns_work_dir = False
        longest = len(str(self._work_dir)) + len("/tgtd-XXXXXXXX/socket.32767.lock")
        parent = self._work_dir if longest <= _SUN_PATH_MAX else Path(tempfile.gettempdir())
        self._control_dir = Path(tempfile.mkdtemp(prefix="tgtd-", dir=parent))
        if len(str(self._control_dir / f"socket.{CONTROL_PORT_MAX}")) > _SUN_PATH_MAX:
            raise errors.AgentError(f"no short enough directory for tgtd's control socket (tried {parent})")
        self._log_path = self._work_dir / f"{self._control_dir.name}.log"

    def _env(self) -> dict[str, str]:
        assert self._control_dir is not None
        return {**os.environ, "TGT_IPC_SOCKET": str(self._control_dir / "socket")}

    def _tgtd_env(self) -> dict[str, str]:
        """tgtadm's environment plus :data:`TGTD_MALLOC_TUNABLES` (tgtd's data path only)."""
        tunables = ":".join(f"{name}={value}" for name, value in TGTD_MALLOC_TUNABLES)
        inherited = os.environ.get("GLIBC_TUNABLES")
        return {**self._env(), "GLIBC_TUNABLES": f"{tunables}:{inherited}" if inherited else tunables}

    async def _launch(self) -> Portal:
        """Run tgtd on a free control port and wait until it answers with the portal we asked for."""
        for _attempt in range(START_ATTEMPTS):
            port = self._pick_control_port()
            offset = self._log_offset = await asyncio.to_thread(self._log_size)
            self._control_port = port
            log = await asyncio.to_thread(self._open_log)
            try:
                self._process = await asyncio.create_subprocess_exec(
                    # setpriv --pdeathsig: an agent that dies (a crash, a SIGKILLed simulator)
                    # takes its tgtd with it, so no orphan keeps a disk exposed.
                    *dies_with_parent(),
                    self._tgtd,
                    "-f",
                    "-C",
                    str(port),
                    "--iscsi",
                    self.spec.portal_option(),
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=log,
                    stderr=log,
                    env=self._tgtd_env(),
                )
            except OSError as exc:
                raise errors.AgentError(f"cannot run {self._tgtd}: {exc}") from exc
            finally:
                log.close()
            portal = await self._wait_ready(offset)
            if portal is not None:
                return portal
            LOG.info("tgtd control port %d is taken, trying another", port)
            self._process = None
        raise errors.AgentError(f"tgtd found no free control port in {START_ATTEMPTS} attempts")

    def _pick_control_port(self) -> int:
        """A random control port: instances share nothing to coordinate a choice through."""
        return CONTROL_PORT_MIN + secrets.randbelow(CONTROL_PORT_MAX - CONTROL_PORT_MIN + 1)

    def _holds_control_lock(self, pid: int) -> bool | None:
        """Whether process ``pid`` holds tgtd's lock on this control port; None when /proc/locks cannot tell.

        tgtd takes a POSIX lock on ``<socket>.lock`` before it binds its
        socket, and a tgtd that cannot take it exits; /proc/locks names the
        holder's PID and the file's inode.
        """
        assert self._control_dir is not None
        lock = self._control_dir / f"socket.{self._control_port}.lock"
        try:
            inode = lock.stat().st_ino
        except FileNotFoundError:
            return False
        try:
            table = Path("/proc/locks").read_text()
        except OSError:
            return None
        # "1: POSIX  ADVISORY  WRITE 3614 fe:00:1458366 0 0"; a waiter's line has "->" after the number
        holders = {
            (fields[4], fields[5].rsplit(":", 1)[-1])
            for fields in (line.split() for line in table.splitlines())
            if len(fields) >= 6 and fields[1] == "POSIX"
        }
        return (str(pid), str(inode)) in holders

    def _open_log(self) -> BinaryIO:
        """tgtd's stdout and stderr, appended to across attempts (a start's offset marks its part)."""
        assert self._log_path is not None
        return open(self._log_path, "ab")  # _launch closes it once tgtd holds it

    async def _wait_ready(self, offset: int) -> Portal | None:
        """The portal once tgtd answers; None when its control port was taken (it exits at once)."""
        process = self._process
        assert process is not None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + READY_TIMEOUT
        while True:
            if process.returncode is not None:
                tail = await self._log_tail(offset)
                if _COLLISION in tail:
                    return None
                raise errors.AgentError(f"tgtd exited with status {process.returncode}: {tail}")
            # Whoever holds the port's lock answers on its socket; a tgtd that
            # lost that race lives on for a moment, so an answer alone does not
            # prove it came from ours.
            if await asyncio.to_thread(self._holds_control_lock, process.pid) is not False:
                rc, out, _err = await self._tgtadm("--lld", "iscsi", "--op", "show", "--mode", "portal")
                if rc == 0:
                    return await self._check_portal(out, offset)
            if loop.time() > deadline:
                raise errors.AgentError(
                    f"tgtd (pid {process.pid}) did not answer on its control socket in {READY_TIMEOUT:g}s: "
                    f"{await self._log_tail(offset)}"
                )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(process.wait()), 0.05)

    async def _check_portal(self, listing: str, offset: int) -> Portal:
        """The one portal tgtd listens on, refused unless it is the spec's.

        tgtd that cannot bind the requested portal falls back to listening on
        every interface at 3260 instead of failing; no target may be created then.
        """
        portals = _parse_portals(listing)
        wanted = ipaddress.ip_address(self.spec.listen_host)
        if len(portals) == 1:
            (portal,) = portals
            with contextlib.suppress(ValueError):
                if (
                    ipaddress.ip_address(portal.address) == wanted
                    and portal.port != 0
                    and self.spec.portal_port in (0, portal.port)
                ):
                    return Portal(str(wanted), portal.port)
        shown = ", ".join(f"{p.address}:{p.port}" for p in portals) or "none"
        raise errors.AgentError(
            f"tgtd did not listen on {self.spec.portal_option().removeprefix('portal=')} "
            f"(its portals: {shown}): {await self._log_tail(offset)}"
        )

    async def _configure(self) -> None:
        """Target, LUN, CHAP account bound to it, and the initiator ACL, in that order."""
        spec = self.spec
        tid = str(TID)
        direct = await asyncio.to_thread(takes_direct_io, spec.backing_path)
        steps: list[tuple[str, tuple[str, ...]]] = [
            ("create the target", ("--op", "new", "--mode", "target", "--tid", tid, "-T", spec.iqn)),
            *(
                (
                    f"set {name}",
                    ("--op", "update", "--mode", "target", "--tid", tid, "--name", name, "--value", value),
                )
                for name, value in TARGET_PARAMS
            ),
            (
                f"add {spec.backing_path} as LUN {LUN}",
                (
                    *("--op", "new", "--mode", "logicalunit", "--tid", tid, "--lun", str(LUN), "-b", spec.backing_path),
                    *(("--bsoflags", "direct") if direct else ()),
                ),
            ),
            (
                "create the CHAP account",
                ("--op", "new", "--mode", "account", "--user", spec.chap_username, "--password", spec.chap_password),
            ),
            (
                "bind the CHAP account",
                ("--op", "bind", "--mode", "account", "--tid", tid, "--user", spec.chap_username),
            ),
        ]
        if spec.initiator_iqn:
            acl = ("--initiator-name", spec.initiator_iqn)
        else:
            acl = ("--initiator-address", "ALL")
        steps.append(("set the initiator ACL", ("--op", "bind", "--mode", "target", "--tid", tid, *acl)))
        offset = self._log_offset
        for what, args in steps:
            rc, _out, err = await self._tgtadm("--lld", "iscsi", *args)
            if rc != 0:
                raise errors.AgentError(
                    f"tgtadm could not {what} for {spec.iqn} (exit {rc}): {self._mask(err.strip()) or 'no message'}; "
                    f"tgtd: {await self._log_tail(offset)}"
                )
        # Thin provisioning: the LUN announces UNMAP and WRITE SAME with unmap (reads of an unmapped
        # block return zeroes), so the conductor's qemu-img writes an image's zero runs as hole
        # punches instead of streaming zeroes over the network: about 3.5x on a half-empty image
        # (bench/iscsi_deploy.py), and the simulator's disk files stay sparse. Best effort: a
        # backing store that cannot punch holes keeps the plain LUN.
        rc, _out, err = await self._tgtadm(
            "--lld",
            "iscsi",
            "--op",
            "update",
            "--mode",
            "logicalunit",
            "--tid",
            tid,
            "--lun",
            str(LUN),
            "--params",
            "thin_provisioning=1",
        )
        if rc != 0:
            LOG.info("iscsi target without thin provisioning iqn=%s reason=%s", spec.iqn, err.strip()[:200])

    # -- stop ----------------------------------------------------------------------------------

    async def _teardown(self) -> None:
        """Stop tgtd (killed once its target is deleted; otherwise politely, then by SIGKILL) and
        remove its files; never raises for a dead tgtd."""
        process = self._process
        try:
            if process is not None and process.returncode is None:
                short = STOP_TIMEOUT
                deleted, _out, _err = await self._tgtadm(
                    "--lld", "iscsi", "--op", "delete", "--mode", "target", "--tid", str(TID), "--force", timeout=short
                )
                if deleted == 0:
                    # The target is gone: its sessions closed, its LUN's worker threads joined and the
                    # disk closed, so every write is in the kernel's hands and tgtd holds nothing a
                    # kill could lose. Its own exit on "delete system" takes 0.1 s more (one tick of
                    # its event loop), on the deploy's critical path.
                    with contextlib.suppress(ProcessLookupError):
                        process.kill()
                    await process.wait()
                    return
                await self._tgtadm("--op", "delete", "--mode", "system", timeout=short)
                with contextlib.suppress(ProcessLookupError):
                    process.send_signal(signal.SIGTERM)  # ignored by tgtd 1.0.85; later versions may honour it
                try:
                    await asyncio.wait_for(asyncio.shield(process.wait()), STOP_TIMEOUT)
                except TimeoutError:
                    LOG.warning("tgtd pid %d did not stop in %gs, killing it", process.pid, STOP_TIMEOUT)
                    with contextlib.suppress(ProcessLookupError):
                        process.kill()
                    await process.wait()
            elif process is not None:
                await process.wait()  # reap it
        finally:
            if process is not None and process.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    process.kill()  # cancelled mid-stop: leave no tgtd behind
            self._process = None
            self._portal = None
            await asyncio.to_thread(self._remove_files)

    def _remove_files(self) -> None:
        """The control dir (socket and lock files tgtd leaves), and the work dir if it was ours."""
        if self._control_dir is not None:
            shutil.rmtree(self._control_dir, ignore_errors=True)
            self._control_dir = None
        if self._owns_work_dir and self._work_dir is not None:
            shutil.rmtree(self._work_dir, ignore_errors=True)
            self._work_dir = None
            self._log_path = None
            self._owns_work_dir = False

    # -- helpers -------------------------------------------------------------------------------

    async def _tgtadm(self, *args: str, timeout: float = TGTADM_TIMEOUT) -> tuple[int, str, str]:
        """Run tgtadm against this tgtd: (exit status, stdout, stderr); -1 when it could not run or hung."""
        assert self._control_port is not None
        try:
            proc = await asyncio.create_subprocess_exec(
                self._tgtadm_path,
                "-C",
                str(self._control_port),
                *args,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env=self._env(),
            )
        except OSError as exc:
            return -1, "", f"cannot run {self._tgtadm_path}: {exc}"
        try:
            out, err = await asyncio.wait_for(proc.communicate(), timeout)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
            return -1, "", f"tgtadm did not answer in {timeout:g}s"
        assert proc.returncode is not None
        return proc.returncode, out.decode(errors="replace"), err.decode(errors="replace")

    def _mask(self, text: str) -> str:
        return text.replace(self.spec.chap_password, "***")

    def _log_size(self) -> int:
        assert self._log_path is not None
        try:
            return self._log_path.stat().st_size
        except FileNotFoundError:
            return 0

    async def _log_tail(self, offset: int, lines: int = 12) -> str:
        """The last lines tgtd wrote since ``offset``, without its start-up chatter."""
        path = self._log_path
        if path is None:
            return "(no tgtd log)"

        def read() -> str:
            try:
                with open(path, "rb") as fp:
                    size = fp.seek(0, os.SEEK_END)
                    fp.seek(max(offset, size - 8192))
                    return fp.read().decode(errors="replace")
            except OSError as exc:
                return f"(tgtd log unreadable: {exc})"

        text = await asyncio.to_thread(read)
        kept = [line for line in text.splitlines() if line.strip() and not any(n in line for n in _LOG_NOISE)]
        return self._mask(" | ".join(kept[-lines:])) or "(tgtd logged nothing)"
