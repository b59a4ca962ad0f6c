"""What the package imports is what pyproject.toml declares, and each declared dependency has its tested pin."""

from __future__ import annotations

import ast
import importlib.metadata
import re
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]


def _name(requirement: str) -> str:
    """A requirement's distribution name, normalised as PEP 503 does (``PyYAML`` -> ``pyyaml``)."""
    return re.sub(r"[-_.]+", "-", re.match(r"[A-Za-z0-9._-]+", requirement).group(0)).lower()


def _imported() -> dict[str, str]:
    """Each top-level module the package imports (inside functions too) that is not the standard library's or
    ictrl's -> a file that imports it."""
    found: dict[str, str] = {}
    for path in sorted((ROOT / "src" / "ictrl").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module] if (
                isinstance(node, ast.ImportFrom) and node.level == 0 and node.module) else []
            for name in names:
                top = name.split(".")[0]
                if top not in sys.stdlib_module_names and top != "ictrl":
                    found.setdefault(top, str(path.relative_to(ROOT)))
    return found


def test_every_library_the_package_imports_is_declared() -> None:
    """An import that works only because another dependency happens to pull its distribution in breaks on the
    day that one stops: every third-party module ictrl imports is a core dependency or an extra's."""
    declared = {_name(r) for r in PROJECT["dependencies"]}
    declared |= {_name(r) for extra in PROJECT["optional-dependencies"].values() for r in extra}
    providers = importlib.metadata.packages_distributions()
    undeclared = []
    for module, where in sorted(_imported().items()):
        names = {_name(module)} | {_name(d) for d in providers.get(module, [])}
        if not names & declared:
            undeclared.append(f"{module} ({where}; distribution {sorted(names)})")
    assert undeclared == []
    assert {"torch", "filelock", "yaml"} <= set(_imported())  # the walk walks


def test_every_core_dependency_has_its_tested_pin() -> None:
    """scripts/setup.sh installs the core dependencies under constraints.txt's pins: each has one."""
    pinned = {_name(line) for line in (ROOT / "constraints.txt").read_text(encoding="utf-8").splitlines()
              if line.strip() and not line.startswith("#")}
    assert sorted(_name(r) for r in PROJECT["dependencies"] if _name(r) not in pinned) == []
