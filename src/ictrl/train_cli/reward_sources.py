"""The source files a user's reward function runs: its own module and the local modules it imports, transitively
(``--resume`` compares their hashes, ``run_inputs.input_hashes``). A module is local when its file lies outside
the standard library, the installed packages and ictrl itself: beside the reward's file, under the working
directory, on a ``PYTHONPATH`` of the user's. Imports are read from each file's syntax tree (those inside a
function too), and found among the modules Python has loaded, else by ``importlib.util.find_spec`` where that
imports nothing new."""

from __future__ import annotations

import ast
import importlib.util
import sys
from pathlib import Path
from types import ModuleType


def _outside_roots() -> list[Path]:
    """The folders whose modules are not the user's: the standard library, site-packages, ictrl's package."""
    import site
    import sysconfig

    paths = sysconfig.get_paths()
    roots = {paths[key] for key in ("stdlib", "platstdlib", "purelib", "platlib") if key in paths}
    roots.update(site.getsitepackages() if hasattr(site, "getsitepackages") else [])
    roots.add(site.getusersitepackages())
    roots.add(str(Path(__file__).resolve().parents[1]))
    return [Path(root).resolve() for root in roots if root]


def is_local(path: Path, roots: list[Path] | None = None) -> bool:
    """Whether the module file ``path`` is the user's own (outside every :func:`_outside_roots` folder)."""
    resolved = path.resolve()
    return not any(resolved.is_relative_to(root) for root in (roots if roots is not None else _outside_roots()))


def _module_file(name: str) -> Path | None:
    module = sys.modules.get(name)
    source = getattr(module, "__file__", None) if module is not None else None
    parent = name.rpartition(".")[0]
    if module is None and (not parent or parent in sys.modules):  # finding it imports nothing new
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError, AttributeError):
            spec = None
        source = spec.origin if spec is not None and spec.has_location else None
    return Path(source) if source and Path(source).is_file() else None


def _imports(path: Path, name: str) -> list[str]:
    """The module names the file ``path`` (module ``name``) imports, with each dotted name's parents (importing
    ``a.b`` runs ``a`` first) and each ``from M import x`` also as ``M.x`` (a submodule, or a name in ``M``)."""
    try:
        tree = ast.parse(path.read_bytes(), str(path))
    except (OSError, SyntaxError, ValueError):
        return []
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            try:
                base = importlib.util.resolve_name("." * node.level + (node.module or ""), package) \
                    if node.level else (node.module or "")
            except (ImportError, ValueError):
                continue
            found += [base, *(f"{base}.{alias.name}" for alias in node.names if alias.name != "*")]
    return [".".join(parts[:i]) for parts in (n.split(".") for n in found if n) for i in range(1, len(parts) + 1)]


def local_sources(module: ModuleType) -> dict[str, Path]:
    """Module name -> file of ``module`` (when local) and of every local module it imports, transitively."""
    roots = _outside_roots()
    found: dict[str, Path] = {}
    stack = [module.__name__]
    while stack:
        name = stack.pop()
        if name in found:
            continue
        path = _module_file(name)
        if path is None or not is_local(path, roots):
            continue
        found[name] = path
        stack.extend(n for n in _imports(path, name) if n not in found)
    return found
