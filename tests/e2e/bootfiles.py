"""Boot files for the QEMU tests: Debian's kernel and a busybox initramfs, cached.

Fetching the kernel package takes a while on a fresh machine, so it happens
before any stack starts: ``scripts/bootstrap.sh`` runs this module, and the
tests' module fixture (which the stack fixture depends on) only finds the
cached files. Nothing slow may run while a stack's event loop is running: a
stall longer than the heartbeat timeout looks like a dead conductor.

    python -m tests.e2e.bootfiles    # fetch the kernel into .ferrum/cache/ipxe-e2e

The NFS-root initramfs (``ensure_nfs_initramfs``) loads kernel modules, which
must come from the very kernel it boots with: it takes the kernel and its
module tree from Debian's package unpacked under ``.ferrum/cache/debian``
(the same one the real-VM tests' ramdisk uses) and returns both.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from services.ramdisk import debian, rootfs
from services.ramdisk.kernel import fetch_kernel

REPO = Path(__file__).resolve().parents[2]
CACHE = REPO / ".ferrum" / "cache" / "ipxe-e2e"
PACKAGES = ("qemu-system-x86", "ipxe-qemu", "busybox-static", "cpio", "tgt", "ovmf")
MARKER = "FERRUM-E2E-MARKER-initramfs-running"
DEBIAN_CACHE = REPO / ".ferrum" / "cache" / "debian"
FILES = Path(__file__).resolve().parent / "files"
# The NIC QEMU's tests use, and the NFSv4 client: nfsv4 pulls in sunrpc, netfs,
# fscache, grace, lockd, nfs and dns_resolver (Debian builds them all as modules).
NFS_MODULES = ("virtio_pci", "virtio_net", "nfsv4")
NFS_ROOT_MARKER_PREFIX = "FERRUM-NFS-ROOT: "  # what the NFS root prints before its marker line


def run(*argv: str, cwd: Path | None = None, timeout: float = 600) -> str:
    result = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({result.returncode}): {result.stderr.strip()[-2000:]}")
    return result.stdout


def installed(package: str) -> bool:
    result = subprocess.run(["dpkg-query", "-W", "-f=${Status}", package], capture_output=True, text=True, check=False)
    return result.returncode == 0 and "install ok installed" in result.stdout


def ensure_packages(*extra: str) -> None:
    missing = [p for p in (*PACKAGES, *extra) if not installed(p)]
    if not missing:
        return
    if os.geteuid() != 0:
        raise RuntimeError(f"missing Debian packages {missing}; install them (apt-get install -y {' '.join(missing)})")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for attempt in range(20):  # another apt may hold the lock for a while
        result = subprocess.run(
            ["apt-get", "install", "-y", "--no-install-recommends", *missing],
            capture_output=True,
            text=True,
            env=env,
            timeout=900,
            check=False,
        )
        if result.returncode == 0:
            return
        if "lock" not in result.stderr.lower() or attempt == 19:
            raise RuntimeError(f"apt-get install {missing} failed: {result.stderr[-2000:]}")
        time.sleep(15)


def kernel_package() -> str:
    """The linux-image-6.1.0-N-amd64 that linux-image-amd64 currently depends on."""
    for line in run("apt-cache", "depends", "linux-image-amd64").splitlines():
        name = line.strip().removeprefix("Depends:").strip()
        if name.startswith("linux-image-6.1.0-") and name.endswith("-amd64"):
            return name
    found = sorted(
        line.split()[0]
        for line in run("apt-cache", "search", "--names-only", r"^linux-image-6\.1\.0-[0-9]+-amd64$").splitlines()
    )
    if not found:
        raise RuntimeError("no linux-image-6.1.0-*-amd64 package is known to apt")
    return found[-1]


def ensure_kernel() -> Path:
    """vmlinuz from the Debian kernel package, downloaded and unpacked once."""
    kernel = CACHE / "vmlinuz"
    if kernel.is_file() and kernel.stat().st_size > 1_000_000:
        return kernel
    CACHE.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=CACHE) as tmp:
        work = Path(tmp)
        os.chmod(work, 0o777)  # apt-get download drops privileges to _apt
        run("apt-get", "download", kernel_package(), cwd=work)
        deb = next(work.glob("linux-image-*.deb"))
        run("dpkg-deb", "-x", str(deb), str(work / "root"))
        image = next((work / "root" / "boot").glob("vmlinuz-*"))
        shutil.copyfile(image, CACHE / "vmlinuz.tmp")
    os.replace(CACHE / "vmlinuz.tmp", kernel)
    return kernel


def ensure_initramfs(marker: str) -> Path:
    """A gzip'd newc cpio: busybox-static plus an /init that prints ``marker`` and powers off."""
    init = (
        "#!/bin/busybox sh\n/bin/busybox mkdir -p /proc\n/bin/busybox mount -t proc proc /proc\n"
        f"echo {marker} > /dev/console\n"
        "/bin/busybox cat /proc/cmdline > /dev/console\n/bin/busybox sleep 1\n/bin/busybox poweroff -f\n"
    )
    digest = hashlib.sha256(init.encode() + Path("/bin/busybox").read_bytes()).hexdigest()[:16]
    image = CACHE / f"initramfs-{digest}.cpio.gz"
    if image.is_file():
        return image
    CACHE.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=CACHE) as tmp:
        root = Path(tmp) / "root"
        (root / "bin").mkdir(parents=True)
        (root / "dev").mkdir()
        shutil.copyfile("/bin/busybox", root / "bin" / "busybox")
        os.chmod(root / "bin" / "busybox", 0o755)
        (root / "init").write_text(init)
        os.chmod(root / "init", 0o755)
        names = "\n".join(["bin", "bin/busybox", "dev", "init"]) + "\n"
        cpio = subprocess.run(
            ["cpio", "-o", "-H", "newc", "--quiet"],
            cwd=root,
            input=names.encode(),
            capture_output=True,
            timeout=60,
            check=True,
        ).stdout

        (Path(tmp) / "out").write_bytes(gzip.compress(cpio))
        os.replace(Path(tmp) / "out", image)
    return image


@dataclass(frozen=True)
class NfsBootFiles:
    """A kernel and the initramfs that mounts ``nfsroot=`` as its root; its modules are that kernel's."""

    kernel: Path
    initramfs: Path
    kernel_package: str
    modules: tuple[str, ...]  # what /init insmods, in order (paths under /lib/modules)


def ensure_nfs_initramfs() -> NfsBootFiles:
    """Debian's kernel and a busybox initramfs for ``root=/dev/nfs nfsroot=... ip=dhcp``, built once.

    Debian's kernel has neither ``CONFIG_ROOT_NFS`` nor ``CONFIG_IP_PNP`` and
    builds virtio-net and the NFS client as modules, so the initramfs's /init
    (``files/nfsroot-init.sh``) does what the kernel would: insmod, DHCP
    (busybox udhcpc), mount the export, switch_root to its /sbin/init."""
    DEBIAN_CACHE.mkdir(parents=True, exist_ok=True)
    with debian.locked(DEBIAN_CACHE):
        kernel = fetch_kernel(DEBIAN_CACHE)
    scripts = {name: (FILES / name).read_bytes() for name in ("nfsroot-init.sh", "nfsroot-udhcpc.sh")}
    digest = hashlib.sha256()
    for name, text in sorted(scripts.items()):
        digest.update(name.encode() + b"\0" + text + b"\0")
    digest.update(Path("/bin/busybox").read_bytes())
    digest.update("\0".join([kernel.package, *NFS_MODULES]).encode())
    image = CACHE / f"nfsroot-initramfs-{digest.hexdigest()[:16]}.cpio.gz"
    order_file = image.with_suffix(".modules")
    if image.is_file() and order_file.is_file():
        modules = tuple(order_file.read_text().split())
        return NfsBootFiles(kernel.vmlinuz, image, kernel.package, modules)
    CACHE.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=CACHE) as tmp:
        root = Path(tmp) / "root"
        (root / "bin").mkdir(parents=True)
        shutil.copyfile("/bin/busybox", root / "bin" / "busybox")
        os.chmod(root / "bin" / "busybox", 0o755)
        rootfs.install_busybox(root)
        modules = tuple(rootfs.install_modules(root, kernel, list(NFS_MODULES)))
        rootfs.install_file(root, "init", scripts["nfsroot-init.sh"].decode(), mode=0o755)
        rootfs.install_file(root, "etc/ferrum/udhcpc.script", scripts["nfsroot-udhcpc.sh"].decode(), mode=0o755)
        order_file.write_text("".join(f"{m}\n" for m in modules))
        rootfs.pack(root, image)
    return NfsBootFiles(kernel.vmlinuz, image, kernel.package, modules)


def main() -> int:
    ensure_packages()
    print(f"test kernel: {ensure_kernel()}")
    print(f"test initramfs: {ensure_initramfs(MARKER)}")
    nfs = ensure_nfs_initramfs()
    print(f"NFS-root kernel: {nfs.kernel}")
    print(f"NFS-root initramfs: {nfs.initramfs}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
