"""Packages share code only through ``services.common`` (issue 15).

The deploy agent runs in a ramdisk, the api and the iPXE renderer scale on
their own, and the simulator plays the machines: none of them may reach into
the conductor, and the api does not reach into the renderer either. ``services.common`` itself must not depend on any service, or
the rule would hold in name only. Every ``import`` statement is checked,
including the ones inside functions, which a plain "import and look at
``sys.modules``" test would miss.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SERVICES = ("agent", "api", "conductor", "ipxe", "objectstore", "simulator")
# package -> the service packages it must not import
FORBIDDEN: dict[str, tuple[str, ...]] = {
    "agent": ("conductor",),
    "api": ("conductor", "ipxe"),  # the ipxe_config passthru asks the renderer over gRPC
    "ipxe": ("conductor",),
    "simulator": ("conductor",),
    "common": SERVICES,
}


def imported_modules(path: Path, root: Path) -> Iterator[tuple[int, str]]:
    """(line, absolute module name) of every import in the file, relative ones resolved."""
    package = ".".join(path.relative_to(root).with_suffix("").parts[:-1])
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parent, base]) if base else ".".join(parent)
            yield node.lineno, base
            for alias in node.names:  # "from services import conductor"
                yield node.lineno, f"{base}.{alias.name}"


def violations(package: str, root: Path = ROOT) -> list[str]:
    found = []
    banned = tuple(f"services.{name}" for name in FORBIDDEN[package])
    for path in sorted((root / "services" / package).rglob("*.py")):
        for line, module in imported_modules(path, root):
            if any(module == b or module.startswith(b + ".") for b in banned):
                found.append(f"{path.relative_to(root)}:{line} imports {module}")
    return found


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_package_does_not_import_what_it_must_not(package: str) -> None:
    assert (ROOT / "services" / package).is_dir()
    assert violations(package) == []


def test_the_check_sees_imports_inside_functions(tmp_path: Path) -> None:
    """The checker itself: lazy, relative and plain imports are all caught; other services are not."""
    probe = tmp_path / "services" / "simulator" / "sub" / "probe.py"
    probe.parent.mkdir(parents=True)
    probe.write_text(
        "import services.conductor as c\n"
        "from services.common import errors\n"
        "def f():\n    from services.conductor.drivers import base\n"
        "def g():\n    from ...conductor import manager\n"
        "def h():\n    from services import conductor, agent\n"
    )
    found = violations("simulator", tmp_path)
    assert sorted(v.split(" imports ")[1] for v in found) == [
        "services.conductor",
        "services.conductor",
        "services.conductor",
        "services.conductor.drivers",
        "services.conductor.drivers.base",
        "services.conductor.manager",
    ]
    assert all(v.startswith("services/simulator/sub/probe.py:") for v in found)
