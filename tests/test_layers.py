"""The package's layers import only downward (README, "Shape of the code"): a violation fails here."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "ictrl"

# Lower number = lower layer. A module may import ictrl modules of its own layer or below.
LAYERS: dict[str, int] = {
    "files": 0, "checks": 0, "errors": 0, "stats": 0, "kernels": 0, "selection": 0, "loss": 0, "metrics": 0,
    "logprobs": 0,
    "rewards": 1, "data": 1, "models": 1, "eval": 1, "preflight": 1,
    "engine": 2,
    "experiments": 3,
    "cli": 4, "__main__": 4,
}
CORE_THIRD_PARTY = {"torch", "math", "dataclasses", "typing", "collections", "__future__", "hashlib", "inspect",
                    "difflib", "importlib",
                    "json", "os", "uuid", "pathlib",
                    "logging", "triton"}  # triton: only ictrl.kernels.group_js_triton, imported when triton is


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
