"""The ictrl modules ``from ictrl import ICTGRPOConfig, ICTGRPOTrainer`` can reach: a static walk of every import
statement, those inside functions included (a lazy import runs when its function does), from ``ictrl``,
``ictrl.engine.config`` and ``ictrl.engine.trainer``. Prints the files reached, their code lines
(``scripts/count_src_lines.py``'s count) and the top-level modules among them.

    python scripts/import_closure.py [SRC]     # default: src (the folder holding ictrl/)
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from count_src_lines import code_lines  # noqa: E402

ROOTS = ("ictrl", "ictrl.engine.config", "ictrl.engine.trainer")


def modules(src: Path) -> dict[str, Path]:
    out = {}
    for path in sorted((src / "ictrl").rglob("*.py")):
        parts = [p for p in path.relative_to(src).with_suffix("").parts if p != "__init__"]
        out[".".join(parts)] = path
    return out


def imported(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The ictrl modules one file's import statements name, with the packages a dotted import runs on the way."""
    found: set[str] = set()
    package = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            bases = [a.name for a in node.names]
            subs: list[str] = []
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = name.split(".")[: len(name.split(".")) - node.level + (1 if package else 0)]
                base = ".".join(parts + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            bases, subs = [base], [f"{base}.{a.name}" for a in node.names]
        else:
            continue
        for full in bases + subs:
            parts = full.split(".")
            found.update(".".join(parts[:i]) for i in range(1, len(parts) + 1) if ".".join(parts[:i]) in known)
    return found - {name}


def closure(src: Path) -> list[str]:
    known = modules(src)
    seen: set[str] = set()
    todo = [r for r in ROOTS if r in known]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        todo += sorted(imported(name, known[name], known) - seen)
    return sorted(seen)


def main(argv: list[str]) -> int:
    src = Path(argv[0]) if argv else Path("src")
    known = modules(src)
    reached = closure(src)
    for name in reached:
        print(f"{code_lines(known[name]):6d}  {name}")
    tops = sorted({n.split(".")[1] for n in reached if n.count(".")} - {"core", "engine"})
    print(f"{len(reached)} files, {sum(code_lines(known[n]) for n in reached)} code lines; "
          f"top-level besides core and engine: {', '.join(tops)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
