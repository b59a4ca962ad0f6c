"""``ictrl selectors``: the rules a run can name, with what each reads, its options and defaults, what a rule of
one's own can read, and a user's rule loaded from its file with the hash a run records."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import pytest

from ictrl import cli
from ictrl.core.selection import NEEDS_FIELDS, SELECTORS

RULE = '''
from ictrl.core.selection import register_selector, top_fraction


@register_selector("listed_h2", needs=("renyi2",))
def listed_h2(inputs, *, ratio=0.2, count: int = 3):
    """The top ratio by H2."""
    return top_fraction(inputs.renyi2, inputs, ratio)
'''


def test_selectors_lists_every_rule_and_what_a_rule_can_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "rules.py").write_text(RULE)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))  # a rule file's folder: this test's only
    try:
        assert cli.main(["selectors", "rules.py:listed_h2"]) == 0
        text = capsys.readouterr().out
        assert cli.main(["selectors", "--json", "rules.py:listed_h2"]) == 0
        listed = json.loads(capsys.readouterr().out)
    finally:
        for name in [m for m in sys.modules if m.startswith("ictrl_rules_")]:
            sys.modules.pop(name)
    names = [row["name"] for row in listed["selectors"]]
    assert names[:len(SELECTORS) - 1] == [n for n in SELECTORS if n != "listed_h2"] and names.count("listed_h2") == 1
    ict = next(row for row in listed["selectors"] if row["name"] == "ict")
    assert ict["needs"] == ["ict_score"] and ict["warmup_steps"] == 10 and ict["file"] is None
    mine = next(row for row in listed["selectors"] if row["name"] == "listed_h2")
    assert mine["options"] == {"ratio": 0.2, "count": 3} and mine["needs"] == ["renyi2"]
    assert mine["sha256"] == hashlib.sha256(RULE.encode()).hexdigest()
    assert list(listed["fields"]) == list(NEEDS_FIELDS)
    assert "  listed_h2: The top ratio by H2.\n      reads renyi2; options ratio=0.2, count=3; warm-up 0" in text
    assert all(f"\n  {name}: " in text for name in NEEDS_FIELDS) and "inputs.generator" in text


def test_a_rule_that_cannot_load_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))  # a rule file's folder: this test's only
    assert cli.main(["selectors", "missing.py:rule"]) == 2
    err = capsys.readouterr().err
    assert err.strip() == f"ictrl selectors: error: selector 'missing.py:rule': no file missing.py (from {tmp_path})"
