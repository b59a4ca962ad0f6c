"""Held-out pass@k during training on the embedded task: the eval/* curves of ``ictrl compare``."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from ictrl.experiments import compare
from ictrl.experiments.grid import runner as grid
from ictrl.experiments.grid import cli as gridcli
from ictrl.experiments.grid import tinyrun


@pytest.mark.integration
def test_compare_draws_the_held_out_curve(tmp_path: Path, quick_cache_dir: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ICTRL_CACHE_DIR", str(quick_cache_dir))
    out = tmp_path / "cmp"
    parser = argparse.ArgumentParser()
    compare.add_arguments(parser)
    args = parser.parse_args(["--quick", "--methods", "ict", "--seeds", "1", "--eval-every", "1",
                              "--output-dir", str(out)])
    assert compare.run(args) == 0
    records = [json.loads(line) for line in (out / "ict/seed0/metrics.jsonl").read_text().splitlines()]
    steps = gridcli.QUICK_RL["steps"]
    assert [r["step"] for r in records] == list(range(1, steps + 1))
    for r in records:  # every step evaluated, beside its training metrics
        assert 0.0 <= r["eval/avg/pass@1"] <= r["eval/avg/pass@4"] <= 1.0 and "reward" in r
    png = out / "curve_held_out_pass_1_evaluated_during_training.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    done = json.loads((out / "ict/seed0" / grid.DONE_FILE).read_text())
    # the last in-training evaluation uses the end-of-run settings and seed on the first curve_problems problems;
    # with the quick task's 8 held-out problems (< curve_problems) it is the end-of-run evaluation itself
    assert gridcli.QUICK_RL["eval_problems"] <= tinyrun.TinyRL().curve_problems
    assert records[-1]["eval/avg/pass@1"] == pytest.approx(done["p1"], abs=1e-12)
