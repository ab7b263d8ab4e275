"""Debian's Python in a root tree: which packages, and making it ready to boot.

The ramdisk runs the agent on Debian's ``python3.11`` with Debian's
``python3-aiohttp`` and friends, unpacked from their packages. Two things a
package install would do are done here instead: the ``python3`` link, and
byte-compiling. Without ``.pyc`` files every boot would compile aiohttp and
the agent again, seconds of CPU on an emulated machine, so everything is
compiled at build time (``unchecked-hash`` pycs: valid whatever the files'
times are after the cpio round trip).

Both compiling and the import check after it run the tree's *own*
interpreter through the tree's own dynamic loader, so the build proves that
this Python, with these libraries, imports the agent, without chroot and
without root.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from services.ramdisk import debian

PYTHON = "python3.11"
PYTHON_PACKAGES = ("python3.11-minimal", "libpython3.11-stdlib")
SITE_DIRS = ("usr/lib/python3.11", "usr/lib/python3/dist-packages")
# Needed only to install or to run other programs, never by the agent; the
# walk over dependencies stops here (see services.ramdisk.debian.closure).
NEVER = frozenset(
    {
        "dpkg",
        "debconf",
        "install-info",
        "perl-base",
        # tgt's admin script and SCSI tools: tgtd itself needs none of them.
        "libconfig-general-perl",
        "sg3-utils",
        "lsb-base",
        "sysvinit-utils",
        "init-system-helpers",
        "perl",
        "perl-modules-5.36",
        "libperl5.36",
        "tar",
        "tzdata",
        "sensible-utils",
        "readline-common",
        "media-types",
        "mailcap",
        "mime-support",
        "libmagic1",
        "libmagic-mgc",
        "genisoimage",  # pycdlib's Debian package depends on it for tools the library does not use
        "python3",
        "python3-minimal",
        "libpython3-stdlib",
        "libnsl2",
        "libtirpc3",
        "libtirpc-common",
        "libdb5.3",
        "libgdbm6",
        "libgdbm-compat4",
    }
)


def run_python(root: Path, *args: str, pythonpath: str = "", timeout: float = 300) -> str:
    """Run the tree's interpreter on this machine (its ld.so, its libraries, its stdlib)."""
    # Absolute: the loader runs in the tree (cwd below), where a relative program path
    # (a relative state dir such as the default .ferrum) names nothing.
    root = root.absolute()
    loader = root / "lib64" / "ld-linux-x86-64.so.2"
    if not loader.exists():
        raise debian.PackageError("the root tree has no lib64/ld-linux-x86-64.so.2 (libc6 not unpacked?)")
    libraries = ":".join(str(root / d) for d in ("lib/x86_64-linux-gnu", "usr/lib/x86_64-linux-gnu"))
    # The build machine's tools (sgdisk, sfdisk): the ramdisk's own copies need its loader and libraries.
    env = {"PYTHONHOME": str(root / "usr"), "PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    done = subprocess.run(
        [str(loader.resolve()), "--library-path", libraries, str(root / "usr" / "bin" / PYTHON), *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=root,  # not the build's directory: "-m" puts the current directory first on sys.path
        timeout=timeout,
        check=False,
    )
    if done.returncode != 0:
        raise debian.PackageError(
            f"the ramdisk's Python failed ({' '.join(args[:4])} ...): {(done.stderr or done.stdout).strip()[-2000:]}"
        )
    return done.stdout


def finish(root: Path, *, code_dirs: tuple[str, ...]) -> None:
    """``python3`` link and byte-compiled stdlib, site packages and ``code_dirs`` (paths in the tree)."""
    link = root / "usr" / "bin" / "python3"
    if not link.exists():
        link.symlink_to(PYTHON)
    targets = [str(root / d) for d in (*SITE_DIRS, *code_dirs) if (root / d).is_dir()]
    run_python(
        root,
        "-s",  # the interpreter's -s: no user site directory (-I would also drop PYTHONHOME)
        "-m",
        "compileall",
        "-q",
        "-j",
        str(min(4, os.cpu_count() or 1)),
        "--invalidation-mode",
        "unchecked-hash",
        "-s",
        str(root),
        "-p",
        "/",
        *targets,
    )
