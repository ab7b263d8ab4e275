"""Kernel modules: which ``.ko`` files to load, and in which order.

``dpkg -x`` of a kernel package gives the modules but no ``modules.dep``
(``depmod`` runs at install time), so a busybox init cannot ``modprobe``.
Each module names its own dependencies in the ``depends=`` entry of its ELF
``.modinfo`` section; this module reads that section and orders the
modules so every one comes after what it needs, which is all ``insmod``
needs. Reading ELF here (a few dozen lines) avoids depending on kmod.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

MAX_MODULE_BYTES = 64 * 1024 * 1024


class ModuleError(ValueError):
    """A module is missing or its file is not a readable kernel module."""


@dataclass(frozen=True)
class Module:
    name: str  # as the kernel names it: dashes become underscores
    path: Path
    depends: tuple[str, ...]


def canonical(name: str) -> str:
    return name.replace("-", "_")


def modinfo(path: Path) -> dict[str, list[str]]:
    """The ``key=value`` entries of a module's ``.modinfo`` section (ELF64 little-endian)."""
    data = path.read_bytes()[:MAX_MODULE_BYTES]
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise ModuleError(f"{path} is not a 64-bit little-endian ELF file")
    (shoff,) = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    try:
        sections = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
        names_offset = sections[shstrndx][4]
    except (struct.error, IndexError):
        raise ModuleError(f"{path} has a broken section table") from None
    for section in sections:
        end = data.find(b"\0", names_offset + section[0])
        if data[names_offset + section[0] : end] == b".modinfo":
            offset, size = section[4], section[5]
            entries: dict[str, list[str]] = {}
            for raw in data[offset : offset + size].split(b"\0"):
                key, sep, value = raw.decode("utf-8", "replace").partition("=")
                if sep:
                    entries.setdefault(key, []).append(value)
            return entries
    raise ModuleError(f"{path} has no .modinfo section")


def index_modules(modules_dir: Path) -> dict[str, Path]:
    """{canonical module name: path} of every ``.ko`` under ``modules_dir``."""
    return {canonical(path.name[: -len(".ko")]): path for path in sorted(modules_dir.rglob("*.ko"))}


def load_order(modules_dir: Path, wanted: list[str]) -> list[Module]:
    """``wanted`` and their dependencies, each after everything it depends on.

    A wanted module that this kernel builds in (no ``.ko``, listed in
    ``modules.builtin``) is skipped; one that exists nowhere is an error."""
    index = index_modules(modules_dir)
    builtin = _builtin(modules_dir)
    ordered: list[Module] = []
    placed: set[str] = set()

    def place(name: str, chain: tuple[str, ...]) -> None:
        name = canonical(name)
        if name in placed or (name in builtin and name not in index):
            return
        if name in chain:
            raise ModuleError(f"kernel modules depend on each other in a cycle: {' -> '.join((*chain, name))}")
        path = index.get(name)
        if path is None:
            raise ModuleError(f"kernel module {name} is not in {modules_dir}")
        depends = tuple(d for d in ",".join(modinfo(path).get("depends", [""])).split(",") if d)
        for dependency in depends:
            place(dependency, (*chain, name))
        placed.add(name)
        ordered.append(Module(name, path, depends))

    for name in wanted:
        place(name, ())
    return ordered


def _builtin(modules_dir: Path) -> set[str]:
    builtin = modules_dir / "modules.builtin"
    if not builtin.is_file():
        return set()
    return {canonical(Path(line.strip()).name.removesuffix(".ko")) for line in builtin.read_text().splitlines()}
