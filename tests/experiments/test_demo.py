"""``ictrl demo``: argument checks, the H1 trajectory reader, and a --quick run end to end."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import pytest

from ictrl.experiments import demo


def _args(tmp_path: Path, *extra: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    demo.add_arguments(parser)
    return parser.parse_args(["--output-dir", str(tmp_path / "out"), "--cache-dir", str(tmp_path / "cache"), *extra])


def test_defaults_and_bad_arguments(tmp_path: Path) -> None:
    args = _args(tmp_path)
    assert args.method == "ict" and args.seed == 0 and not args.quick and args.steps is None
    with pytest.raises(ValueError, match="--steps"):
        demo.run(_args(tmp_path, "--steps", "0"))
    with pytest.raises(ValueError, match="--learning-rate"):
        demo.run(_args(tmp_path, "--lr", "-1"))  # the old spelling is an alias
    with pytest.raises(ValueError, match="--threads"):
        demo.run(_args(tmp_path, "--threads", "0"))
    with pytest.raises(SystemExit):
        _args(tmp_path, "--method", "nonsense")
    assert not (tmp_path / "out").exists()  # argument errors surface before any work


def test_trajectory_reads_logged_h1_and_skips_steps_without_generation() -> None:
    history = [
        {"step": 1, "ictrl/h1/all": 0.5, "reward": 0.25, "ictrl/selected_frac": 1.0},
        {"step": 2, "loss": 0.1, "entropy": 0.7},  # second inner update: TRL's entropy is the loss forward's, no H1
        {"step": 3, "ictrl/h1/all": 0.4, "reward": 0.5},
        {"step": 3, "train_runtime": 1.0, "ictrl/h1/all": 9.9},
    ]
    rows = demo._trajectory(history)
    assert [r["step"] for r in rows] == [1, 3]
    assert [r["h1"] for r in rows] == [0.5, 0.4]
    assert rows[0]["selected_frac"] == 1.0 and math.isnan(rows[1]["selected_frac"])


@pytest.mark.integration
def test_quick_demo_end_to_end(tmp_path: Path) -> None:
    from ictrl.cli import main

    out, cache = tmp_path / "out", tmp_path / "cache"
    assert main(["demo", "--quick", "--output-dir", str(out), "--cache-dir", str(cache)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["method"] == "ict" and summary["quick"] is True
    for when in ("before", "after"):
        p1, p4 = summary[when]["pass@1"], summary[when]["pass@4"]
        assert 0.0 <= p1 <= p4 <= 1.0
    assert summary["improvement"]["pass@1"] == pytest.approx(summary["after"]["pass@1"] - summary["before"]["pass@1"])
    steps = summary["plan"]["steps"]
    trajectory = summary["entropy_trajectory"]
    # one generation per two optimizer steps (two inner updates), each logging H1
    assert [r["step"] for r in trajectory] == list(range(1, steps + 1, 2))
    assert all(math.isfinite(r["h1"]) and r["h1"] >= 0 for r in trajectory)
    assert Path(summary["base_model"]).parent == cache
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert max(r["step"] for r in rows) == steps
    assert not [p for p in out.iterdir() if p.name.endswith(".tmp")]
