"""The ramdisk builder's pure steps: dependency listings, module order from
``.modinfo``, the newc archive, and which of Ferrum's files the agent needs."""

from __future__ import annotations

import struct
import subprocess
from pathlib import Path

import pytest

from services.ramdisk import agent_code, cpio, debian, kmod, python_runtime

REPO = Path(__file__).resolve().parents[2]

APT_DEPENDS = """\
python3-aiohttp
  Depends: python3-yarl
  Depends: <python3:any>
    python3
  PreDepends: libc6
  Recommends: libjs-jquery
busybox-static
  Depends: libc6
gdisk
 |Depends: libpopt0
  Depends: libstdc++6
  Depends: <virtual-only>
"""


def test_apt_depends_listing_becomes_groups_of_alternatives() -> None:
    graph = debian.parse_depends(APT_DEPENDS)
    assert graph["python3-aiohttp"] == [["python3-yarl"], ["python3"], ["libc6"]]  # Recommends ignored
    assert graph["busybox-static"] == [["libc6"]]
    # "|Depends" joins the next dependency as an alternative; a virtual package with no provider is empty.
    assert graph["gdisk"] == [["libpopt0", "libstdc++6"], []]


def _module(path: Path, modinfo: bytes) -> Path:
    """A minimal ELF64 relocatable with a section-name table and a .modinfo section."""
    names = b"\0.shstrtab\0.modinfo\0"
    data_offset = 64
    names_offset = data_offset + len(modinfo)
    sections_offset = names_offset + len(names)
    header = bytearray(64)
    header[:6] = b"\x7fELF\x02\x01"
    struct.pack_into("<Q", header, 0x28, sections_offset)
    struct.pack_into("<HHH", header, 0x3A, 64, 3, 1)

    def section(name: int, offset: int, size: int) -> bytes:
        return struct.pack("<IIQQQQIIQQ", name, 1, 0, 0, offset, size, 0, 0, 1, 0)

    table = bytes(64) + section(1, names_offset, len(names)) + section(11, data_offset, len(modinfo))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(bytes(header) + modinfo + names + table)
    return path


def test_modules_come_after_what_they_depend_on(tmp_path: Path) -> None:
    kernel = tmp_path / "6.1.0-test"
    _module(kernel / "kernel" / "net" / "virtio_net.ko", b"license=GPL\0depends=virtio_ring,net_failover\0")
    _module(kernel / "kernel" / "net" / "net_failover.ko", b"depends=failover\0")
    _module(kernel / "kernel" / "net" / "failover.ko", b"depends=\0")
    _module(kernel / "kernel" / "virtio" / "virtio_ring.ko", b"depends=\0")
    _module(kernel / "kernel" / "fs" / "crc-t10dif.ko", b"depends=\0")
    (kernel / "modules.builtin").write_text("kernel/fs/ext4/ext4.ko\n")
    order = kmod.load_order(kernel, ["virtio_net", "ext4", "crc_t10dif"])
    names = [m.name for m in order]
    assert names.index("failover") < names.index("net_failover") < names.index("virtio_net")
    assert names.index("virtio_ring") < names.index("virtio_net")
    assert "ext4" not in names  # built into this kernel: nothing to load
    assert "crc_t10dif" in names  # dashes and underscores name the same module
    with pytest.raises(kmod.ModuleError, match="nvme is not in"):
        kmod.load_order(kernel, ["nvme"])
    bogus = tmp_path / "bogus.ko"
    bogus.write_bytes(b"not an elf file at all")
    with pytest.raises(kmod.ModuleError, match="not a 64-bit"):
        kmod.modinfo(bogus)


def test_module_dependency_cycle_is_an_error(tmp_path: Path) -> None:
    _module(tmp_path / "a.ko", b"depends=b\0")
    _module(tmp_path / "b.ko", b"depends=a\0")
    with pytest.raises(kmod.ModuleError, match="cycle: a -> b -> a"):
        kmod.load_order(tmp_path, ["a"])


def test_newc_archive_reads_back_with_cpio(tmp_path: Path) -> None:
    """GNU cpio (scripts/apt-packages.txt) reads the archive back: names, modes, owners, links, bytes."""
    root = tmp_path / "root"
    (root / "bin").mkdir(parents=True)
    (root / "bin" / "tool").write_bytes(b"#!/bin/sh\necho hi\n")
    (root / "bin" / "tool").chmod(0o755)
    (root / "etc").mkdir()
    (root / "etc" / "odd-size").write_bytes(b"x" * 13)
    (root / "sbin").symlink_to("bin")
    (root / "bin" / "link").symlink_to("/bin/tool")
    archive = tmp_path / "a.cpio"
    with open(archive, "wb") as stream:
        size = cpio.write_tree(root, stream)
    assert size == archive.stat().st_size and size % 4 == 0
    listing = subprocess.run(
        ["cpio", "-itv", "--quiet"], input=archive.read_bytes(), capture_output=True, check=True
    ).stdout.decode()
    lines = {line.split()[-1] if "->" not in line else line.split()[-3]: line for line in listing.splitlines()}
    assert set(lines) == {"bin", "bin/tool", "bin/link", "etc", "etc/odd-size", "sbin"}
    assert lines["bin/tool"].startswith("-rwxr-xr-x") and " root " in lines["bin/tool"]
    assert "-> /bin/tool" in lines["bin/link"] and "-> bin" in lines["sbin"]
    out = tmp_path / "out"
    out.mkdir()
    subprocess.run(["cpio", "-id", "--quiet"], input=archive.read_bytes(), cwd=out, check=True)
    assert (out / "etc" / "odd-size").read_bytes() == b"x" * 13
    assert (out / "bin" / "tool").read_bytes() == b"#!/bin/sh\necho hi\n"


def test_agent_code_is_the_import_closure_without_conductor_or_grpc() -> None:
    code = agent_code.collect(REPO)
    files = {f.as_posix() for f in code.files}
    assert {"services/agent/__main__.py", "services/agent/agent.py", "services/common/errors.py"} <= files
    assert "services/agent/blockdevices.py" in files  # imported inside a function: still carried
    assert not any(f.startswith(("services/conductor", "services/api", "services/simulator")) for f in files)
    assert "services/common/config.py" not in files
    assert code.debian_packages == (
        "python3-aiohttp",
        "python3-httptools",
        "python3-prometheus-client",
        "python3-pycdlib",
    )


def _tree(tmp_path: Path, agent_source: str) -> Path:
    for package in ("services", "services/agent", "services/common"):
        (tmp_path / package).mkdir(parents=True, exist_ok=True)
        (tmp_path / package / "__init__.py").write_text("")
    (tmp_path / "services" / "agent" / "__main__.py").write_text(agent_source)
    (tmp_path / "services" / "common" / "shared.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import grpc\n"
        "def server_only():\n    import grpc\n    return grpc\n"
    )
    return tmp_path


def test_agent_code_refuses_what_a_ramdisk_cannot_carry(tmp_path: Path) -> None:
    # A deferred grpc import in a shared module (type hints, a server-only helper) is fine.
    ok = agent_code.collect(_tree(tmp_path / "ok", "from services.common import shared\nimport aiohttp\n"))
    assert "services/common/shared.py" in {f.as_posix() for f in ok.files}
    assert ok.debian_packages == ("python3-aiohttp",)
    with pytest.raises(agent_code.AgentCodeError, match=r"must not need services\.conductor"):
        agent_code.collect(_tree(tmp_path / "conductor", "from services.conductor import manager\n"))
    with pytest.raises(agent_code.AgentCodeError, match="must not need grpc"):
        agent_code.collect(_tree(tmp_path / "grpc", "import grpc\n"))
    with pytest.raises(agent_code.AgentCodeError, match=r"no Debian package is known for requests \(imported by"):
        agent_code.collect(_tree(tmp_path / "unknown", "def f():\n    import requests\n"))


def test_the_trees_interpreter_runs_from_a_relative_tree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A relative state dir (``ferrum demo``'s default ``.ferrum``) must not break the build's
    own runs of the ramdisk's Python: the loader runs inside the tree, where a relative
    program path names nothing. The host's loader and echo stand in for Debian's."""
    root = tmp_path / "state" / "root"
    (root / "lib64").mkdir(parents=True)
    (root / "lib64" / "ld-linux-x86-64.so.2").symlink_to("/lib64/ld-linux-x86-64.so.2")
    (root / "lib").mkdir()
    (root / "lib" / "x86_64-linux-gnu").symlink_to("/lib/x86_64-linux-gnu")
    (root / "usr" / "bin").mkdir(parents=True)
    (root / "usr" / "bin" / python_runtime.PYTHON).write_bytes(Path("/bin/echo").read_bytes())
    (root / "usr" / "bin" / python_runtime.PYTHON).chmod(0o755)
    monkeypatch.chdir(tmp_path)
    assert python_runtime.run_python(Path("state/root"), "ran", "in", "the", "tree") == "ran in the tree\n"
