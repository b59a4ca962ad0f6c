"""Code lines that check values: every ``raise`` and ``assert`` statement, the condition of an ``if`` whose body
(or ``else``) raises, the ``except`` line of a handler that raises, and the whole of a check function (named
``check``/``check_*`` or ``validate``/``validate_*``, either with a leading underscore, or ``__post_init__``; not
``checkpoint_*``, ``checked_*`` or ``checking``). Lines are ``scripts/count_src_lines.py``'s code lines (no comments,
docstrings or blanks), each counted once.

    python scripts/count_checks.py [SRC_DIR]     # default: src/ictrl; prints a total per folder and the share
"""

from __future__ import annotations

import ast
import io
import re
import sys
import tokenize
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from count_src_lines import SKIP, docstring_lines  # noqa: E402

CHECK_FUNCTION = re.compile(r"^_?(check|validate)(_|$)|^__post_init__$")


def _code(text: str) -> set[int]:
    docs = docstring_lines(ast.parse(text))
    lines: set[int] = set()
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type not in SKIP:
            lines.update(n for n in range(tok.start[0], tok.end[0] + 1) if n not in docs)
    return lines


def _span(node: ast.AST) -> range:
    return range(node.lineno, node.end_lineno + 1)  # type: ignore[attr-defined, operator]


def check_lines(text: str) -> tuple[set[int], set[int]]:
    """(the check lines, the code lines) of one file."""
    code = _code(text)
    checks: set[int] = set()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and CHECK_FUNCTION.match(node.name):
            checks.update(_span(node))
        elif isinstance(node, (ast.Raise, ast.Assert)):
            checks.update(_span(node))
        elif isinstance(node, ast.If) and any(isinstance(s, ast.Raise) for s in node.body + node.orelse):
            checks.update(_span(node.test))
        elif isinstance(node, ast.Try):  # the ``except`` line of a handler that raises
            for handler in node.handlers:
                if any(isinstance(s, ast.Raise) for s in handler.body):
                    checks.update(range(handler.lineno, (handler.type or handler).end_lineno + 1))  # type: ignore
    return checks & code, code


def main(argv: list[str]) -> int:
    root = Path(argv[0]) if argv else Path("src/ictrl")
    per: Counter[str] = Counter()
    total = 0
    for path in sorted(root.rglob("*.py")):
        checks, code = check_lines(path.read_text(encoding="utf-8"))
        rel = path.relative_to(root)
        per[rel.parts[0] if len(rel.parts) > 1 else "(top)"] += len(checks)
        total += len(code)
    for folder, n in sorted(per.items()):
        print(f"{root}/{folder}: {n}")
    checked = sum(per.values())
    print(f"{root}: {checked} check lines of {total} code lines ({100 * checked / total:.0f}%)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
