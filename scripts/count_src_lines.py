"""Lines of code under a source tree: every line of a ``.py`` file that holds a token other than a comment, a
docstring (a string expression statement: module, class and function docstrings) or a line break.

    python scripts/count_src_lines.py [DIR ...]      # default: src/ictrl; prints a total per DIR and per folder
"""

from __future__ import annotations

import ast
import io
import sys
import tokenize
from collections import Counter
from pathlib import Path

SKIP = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER,
        tokenize.ENCODING}


def docstring_lines(tree: ast.Module) -> set[int]:
    """Line numbers covered by string-expression statements (docstrings and bare strings)."""
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            lines.update(range(node.lineno, node.end_lineno + 1))  # type: ignore[operator]
    return lines


def code_lines(path: Path) -> int:
    text = path.read_text(encoding="utf-8")
    docs = docstring_lines(ast.parse(text))
    lines: set[int] = set()
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type in SKIP:
            continue
        lines.update(n for n in range(tok.start[0], tok.end[0] + 1) if n not in docs)
    return len(lines)


def main(argv: list[str]) -> int:
    for root in [Path(a) for a in argv] or [Path("src/ictrl")]:
        per: Counter[str] = Counter()
        for path in sorted(root.rglob("*.py")):
            rel = path.relative_to(root)
            per[rel.parts[0] if len(rel.parts) > 1 else "(top)"] += code_lines(path)
        for folder, n in sorted(per.items()):
            print(f"{root}/{folder}: {n}")
        print(f"{root}: {sum(per.values())} code lines")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
