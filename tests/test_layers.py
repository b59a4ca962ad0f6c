"""The package's layers import only downward (docs/architecture.md): a violation fails here."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "ictrl"
STUDIES = ROOT / "studies"

# Lower number = lower layer. A module may import ictrl modules of its own layer or below.
LAYERS: dict[str, int] = {
    "files": 0, "checkpoints": 0, "errors": 0, "core": 0, "cliargs": 1, "dirlock": 1,
    "rewards": 1, "data": 1, "hub": 1, "yamlfile": 1, "models": 1, "eval": 1, "option_checks": 1, "vllm_env": 1,
    "library_noise": 1,  # the libraries' log and warning filters a command installs (cli.quiet)
    "validation": 1,  # the one declarative check of a dataclass's fields (pydantic): above the pure core
    "engine": 2,  # the library: ICTGRPOConfig, ICTGRPOTrainer and the parts composed into it
    "train_cli": 3,  # the `ictrl train` command: it imports the library, the library nothing from it
    "experiments": 4,
    "cli": 5, "__main__": 5, "process_exit": 5,  # the entry's exit: it leaves train_cli's process group
}
CORE_THIRD_PARTY = {"torch", "math", "dataclasses", "typing", "collections", "__future__", "hashlib", "inspect",
                    "difflib", "importlib", "fractions", "sys", "shlex",
                    "json", "os", "uuid", "pathlib", "re", "shutil", "errno", "contextlib", "signal", "threading",
                    "logging", "tempfile", "contextvars",
                    "triton"}  # triton: only ictrl.core.kernels.group_js_triton, imported when triton is


def _layer_of(module: str) -> int:
    return LAYERS[module.split(".")[1]] if module.count(".") else 0


def _imports(path: Path) -> list[str]:
    names = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.append(node.module)
    return names


def _modules() -> list[tuple[str, Path]]:
    out = []
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).with_suffix("")
        parts = [p for p in rel.parts if p != "__init__"]
        if parts:
            out.append(("ictrl." + ".".join(parts), path))
    return out


def test_every_top_level_module_has_a_layer() -> None:
    tops = {name.split(".")[1] for name, _ in _modules()}
    assert tops <= set(LAYERS), sorted(tops - set(LAYERS))


def test_imports_go_only_downward() -> None:
    bad = []
    for name, path in _modules():
        own = _layer_of(name)
        for imported in _imports(path):
            if imported == "ictrl" or not imported.startswith("ictrl."):
                continue
            if _layer_of(imported) > own:
                bad.append(f"{name} (layer {own}) imports {imported} (layer {_layer_of(imported)})")
    assert not bad, "\n".join(bad)


def test_the_package_never_imports_the_studies() -> None:
    """studies/ is the project's own code on top of ictrl (not installed): it may import ictrl, never the reverse."""
    bad = [f"{name} imports {imported}" for name, path in _modules() for imported in _imports(path)
           if imported.split(".")[0] == "studies"]
    assert not bad, "\n".join(bad)
    uses = {imported.split(".")[0] for path in STUDIES.rglob("*.py") for imported in _imports(path)}
    assert {"ictrl", "studies"} <= uses  # the check reads real study modules


def test_the_library_imports_nothing_of_a_command() -> None:
    """``ictrl.engine`` (what ``from ictrl.engine import ICTGRPOTrainer`` gives) reaches no command-side module: not
    ``ictrl train``'s (a higher layer, checked above) and not the commands' shared option checks either."""
    bad = [f"{name} imports {imported}" for name, path in _modules() if name.startswith("ictrl.engine")
           for imported in _imports(path)
           if imported.split(".")[:2] in (["ictrl", "option_checks"], ["ictrl", "train_cli"])]
    assert not bad, "\n".join(bad)


# The top-level modules the library (ICTGRPOConfig, ICTGRPOTrainer) may reach besides ictrl.core and ictrl.engine.
LIBRARY_TOP = frozenset({"errors", "files", "checkpoints", "hub", "vllm_env", "validation"})
LIBRARY_ROOTS = ("ictrl", "ictrl.engine.config", "ictrl.engine.trainer")


def outside_the_library(modules: list[str] | set[str]) -> list[str]:
    """The ictrl modules of ``modules`` that are not the library's: not ``ictrl`` itself, not under ``core`` or
    ``engine``, not one of :data:`LIBRARY_TOP`."""
    return sorted(m for m in modules if m != "ictrl" and m.split(".")[1] not in {"core", "engine", *LIBRARY_TOP})


def test_the_library_reaches_only_the_library() -> None:
    """Every ictrl module ``from ictrl import ICTGRPOConfig, ICTGRPOTrainer`` can reach, through any import
    statement (inside functions too) and the packages a dotted import runs, is the library's: never the grader and
    its sandbox (``rewards``), the benchmark registry (``data``), ``eval``, ``experiments`` or a command.
    tests/engine/test_import_closure.py checks what a training step really loads."""
    graph = _import_graph()
    seen: set[str] = set()
    todo = list(LIBRARY_ROOTS)
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            parents = {".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 1)}
            todo += sorted((graph.get(name, set()) | parents) - seen)
    assert outside_the_library(seen) == []
    assert {"ictrl.engine.reward_policy", "ictrl.core.loss", "ictrl.errors"} <= seen  # the walk walks


def test_core_is_pure_torch() -> None:
    """The core carries no trainer state: it imports only torch, the standard library and the core itself."""
    bad = []
    for name, path in _modules():
        if _layer_of(name) != 0:
            continue
        for imported in _imports(path):
            root = imported.split(".")[0]
            if root not in CORE_THIRD_PARTY and not imported.startswith("ictrl."):
                bad.append(f"{name} imports {imported}")
    assert not bad, "\n".join(bad)


def _resolve(node: ast.ImportFrom | ast.Import, module: str, is_package: bool, known: set[str]) -> list[str]:
    """The ictrl modules an import statement names (``from ictrl.x import y`` is module ictrl.x.y when that is a
    module, else ictrl.x)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names if a.name in known]
    if node.level:
        parts = module.split(".")[: len(module.split(".")) - node.level + (1 if is_package else 0)]
        base = ".".join(parts + ([node.module] if node.module else []))
    else:
        base = node.module or ""
    subs = [f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in known]
    rest = [a for a in node.names if f"{base}.{a.name}" not in known]
    return subs + ([base] if rest and base in known else [])


def _import_graph() -> dict[str, set[str]]:
    modules = _modules()
    known = {name for name, _ in modules}
    graph: dict[str, set[str]] = {}
    for name, path in modules:
        package = path.name == "__init__.py"
        edges: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                edges.update(_resolve(node, name, package, known))
        graph[name] = edges - {name}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle per strongly connected component with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out




def test_no_import_cycles() -> None:
    """No two ictrl modules import each other, directly or through others, counting imports inside functions and
    under TYPE_CHECKING too (a lazy import hides a cycle, it does not remove it). A package's ``__init__`` may
    import its own modules; a module importing its package back is a cycle."""
    assert _cycles(_import_graph()) == []
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]  # the check checks


# Modules ("ictrl.x") or functions ("ictrl.x.f") allowed over the limits; keep it empty.
SIZE_ALLOWED: set[str] = set()
MAX_MODULE_LINES, MAX_FUNCTION_LINES, MAX_LINE_CHARS = 500, 60, 120


def test_modules_and_functions_are_short() -> None:
    bad = []
    for name, path in _modules():
        text = path.read_text(encoding="utf-8")
        if len(text.splitlines()) > MAX_MODULE_LINES and name not in SIZE_ALLOWED:
            bad.append(f"{name}: {len(text.splitlines())} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1  # type: ignore[operator]
                key = f"{name}.{node.name}"
                if length > MAX_FUNCTION_LINES and key not in SIZE_ALLOWED:
                    bad.append(f"{key}: {length} lines")
    assert not bad, "\n".join(bad)


def test_lines_are_short() -> None:
    """No line of the package (``ictrl/__init__.py`` included) is longer than MAX_LINE_CHARS characters: code,
    comments and docstrings alike."""
    bad = [f"{path.relative_to(ROOT)}:{i}: {len(line)} characters" for path in sorted(SRC.rglob("*.py"))
           for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1) if len(line) > MAX_LINE_CHARS]
    assert not bad, "\n".join(bad)


def test_every_name_imported_from_ictrl_or_studies_exists() -> None:
    """A name moved out of a module breaks its lazy importers (``from ictrl.x import y`` inside a function) only
    when that function runs, often in a slow test: every such import in src, studies, tests and bench resolves."""
    import importlib

    missing = []
    for root in ("src", "studies", "tests", "bench"):
        for path in sorted((ROOT / root).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if not (isinstance(node, ast.ImportFrom) and node.level == 0 and node.module
                        and node.module.split(".")[0] in ("ictrl", "studies")):
                    continue
                module = importlib.import_module(node.module)
                for alias in node.names:
                    if alias.name != "*" and not hasattr(module, alias.name):
                        try:
                            importlib.import_module(f"{node.module}.{alias.name}")
                        except ImportError:
                            missing.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.module}.{alias.name}")
    assert missing == []


# A command module's entry points (ictrl.cli imports each command's module by name): the same names by design.
COMMAND_PROTOCOL = {"add_arguments", "run"}
# Public names defined in two modules: none; a name here would be two things to a reader only by the import it came
# through.
SHARED_NAMES_ALLOWED: set[str] = set()


def test_a_public_name_is_defined_in_one_module() -> None:
    """A public function or class name means one thing: defined at the top level of one module of the package."""
    where: dict[str, list[str]] = {}
    for name, path in _modules():
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name[0] != "_":
                where.setdefault(node.name, []).append(name)
    shared = {n: m for n, m in where.items() if len(m) > 1 and n not in COMMAND_PROTOCOL | SHARED_NAMES_ALLOWED}
    assert shared == {}
    assert len(where["run"]) > 1  # the walk walks
