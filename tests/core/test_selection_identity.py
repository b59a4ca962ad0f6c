"""A rule's identity (``selector_identity``): what names it in a run's record, so that an edited rule file is a
different rule and its resolved options are part of it."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

from ictrl.core.selection import get_selector, selector_identity


def test_a_builtin_is_named_by_its_name_and_options_alone() -> None:
    ident = selector_identity(get_selector("ict"), {"ratio": 0.2})
    assert ident == {"name": "ict", "spec": "ict", "file": None, "sha256": None,
                     "options": {"ratio": 0.2, "scope": "response"}}


def test_a_users_rule_carries_its_file_and_the_hash_that_changes_with_an_edit(h2rule: Path) -> None:
    ident = selector_identity(get_selector("h2rule:top_h2"), {})
    assert ident["name"] == "top_h2" and ident["spec"] == "h2rule:top_h2"
    assert ident["file"] == str((h2rule / "h2rule.py").resolve()) and ident["options"] == {"ratio": 0.1}
    assert len(ident["sha256"]) == 64
    # the same rule after an edit of its file: another hash (compare and --resume tell them apart by it)
    (h2rule / "h2rule.py").write_text((h2rule / "h2rule.py").read_text() + "\n# tuned\n")
    assert selector_identity(get_selector("h2rule:top_h2"), {})["sha256"] != ident["sha256"]
    sys.modules.pop("h2rule", None)
    importlib.invalidate_caches()
