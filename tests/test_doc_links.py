"""Every relative link in README.md, docs/, bench/ and studies/ names a file in the repository (the reports under
docs/results are linked by name from several pages)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

LINKED_DOCS = [REPO / "README.md", *sorted(REPO.glob("docs/**/*.md")), *sorted(REPO.glob("bench/*.md")),
               *sorted(REPO.glob("studies/**/*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")


@pytest.mark.parametrize("doc", LINKED_DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_relative_links_point_to_files_that_exist(doc: Path) -> None:
    """A report or page a document links to (``[results](horizon-paths-2026-11-26.md)``) is in the repository."""
    targets = [t.split("#")[0] for t in LINK.findall(doc.read_text())
               if not re.match(r"[a-z][a-z0-9+.-]*:", t) and not t.startswith("#")]
    missing = [t for t in targets if not (doc.parent / t).exists()]
    assert not missing, f"{doc.relative_to(REPO)} links to {missing}, which do not exist"
