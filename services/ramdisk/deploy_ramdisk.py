"""``ferrum ramdisk build``: Debian's kernel plus an initramfs that runs Ferrum's agent.

The initramfs holds busybox (the init, DHCP, insmod), Debian's Python with
the agent's libraries, the tools the agent runs (``sgdisk``, ``sfdisk``),
the kernel modules for common NICs and disks, and the agent's own modules
(:mod:`services.ramdisk.agent_code`). Its init is ``files/deploy-init.sh``.

Debian packages are cached under ``<cache>/debs`` and the kernel under
``<cache>/kernels``, so only the first build downloads (about 90 MB); the
finished pair is written to the output directory atomically, with a
``ramdisk.json`` describing it.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass
from importlib import resources
from pathlib import Path

from services.ramdisk import agent_code, debian, python_runtime, rootfs
from services.ramdisk.kernel import fetch_kernel

# Network and storage drivers of QEMU's and common servers' devices, and what
# the agent needs to read config drives; their dependencies come along.
MODULES = (
    "virtio_pci",
    "virtio_net",
    "virtio_blk",
    "virtio_scsi",
    "sd_mod",
    "ahci",
    "nvme",
    "e1000",
    "e1000e",
    "isofs",
    "vfat",
    "nls_cp437",
    "nls_ascii",
    # A virtual-media boot's drives: the CD it booted from (IDE on a PC's PIIX) and the
    # floppy whose parameters.txt the agent reads (CONTRACT.md 6.1).
    "ata_piix",
    "sr_mod",
    "floppy",
)
# gdisk: sgdisk, fdisk: sfdisk (config drive partitions); mtools: reading a FAT image,
# such as the parameters floppy, without mounting it (services.common.images.fat).
# tgt: tgtd serves the disk for the iSCSI deploy (its perl tgt-admin and sg3-utils stay out: NEVER).
TOOLS = ("busybox-static", "gdisk", "fdisk", "mtools", "tgt")
AGENT_DIR = "opt/ferrum"


@dataclass(frozen=True)
class RamdiskBuild:
    kernel: Path
    initramfs: Path
    kernel_package: str
    packages: int
    downloaded_bytes: int
    uncompressed_bytes: int
    compressed_bytes: int
    seconds: float
    inputs: str  # digest of everything the build used: an unchanged digest means an identical ramdisk


def source_root() -> Path:
    """The directory holding the ``services`` package this code runs from."""
    return Path(__file__).resolve().parents[2]


def _init_file(name: str) -> str:
    return resources.files("services.ramdisk").joinpath(f"files/{name}").read_text()


def _inputs_digest(code: agent_code.AgentCode, debs: dict[str, Path], kernel: str, modules: tuple[str, ...]) -> str:
    digest = hashlib.sha256()
    for relative in code.files:
        digest.update(relative.as_posix().encode() + b"\0" + (source_root() / relative).read_bytes())
    for name in ("deploy-init.sh", "udhcpc.script", "agent-smoke.py"):
        digest.update(_init_file(name).encode())
    # How the tree is put together counts too (what is pruned, which tools and modules).
    for builder in sorted(resources.files("services.ramdisk").iterdir(), key=lambda f: f.name):
        if builder.name.endswith(".py"):
            digest.update(builder.name.encode() + b"\0" + builder.read_bytes())
    digest.update("\0".join([kernel, *sorted(p.name for p in debs.values()), *modules]).encode())
    return digest.hexdigest()


def _previous(output: Path, inputs: str) -> RamdiskBuild | None:
    """The build already in ``output`` when it was made from the same inputs."""
    try:
        recorded = json.loads((output / "ramdisk.json").read_text())
        build = RamdiskBuild(
            **{**recorded, "kernel": Path(recorded["kernel"]), "initramfs": Path(recorded["initramfs"])}
        )
    except (OSError, ValueError, TypeError, KeyError):
        return None
    if build.inputs != inputs or not build.kernel.is_file() or not build.initramfs.is_file():
        return None
    return build


def build_ramdisk(
    output: Path, *, cache: Path, modules: tuple[str, ...] = MODULES, reuse: bool = False
) -> RamdiskBuild:
    """Build ``output/ferrum-agent.kernel`` and ``output/ferrum-agent.initramfs``.

    ``reuse``: return the build already in ``output`` if nothing it was made
    from has changed (the agent's code, the init, the packages' versions)."""
    started = time.monotonic()
    # Absolute: the build runs the tree's Python inside the tree, where relative paths
    # (the default state dir .ferrum) would name nothing.
    output, cache = output.absolute(), cache.absolute()
    code = agent_code.collect(source_root())
    with debian.locked(cache):
        kernel = fetch_kernel(cache)
        names = debian.closure(
            (*python_runtime.PYTHON_PACKAGES, *code.debian_packages, *TOOLS), never=python_runtime.NEVER
        )
        debs = debian.download(names, cache / "debs")
    inputs = _inputs_digest(code, debs, kernel.package, modules)
    if reuse and (previous := _previous(output, inputs)) is not None:
        return previous
    output.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=output, prefix=".build-") as tmp:
        root = Path(tmp) / "root"
        rootfs.unpack(debs.values(), root)
        rootfs.prune(root)
        rootfs.install_busybox(root)
        rootfs.install_modules(root, kernel, list(modules))
        for relative in code.files:
            target = root / AGENT_DIR / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source_root() / relative, target)
        rootfs.install_file(root, "init", _init_file("deploy-init.sh"), mode=0o755)
        rootfs.install_file(root, "etc/ferrum/udhcpc.script", _init_file("udhcpc.script"), mode=0o755)
        python_runtime.finish(root, code_dirs=(AGENT_DIR,))
        # The proof that this Python with these libraries runs the agent: its command line, and
        # its command API answering a command (files/agent-smoke.py).
        python_runtime.run_python(root, "-m", "services.agent", "--help", pythonpath=str(root / AGENT_DIR))
        python_runtime.run_python(root, "-c", _init_file("agent-smoke.py"), pythonpath=str(root / AGENT_DIR))
        initramfs = output / "ferrum-agent.initramfs"
        uncompressed, compressed = rootfs.pack(root, initramfs)
    kernel_copy = output / "ferrum-agent.kernel"
    shutil.copyfile(kernel.vmlinuz, kernel_copy.with_name(kernel_copy.name + ".partial"))
    os.replace(kernel_copy.with_name(kernel_copy.name + ".partial"), kernel_copy)
    result = RamdiskBuild(
        kernel=kernel_copy,
        initramfs=initramfs,
        kernel_package=kernel.package,
        packages=len(debs),
        downloaded_bytes=sum(p.stat().st_size for p in debs.values()),
        uncompressed_bytes=uncompressed,
        compressed_bytes=compressed,
        seconds=round(time.monotonic() - started, 1),
        inputs=inputs,
    )
    (output / "ramdisk.json").write_text(
        json.dumps({k: str(v) if isinstance(v, Path) else v for k, v in asdict(result).items()}, indent=1) + "\n"
    )
    return result
