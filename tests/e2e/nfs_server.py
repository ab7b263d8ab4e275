"""A userspace NFSv4 server for the QEMU tests: NFS-Ganesha (Debian's 4.3, FSAL VFS).

Debian 12 has no unfs3, and this machine's kernel cannot serve (or mount)
NFS, so the export is served by ``ganesha.nfsd`` running in the foreground as
a child of the test, with its own config, pid file, log and recovery
directory in a temporary directory, on 127.0.0.1 and a free port. Only NFSv4
(minor versions 1 and 2) is served: no MOUNT protocol, no NLM, no rquota, no
UDP, so nothing needs rpcbind (ganesha's failure to register with a
portmapper is logged and harmless). From a QEMU guest with user networking
the server is ``10.0.2.2:<port>``: slirp connects from an unprivileged host
port, which the export allows (``PrivilegedPort = false``).

The export root holds ``/ferrum-marker`` and a busybox system whose
``/sbin/init`` prints ``FERRUM-NFS-ROOT: <marker>`` and writes
``/ferrum-booted`` (proof that the guest runs with the export as its
writable root), then powers off.

    with running_nfs_server(workdir, marker="...") as nfs:
        nfsroot = nfs.nfsroot()   # 10.0.2.2:/export,port=N,vers=4
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from services.common.ports import unused_tcp_port
from tests.e2e.bootfiles import FILES, NfsBootFiles, ensure_packages, installed

NFS_PACKAGES = ("nfs-ganesha", "nfs-ganesha-vfs")
GANESHA = "/usr/bin/ganesha.nfsd"
PLUGINS_DIR = "/usr/lib/x86_64-linux-gnu/ganesha"
GUEST_HOST = "10.0.2.2"  # the host's 127.0.0.1 as a QEMU user-networking guest sees it
PSEUDO_PATH = "/export"  # where the export sits in the NFSv4 pseudo filesystem
START_TIMEOUT = 30.0
# Daemons that the packages' init scripts may start when apt installs them on a machine
# whose policy-rc.d allows it (this one's refuses): {default pid file: process name}.
PACKAGE_DAEMONS = {
    "/run/ganesha/ganesha.pid": "ganesha.nfsd",
    "/run/rpcbind.pid": "rpcbind",
    "/run/rpc.statd.pid": "rpc.statd",
}


def ensure_nfs_packages() -> None:
    """Install NFS-Ganesha if missing; stop whatever daemon the install itself started."""
    if all(installed(p) for p in NFS_PACKAGES):
        return
    ensure_packages(*NFS_PACKAGES)
    stop_package_daemons()


def stop_package_daemons() -> list[int]:
    """Stop (by the PID in its pid file) each daemon an install started; the PIDs stopped."""
    stopped = []
    for pid_file, name in PACKAGE_DAEMONS.items():
        try:
            pid = int(Path(pid_file).read_text().split()[0])
            comm = Path(f"/proc/{pid}/comm").read_text().strip()
        except (OSError, ValueError, IndexError):
            continue
        if comm != name[:15]:  # a stale pid file naming someone else's process
            continue
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
            stopped.append(pid)
    return stopped


def populate_root(root: Path, marker: str) -> None:
    """A minimal root filesystem: busybox, the test's /sbin/init and ``/ferrum-marker``."""
    for directory in ("bin", "sbin", "dev", "proc", "sys", "tmp"):
        (root / directory).mkdir(parents=True, exist_ok=True)
    shutil.copyfile("/bin/busybox", root / "bin" / "busybox")
    os.chmod(root / "bin" / "busybox", 0o755)
    init = root / "sbin" / "init"
    shutil.copyfile(FILES / "nfsroot-export-init.sh", init)
    os.chmod(init, 0o755)
    (root / "ferrum-marker").write_text(marker + "\n")


def ganesha_config(*, port: int, export: Path, workdir: Path, pseudo: str = PSEUDO_PATH) -> str:
    """NFSv4.1/4.2 only: a 4.0 server would call the client back on a connection of its own (to the
    guest's 10.0.2.15, which is not on this machine); 4.1+ uses the client's own connection."""
    recovery, ccache = workdir / "recovery", workdir / "ccache"
    return f"""# Written by tests/e2e/nfs_server.py: NFSv4 only, on 127.0.0.1:{port}.
NFS_CORE_PARAM {{
    Bind_addr = 127.0.0.1;
    NFS_Port = {port};
    Protocols = 4;
    Enable_NLM = false;
    Enable_RQUOTA = false;
    Enable_UDP = false;
    Plugins_Dir = "{PLUGINS_DIR}";
}}
NFS_KRB5 {{
    Active_krb5 = false;
    CCacheDir = "{ccache}";
}}
NFSv4 {{
    # No grace period: a fresh server would otherwise refuse OPENs for 90 s.
    Graceless = true;
    RecoveryBackend = fs;
    RecoveryRoot = "{recovery}";
    Minor_Versions = 1, 2;
}}
EXPORT {{
    Export_Id = 1;
    Path = "{export}";
    Pseudo = "{pseudo}";
    Protocols = 4;
    Transports = TCP;
    Access_Type = RW;
    Squash = No_Root_Squash;
    SecType = sys;
    # QEMU's user networking connects from an unprivileged host port.
    PrivilegedPort = false;
    FSAL {{
        Name = VFS;
    }}
}}
"""


@dataclass
class NfsServer:
    port: int
    export: Path  # the exported directory on the host
    pseudo: str  # its path for NFSv4 clients
    workdir: Path  # config, pid file, log, recovery directory
    process: subprocess.Popen[bytes]

    @property
    def log(self) -> Path:
        return self.workdir / "ganesha.log"

    def nfsroot(self, host: str = GUEST_HOST, options: str = "vers=4") -> str:
        """The kernel's ``nfsroot=`` value for this export (without the ``nfsroot=``)."""
        return nfsroot_value(host, self.pseudo, self.port, options)


def nfsroot_value(host: str, path: str, port: int, options: str = "vers=4") -> str:
    """``<server>:<path>,port=<port>[,<options>]``, as the kernel's nfsroot= and our initramfs read it."""
    return f"{host}:{path},port={port}" + (f",{options}" if options else "")


@dataclass(frozen=True)
class NfsRootBoot:
    """What an iPXE script needs to boot a machine onto an NFS export."""

    nfsroot: str  # the nfsroot= value: 10.0.2.2:/export,port=N,vers=4
    kernel: Path
    initrd: Path
    marker: str  # the line stored on the export, printed after bootfiles.NFS_ROOT_MARKER_PREFIX

    def kernel_args(self) -> str:
        return f"root=/dev/nfs nfsroot={self.nfsroot} ip=dhcp rw console=ttyS0"

    def ipxe_script(self, base_url: str) -> str:
        """A hand-written script: ``base_url`` serves /vmlinuz (``kernel``) and /initrd (``initrd``)."""
        return f"#!ipxe\ndhcp\nkernel {base_url}/vmlinuz {self.kernel_args()}\ninitrd {base_url}/initrd\nboot\n"


def nfs_root_boot(server: NfsServer, files: NfsBootFiles) -> NfsRootBoot:
    """The ``nfsroot=`` value, kernel, initramfs and marker for booting onto ``server``'s export."""
    marker = (server.export / "ferrum-marker").read_text().strip()
    return NfsRootBoot(nfsroot=server.nfsroot(GUEST_HOST), kernel=files.kernel, initrd=files.initramfs, marker=marker)


@contextlib.contextmanager
def running_nfs_server(workdir: Path, *, marker: str, port: int | None = None) -> Iterator[NfsServer]:
    """ganesha.nfsd exporting ``workdir/export`` (populated with ``marker``); stopped by PID on exit."""
    ensure_nfs_packages()
    workdir.mkdir(parents=True, exist_ok=True)
    export = workdir / "export"
    for directory in ("recovery", "ccache"):
        (workdir / directory).mkdir(mode=0o700, exist_ok=True)
    populate_root(export, marker)
    port = port or unused_tcp_port()
    config = workdir / "ganesha.conf"
    config.write_text(ganesha_config(port=port, export=export, workdir=workdir))
    pid_file, log = workdir / "ganesha.pid", workdir / "ganesha.log"
    with open(workdir / "ganesha.stderr", "wb") as stderr:  # the child keeps its own copy
        process = subprocess.Popen(
            [GANESHA, "-F", "-f", str(config), "-L", str(log), "-p", str(pid_file), "-N", "NIV_EVENT"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
        )
    server = NfsServer(port=port, export=export, pseudo=PSEUDO_PATH, workdir=workdir, process=process)
    try:
        wait_until_listening(server)
        yield server
    finally:
        stop(process)


def wait_until_listening(server: NfsServer, timeout: float = START_TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if server.process.poll() is not None:
            raise RuntimeError(f"ganesha.nfsd exited with {server.process.returncode}: {tail(server)}")
        with socket.socket() as probe:
            probe.settimeout(1.0)
            if probe.connect_ex(("127.0.0.1", server.port)) == 0:
                return
        if time.monotonic() > deadline:
            raise RuntimeError(f"ganesha.nfsd is not listening on 127.0.0.1:{server.port}: {tail(server)}")
        time.sleep(0.2)


def tail(server: NfsServer, chars: int = 3000) -> str:
    texts = []
    for name in ("ganesha.log", "ganesha.stderr"):
        with contextlib.suppress(OSError):
            texts.append((server.workdir / name).read_text(errors="replace")[-chars:])
    return "\n".join(texts)


def stop(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM (ganesha shuts down cleanly in well under a second), then SIGKILL, by PID."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
