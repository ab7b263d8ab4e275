"""The api's modules share code only through public names (issue 15).

A name starting with ``_`` is its module's own business; importing it from
another module (or reaching it as ``module._name``) ties the two together
behind the reader's back, which is how ``rest.py`` and the modules that
imported its helpers ended up importing each other. This reads every module
of ``services/api`` with :mod:`ast` and fails on any such use.
"""

from __future__ import annotations

import ast
from pathlib import Path

API = Path(__file__).resolve().parents[2] / "services" / "api"


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def private_uses(source: str) -> list[str]:
    """``from x import _y``, ``import x._y``, ``from x._y import z`` and ``x._y`` on an imported module."""
    tree = ast.parse(source)
    found: list[str] = []
    modules: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if any(_private(part) for part in (node.module or "").split(".")):
                found.append(f"line {node.lineno}: from {node.module} import ...")
            for alias in node.names:
                if _private(alias.name):
                    found.append(f"line {node.lineno}: from {node.module} import {alias.name}")
                modules.add(alias.asname or alias.name)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if any(_private(part) for part in alias.name.split(".")):
                    found.append(f"line {node.lineno}: import {alias.name}")
                modules.add(alias.asname or alias.name.split(".")[0])
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in modules
            and _private(node.attr)
        ):
            found.append(f"line {node.lineno}: {node.value.id}.{node.attr}")
    return found


def test_no_api_module_uses_another_modules_private_names() -> None:
    modules = sorted(API.glob("*.py"))
    assert len(modules) > 20, "services/api not found where expected"
    offenders = {path.name: uses for path in modules if (uses := private_uses(path.read_text()))}
    assert offenders == {}


def test_the_check_sees_each_kind_of_private_use() -> None:
    """The checker itself, on code that breaks the rule in every way it looks for."""
    source = (
        "from services.api.rest import _bool, public\n"
        "from services.api._hidden import thing\n"
        "import services.api._private_module\n"
        "from services.api import views\n"
        "views._TIMESTAMPS\n"
        "self._own_attribute\n"
        "views.__name__\n"
    )
    assert private_uses(source) == [
        "line 1: from services.api.rest import _bool",
        "line 2: from services.api._hidden import ...",
        "line 3: import services.api._private_module",
        "line 5: views._TIMESTAMPS",
    ]
