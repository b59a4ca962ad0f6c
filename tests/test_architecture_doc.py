"""docs/architecture.md's figures and claims that the code can contradict, checked against the code."""

from __future__ import annotations

import ast
import importlib.util
import re
import shutil
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "architecture.md"


def _closure_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("import_closure", ROOT / "scripts" / "import_closure.py")
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def test_the_library_closure_figures_are_what_the_script_computes() -> None:
    """The files and code lines ``from ictrl import ICTGRPOConfig, ICTGRPOTrainer`` can reach, as stated, are the
    script's count of today's source; ``python scripts/import_closure.py --update-doc`` rewrites them."""
    script = _closure_script()
    stated = script.doc_figures(DOC.read_text(encoding="utf-8"))
    assert stated == script.figures(ROOT / "src"), "run: python scripts/import_closure.py --update-doc"


def test_update_doc_writes_the_figures_it_computes(tmp_path: Path) -> None:
    script = _closure_script()
    doc = tmp_path / "architecture.md"
    shutil.copy(DOC, doc)
    doc.write_text(script.DOC_FIGURES.sub("is 1 files, 2 code lines", doc.read_text(encoding="utf-8")))
    files, lines = script.update_doc(doc, ROOT / "src")
    assert script.doc_figures(doc.read_text(encoding="utf-8")) == (files, lines) and files > 10 and lines > 1000
    assert f"is {files} files, {lines:,} code lines" in doc.read_text(encoding="utf-8")


def test_a_decorator_in_the_docs_code_decorates_a_function_or_class() -> None:
    """A signature block is not always runnable Python (a ``def`` without a body), but each decorator line in one
    sits above a ``def``, a ``class`` or another decorator."""
    bad = []
    for path in sorted((ROOT / "docs").glob("*.md")):
        for block in re.findall(r"```python[^\n]*\n(.*?)```", path.read_text(encoding="utf-8"), re.S):
            lines = [line for line in block.splitlines() if line.strip()]
            for line, after in zip(lines, lines[1:] + [""]):
                if line.startswith("@") and not after.lstrip().startswith(("@", "def ", "class ", "async def ")):
                    bad.append(f"{path.name}: {line} above {after!r}")
    assert bad == []


def _trainer_attributes(module: str, cls: str) -> set[str]:
    """The attributes of the trainer that ``cls`` (a part holding it as ``self.trainer``) uses."""
    tree = ast.parse((ROOT / "src" / "ictrl" / "engine" / f"{module}.py").read_text(encoding="utf-8"))
    node = next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == cls)
    used = set()
    for n in ast.walk(node):
        if isinstance(n, ast.Attribute):
            held = n.value
            if isinstance(held, ast.Name) and held.id == "trainer" or isinstance(held, ast.Attribute) and \
                    held.attr == "trainer" and isinstance(held.value, ast.Name) and held.value.id == "self":
                used.add(n.attr)
    return used


def test_the_parts_that_hold_the_trainer_use_what_the_doc_says() -> None:
    text = " ".join(DOC.read_text(encoding="utf-8").split())
    for module, cls in (("dynamic_sampling", "DynamicSampling"), ("resumable", "Resumable")):
        listed = re.search(rf"`{cls}` \(`\w+`\) uses ((?:`\w+`,? )+)", text)
        assert listed, cls
        assert set(re.findall(r"`(\w+)`", listed.group(1))) == _trainer_attributes(module, cls), cls
