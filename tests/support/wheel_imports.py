"""Run by an installed Ferrum's own interpreter (``python -I``, so no checkout
is on its path): does the wheel carry everything its code imports?

Prints one JSON object:

* ``location``: where ``services`` was imported from (must be site-packages);
* ``modules``: how many modules of ``services`` and ``ferrum`` were imported,
  and ``failed``: the ones that raised on import, with the error;
* ``undeclared``: distributions that some module imports directly (found by
  reading every ``import`` statement, those inside functions too, which a plain
  import pass would miss) but that Ferrum's metadata does not require;
* ``unbounded``: required distributions without a ``>=`` lower bound.
"""

from __future__ import annotations

import ast
import importlib
import importlib.metadata
import json
import pkgutil
import re
import sys
from pathlib import Path

FIRST_PARTY = ("services", "ferrum")


def normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def imported_top_levels(package_dir: Path) -> set[str]:
    names: set[str] = set()
    for path in package_dir.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module.split(".")[0])
    return {n for n in names if n not in sys.stdlib_module_names and n not in FIRST_PARTY}


def main() -> None:
    failed: dict[str, str] = {}
    count = 0
    imports: set[str] = set()
    location = ""
    for top in FIRST_PARTY:
        package = importlib.import_module(top)
        package_dir = Path(package.__path__[0])
        location = location or str(package_dir)
        imports |= imported_top_levels(package_dir)
        for info in pkgutil.walk_packages(package.__path__, top + "."):
            count += 1
            try:
                importlib.import_module(info.name)
            except BaseException as exc:  # report every failure, not just the first
                failed[info.name] = f"{type(exc).__name__}: {exc}"
    providers = importlib.metadata.packages_distributions()
    requires: dict[str, str] = {}
    for line in importlib.metadata.requires("ferrum") or []:
        if "extra ==" in line:
            continue
        match = re.match(r"([A-Za-z0-9_.-]+)\s*(.*)", line)
        assert match
        requires[normalise(match.group(1))] = match.group(2)
    undeclared: dict[str, list[str]] = {}
    for name in sorted(imports):
        dists = [normalise(d) for d in providers.get(name, [])]
        if not dists or not any(d in requires for d in dists):
            undeclared[name] = dists
    unbounded = sorted(d for d, spec in requires.items() if ">=" not in spec)
    print(
        json.dumps(
            {
                "location": location,
                "modules": count,
                "failed": failed,
                "imports": sorted(imports),
                "undeclared": undeclared,
                "unbounded": unbounded,
            }
        )
    )


if __name__ == "__main__":
    main()
