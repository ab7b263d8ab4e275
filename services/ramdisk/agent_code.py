"""Which of Ferrum's own files the ramdisk carries, and which Debian packages they need.

The agent goes into the ramdisk as the ``services`` modules it really
imports, found by following every ``import`` statement (also the ones
inside functions) from ``services.agent.__main__``, not as a hand-kept
list that would rot as the agent grows. Third-party imports found on the
way are mapped to the Debian packages that provide them; an import with no
mapping stops the build with its name, so nothing is discovered missing in
a booted VM. The walk also proves the ramdisk's promise: the agent reaches
neither the conductor nor grpc.
"""

from __future__ import annotations

import ast
import sys
from dataclasses import dataclass
from pathlib import Path

ENTRY = "services.agent.__main__"
# Top-level import name -> the Debian package that provides it.
DEBIAN_PYTHON_PACKAGES = {
    "aiohttp": "python3-aiohttp",
    "multidict": "python3-multidict",
    "yarl": "python3-yarl",
    "prometheus_client": "python3-prometheus-client",
    "pycdlib": "python3-pycdlib",
    "httptools": "python3-httptools",
}
NEVER_IN_RAMDISK = ("services.conductor", "grpc", "asyncpg", "sushy")


class AgentCodeError(ValueError):
    """The agent imports something the ramdisk cannot or must not carry."""


@dataclass(frozen=True)
class AgentCode:
    files: tuple[Path, ...]  # relative to the source root, e.g. services/agent/agent.py
    debian_packages: tuple[str, ...]


def _module_file(root: Path, module: str) -> Path | None:
    base = root.joinpath(*module.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(path: Path, module: str) -> set[tuple[str, bool]]:
    """(imported name, whether the import is deferred) for every import in the file.

    Deferred means inside a function or an ``if TYPE_CHECKING:`` block: it
    runs only if that code does."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[tuple[str, bool]] = set()

    def visit(node: ast.AST, deferred: bool) -> None:
        if isinstance(node, ast.Import):
            found.update((alias.name, deferred) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parent = parts[: len(parts) - node.level + 1]
                base = ".".join([*parent, base]) if base else ".".join(parent)
            found.add((base, deferred))
            found.update((f"{base}.{alias.name}", deferred) for alias in node.names)
        for child in ast.iter_child_nodes(node):
            inner = deferred or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(node, ast.If) and _is_type_checking(node.test) and child in node.body:
                inner = True
            visit(child, inner)

    visit(ast.parse(path.read_text(), filename=str(path)), False)
    return found


def collect(root: Path) -> AgentCode:
    """Ferrum files and Debian packages the agent needs, from sources under ``root``."""
    stdlib = set(sys.stdlib_module_names)
    seen: set[str] = set()
    files: set[Path] = set()
    third_party: dict[str, str] = {}  # top-level name -> first importer
    pending = [ENTRY]
    while pending:
        module = pending.pop()
        if module in seen:
            continue
        seen.add(module)
        path = _module_file(root, module)
        if path is None:
            continue  # "from services.common import errors" also yields the non-module "...errors.X"
        files.add(path.relative_to(root))
        parts = module.split(".")
        for depth in range(1, len(parts)):  # every enclosing package's __init__ runs on import
            pending.append(".".join(parts[:depth]))
        for name, deferred in _imports(path, module):
            banned = next((b for b in NEVER_IN_RAMDISK if name == b or name.startswith(b + ".")), None)
            if banned and deferred:
                continue  # a server-side helper of a shared module (errors.grpc_code): never run by the agent
            if banned:
                raise AgentCodeError(f"{module} imports {name}: the ramdisk agent must not need {banned}")
            top = name.split(".")[0]
            if top == "services":
                pending.append(name)
            elif top and top not in stdlib and top != "__future__":
                third_party.setdefault(top, module)
    unknown = {name: importer for name, importer in third_party.items() if name not in DEBIAN_PYTHON_PACKAGES}
    if unknown:
        listed = ", ".join(f"{name} (imported by {importer})" for name, importer in sorted(unknown.items()))
        raise AgentCodeError(f"no Debian package is known for {listed}: add it to DEBIAN_PYTHON_PACKAGES")
    return AgentCode(
        files=tuple(sorted(files)),
        debian_packages=tuple(sorted({DEBIAN_PYTHON_PACKAGES[name] for name in third_party})),
    )
