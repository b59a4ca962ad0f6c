"""Every repository path that a doc or a docstring cites exists (docs that match the code)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md"), *ROOT.glob("*/README.md")])
TOP = ("src/", "docs/", "configs/", "tests/", "bench/", "scripts/")
# A path: starts at a top-level directory (or is a bare *.md name), ends in a file suffix or a slash.
PATH_RE = re.compile(r"(?<![\w./-])((?:\.\./|\./)?(?:[\w.-]+/)*[\w.-]+\.(?:py|md|yaml|yml|json|jsonl|toml|txt|html))\b")
PLACEHOLDER = re.compile(r"[{}*<>]|\bN\b|\.\.\.|X\.yaml|CONFIG|PATH|OUTPUT_DIR")


def _docstrings(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    nodes = [tree, *(n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)))]
    return [doc for n in nodes if (doc := ast.get_docstring(n))]


def _written_names() -> set[str]:
    """Bare ``*.md`` names the code writes (string constants in src/, e.g. "results.md"): outputs, not citations."""
    names = set()
    for path in (ROOT / "src").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and re.fullmatch(r"[\w.-]+\.md",
                                                                                            node.value):
                names.add(node.value)
    return names


WRITTEN = _written_names()


def _cited(text: str) -> list[str]:
    """Repository paths in ``text``: ``dir/…/file.ext`` under a top-level directory, ``../`` or ``./`` relative
    ones, and bare ``name.md`` doc citations (``method.md §3``). Not URLs, not templates (``{a,b}``, ``*``,
    ``CONFIG``), and not the name of a file the code writes (``results.md``)."""
    out = []
    for match in PATH_RE.finditer(text):
        token = match.group(1)
        word_start = max(text.rfind(c, 0, match.start()) for c in " \n\t(")
        if PLACEHOLDER.search(token) or "://" in text[word_start + 1: match.start()]:
            continue
        bare = "/" not in token and token.endswith(".md")
        if bare and token in WRITTEN:
            continue
        if token.startswith(TOP) or token.startswith(("../", "./")) or bare:
            out.append(token)
    return out


def _ignored(path: Path) -> bool:
    """Outputs (git-ignored, such as bench/results/) are written by the code, not cited."""
    import subprocess

    return subprocess.run(["git", "-C", str(ROOT), "check-ignore", "-q", str(path)], check=False).returncode == 0


def _exists(token: str, base: Path) -> bool:
    if _ignored(ROOT / token):
        return True
    candidates = [ROOT / token, base / token]
    if "/" not in token:  # a bare doc name: beside the citing file, at the root or in docs/
        candidates += [ROOT / "docs" / token]
    return any(c.exists() for c in candidates)


def test_docs_cite_existing_paths() -> None:
    missing = [f"{doc.relative_to(ROOT)}: {token}" for doc in DOCS for token in _cited(doc.read_text(encoding="utf-8"))
               if not _exists(token, doc.parent)]
    assert not missing, "\n".join(missing)


def test_docstrings_cite_existing_paths() -> None:
    missing = []
    for path in sorted((ROOT / "src").rglob("*.py")):
        for doc in _docstrings(path):
            missing += [f"{path.relative_to(ROOT)}: {t}" for t in _cited(doc) if not _exists(t, ROOT)]
    assert not missing, "\n".join(missing)


def test_the_check_finds_a_missing_path() -> None:
    assert _cited("see method.md §3 and src/ictrl/nope.py, not https://x.org/a.md or results.md") == [
        "method.md", "src/ictrl/nope.py"]
    assert "results.md" in WRITTEN
    assert not _exists("environment.md", ROOT) and _exists("method.md", ROOT)


def test_architecture_states_the_stats_chunk_budget() -> None:
    from ictrl.core import stats

    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    mib = stats._CHUNK_BYTES // 2**20
    assert f"{mib} MiB float32" in text and f"({stats._CHUNK_BYTES // (4 * 151_936)} rows at V = 151,936)" in text
