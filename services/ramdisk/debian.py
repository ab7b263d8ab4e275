"""Debian packages from this machine's package sources, cached on disk.

The ramdisk and the demo OS are built from what ``apt`` can fetch here
(Debian's kernel, busybox, Python and its libraries), never from prebuilt
images. apt does the fetching, so its sources, proxy and signatures apply;
this module only decides *which* packages and keeps the ``.deb`` files in a
cache directory, so a rebuild downloads nothing.

A package's dependency closure is walked here rather than with
``apt-cache depends --recurse``, because the walk has to stop at packages a
ramdisk never needs (dpkg, perl, debconf ...): a recursive listing would pull
in everything *they* depend on too. Of each group of alternatives the first
one is taken, and a virtual package resolves to its first provider.
"""

from __future__ import annotations

import fcntl
import logging
import os
import subprocess
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

LOG = logging.getLogger(__name__)
APT_TIMEOUT = 900.0  # a slow mirror on a fresh machine; never unbounded


class PackageError(RuntimeError):
    """apt could not resolve, fetch or unpack a package; the message says which and why."""


def run(argv: list[str], *, cwd: Path | None = None, timeout: float = APT_TIMEOUT) -> str:
    """Run a tool; a non-zero exit is a PackageError carrying the tail of its stderr."""
    try:
        done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False)
    except FileNotFoundError:
        raise PackageError(f"{argv[0]} is not installed (needed to build from Debian packages)") from None
    except subprocess.TimeoutExpired:
        raise PackageError(f"{' '.join(argv[:3])} ... took longer than {timeout:.0f} s") from None
    if done.returncode != 0:
        raise PackageError(f"{' '.join(argv[:4])} ... failed ({done.returncode}): {done.stderr.strip()[-1500:]}")
    return done.stdout


def parse_depends(text: str) -> dict[str, list[list[str]]]:
    """``apt-cache depends`` output -> {package: [[alternative, ...], ...]} (Depends and PreDepends).

    ``|Depends:`` means "or the next one"; a virtual dependency
    (``<python3:any>``) stands for its providers, listed indented below it."""
    items: dict[str, list[tuple[list[str], bool]]] = {}
    package = ""
    relevant = False
    for line in text.splitlines():
        if not line.startswith(" "):
            package = line.strip()
            items.setdefault(package, [])
            relevant = False
            continue
        stripped = line.strip()
        if line.startswith("    "):  # a provider of the virtual package above
            if relevant and items[package]:
                items[package][-1][0].append(stripped.split(":")[0])
            continue
        kind, _, name = stripped.lstrip("|").partition(":")
        relevant = kind in ("Depends", "PreDepends")
        if not relevant:
            continue
        name = name.strip()
        names = [] if name.startswith("<") else [name.split(":")[0]]
        items[package].append((names, stripped.startswith("|")))
    found: dict[str, list[list[str]]] = {}
    for package, entries in items.items():
        groups: list[list[str]] = []
        current: list[str] = []
        for names, or_next in entries:
            current.extend(names)
            if not or_next:
                groups.append(current)
                current = []
        if current:
            groups.append(current)
        found[package] = groups
    return found


def closure(roots: Iterable[str], *, never: frozenset[str]) -> list[str]:
    """``roots`` and everything they depend on, not descending into ``never``.

    One ``apt-cache depends --recurse`` lists the whole graph (it descends
    everywhere, ``never`` included); the walk that honours ``never`` is done here."""
    roots = sorted(set(roots) - never)
    graph = parse_depends(
        run(
            [
                "apt-cache",
                "depends",
                "--recurse",
                "--no-recommends",
                "--no-suggests",
                "--no-conflicts",
                "--no-breaks",
                "--no-replaces",
                "--no-enhances",
                *roots,
            ],
            timeout=120,
        )
    )
    missing = [p for p in roots if p not in graph]
    if missing:
        raise PackageError(f"apt knows no package {', '.join(missing)} (apt-get update?)")
    wanted: set[str] = set()
    frontier = list(roots)
    while frontier:
        package = frontier.pop()
        if package in wanted:
            continue
        wanted.add(package)
        for group in graph.get(package, []):
            usable = [name for name in group if name and name not in never]
            if usable and not any(name in wanted for name in usable):
                frontier.append(usable[0])
    return sorted(wanted)


@contextmanager
def locked(directory: Path) -> Iterator[None]:
    """One builder at a time per cache directory (the bootstrap script and a test may race)."""
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / ".lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def download(packages: Iterable[str], cache: Path) -> dict[str, Path]:
    """{package: .deb in ``cache``}, fetching only what the cache lacks.

    ``apt-get download --print-uris`` names the exact file of the candidate
    version, so a cached older version is never mistaken for the current one."""
    names = sorted(set(packages))
    cache.mkdir(parents=True, exist_ok=True)
    files: dict[str, Path] = {}
    with tempfile.TemporaryDirectory(prefix="ferrum-apt-") as empty:
        # In an empty directory: apt-get leaves out packages whose file is in the current one.
        listing = run(["apt-get", "download", "--print-uris", *names], cwd=Path(empty), timeout=120)
    for line in listing.splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[0].startswith("'"):
            filename = parts[1]
            files[filename.split("_", 1)[0]] = cache / filename
    unknown = [n for n in names if n not in files]
    if unknown:
        raise PackageError(f"apt has no downloadable candidate for {', '.join(unknown)}")
    missing = [name for name, path in files.items() if not path.is_file()]
    if missing:
        LOG.info("downloading Debian packages count=%d", len(missing))
        with tempfile.TemporaryDirectory(dir=cache, prefix="download-") as tmp:
            os.chmod(tmp, 0o777)  # apt-get download drops privileges to _apt when run as root
            run(["apt-get", "download", *missing], cwd=Path(tmp))
            for name in missing:
                fetched = Path(tmp) / files[name].name
                if not fetched.is_file():
                    raise PackageError(f"apt-get download did not produce {fetched.name}")
                os.replace(fetched, files[name])
    return {name: files[name] for name in names}


def extract(deb: Path, destination: Path) -> None:
    """Unpack a package's files (no maintainer scripts run: nothing is installed)."""
    destination.mkdir(parents=True, exist_ok=True)
    run(["dpkg-deb", "-x", str(deb), str(destination)], timeout=300)


def kernel_package() -> str:
    """The ``linux-image-<abi>-amd64`` package that ``linux-image-amd64`` currently depends on."""
    for groups in parse_depends(run(["apt-cache", "depends", "linux-image-amd64"], timeout=120)).values():
        for group in groups:
            for name in group:
                if name.startswith("linux-image-") and name.endswith("-amd64") and name != "linux-image-amd64":
                    return name
    raise PackageError("linux-image-amd64 depends on no linux-image-*-amd64 package here")
