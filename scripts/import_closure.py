"""The ictrl modules ``from ictrl import ICTGRPOConfig, ICTGRPOTrainer`` can reach: a static walk of every import
statement, those inside functions included (a lazy import runs when its function does), from ``ictrl``,
``ictrl.engine.config`` and ``ictrl.engine.trainer``. Prints the files reached, their code lines
(``scripts/count_src_lines.py``'s count) and the top-level modules among them. ``--update-doc`` writes the two
figures into docs/architecture.md, whose test (tests/test_architecture_doc.py) recomputes them.

    python scripts/import_closure.py [SRC]     # default: src (the folder holding ictrl/)
    python scripts/import_closure.py --update-doc
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from count_src_lines import code_lines  # noqa: E402

ROOTS = ("ictrl", "ictrl.engine.config", "ictrl.engine.trainer")
DOC = Path(__file__).resolve().parents[1] / "docs" / "architecture.md"
# How docs/architecture.md states the figures: "is 35 files, 4,815 code lines".
DOC_FIGURES = re.compile(r"is (\d+) files, ([\d,]+) code lines")


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


def figures(src: Path) -> tuple[int, int]:
    """(files, code lines) of the closure."""
    known = modules(src)
    reached = closure(src)
    return len(reached), sum(code_lines(known[n]) for n in reached)


def doc_figures(text: str) -> tuple[int, int]:
    """(files, code lines) as docs/architecture.md states them."""
    found = DOC_FIGURES.findall(text)
    if len(found) != 1:
        raise ValueError(f"{DOC}: expected one 'is N files, M code lines', found {len(found)}")
    return int(found[0][0]), int(found[0][1].replace(",", ""))


def update_doc(doc: Path, src: Path) -> tuple[int, int]:
    """Write the closure's figures into ``doc``; returns them."""
    doc_figures(doc.read_text(encoding="utf-8"))  # exactly one place to write
    files, lines = figures(src)
    doc.write_text(DOC_FIGURES.sub(f"is {files} files, {lines:,} code lines", doc.read_text(encoding="utf-8")),
                   encoding="utf-8")
    return files, lines


def main(argv: list[str]) -> int:
    if argv == ["--update-doc"]:
        files, lines = update_doc(DOC, DOC.parents[1] / "src")
        print(f"{DOC}: {files} files, {lines:,} code lines")
        return 0
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
