"""bench/bench_train_step.py's forward counts per statistics path, recounted on the tiny model against the table
in docs/architecture.md ("Which statistics path a run takes, measured")."""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))

import bench_train_step as bts  # noqa: E402

TABLE = "### Which statistics path a run takes, measured"


def _stated(path: str, config: str) -> tuple[float, float]:
    """The table's ``config: planned / separate`` forwards in the row of ``path``."""
    doc = (REPO / "docs" / "architecture.md").read_text(encoding="utf-8")
    section = doc[doc.index(TABLE):].split("\n### ", 1)[0]
    (row,) = [line for line in section.splitlines() if line.startswith(f"| `{path}` |")]
    found = re.search(rf"\| {re.escape(config)}: ([\d.]+) / ([\d.]+)", row)
    assert found, f"{path}: no '{config}: N / M' in {row}"
    return float(found.group(1)), float(found.group(2))


def _args() -> argparse.Namespace:
    return argparse.Namespace(hidden=64, layers=2, batch=8, generations=4, completion_len=32, generation="fixed",
                              vocab=259, steps=2)


@pytest.mark.parametrize(("path", "stated_as", "config"), [
    ("Separate", "grid", "grid"),
    ("TrainingForward", "defaults", "defaults"),
    ("Separate", "defaults with num_iterations 2", "defaults, num_iterations 2"),
])
def test_forwards_per_step_are_the_tables(path: str, stated_as: str, config: str) -> None:
    (counted,) = bts.path_counts(_args(), [c for c in bts.PATH_CONFIGS if c[0] == config]).values()
    assert counted["planned"]["path"] == path
    got = (counted["planned"]["forwards_per_step"], counted["separate"]["forwards_per_step"])
    assert got == _stated(path, stated_as)
