"""bench/bench_gpu.py: the statistics of its rounds (pure functions, on CPU) and its CPU smoke run end to end."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))

import bench_gpu as bg  # noqa: E402


def _run(times: list[float], warmup: int = 2) -> dict:
    return {"step_times": times, "warmup": warmup, "step_s": 0.0}


def test_warm_up_steps_are_measured_then_dropped_not_just_the_first() -> None:
    # TRL's steps on an H100: a slow first and second step would set a median of the last 3.
    times = [5.47, 1.74, 0.29, 0.35, 0.30, 0.31]
    assert bg.kept(times, 2) == [0.29, 0.35, 0.30, 0.31]
    assert bg.kept(times, 0) == times
    assert bg.kept([1.0, 2.0], 5) == [2.0]  # fewer steps than the warm-up: the last one stands
    summary = bg.variant_summary([_run(times), _run([4.0, 1.5, 0.31, 0.33, 0.29, 0.30])])
    assert summary["step_s"] == pytest.approx(0.305)  # median of the 8 kept steps
    assert summary["round_medians"] == [pytest.approx(0.305), pytest.approx(0.305)]
    assert summary["steps"]["min"] == 0.29 and summary["steps"]["max"] == 0.35 and summary["steps"]["n"] == 8


def test_spread_is_median_range_and_relative_half_range() -> None:
    s = bg.spread([1.0, 1.2, 0.8])
    assert s == {"median": 1.0, "min": 0.8, "max": 1.2, "rel_halfrange": pytest.approx(0.2), "n": 3}


def test_ratios_pair_rounds_and_report_their_spread() -> None:
    x = [_run([9, 9, 1.10, 1.10, 1.10]), _run([9, 9, 1.30, 1.30, 1.30]), _run([9, 9, 1.0, 1.0, 1.0])]
    y = [_run([9, 9, 1.0, 1.0, 1.0]), _run([9, 9, 1.0, 1.0, 1.0]), _run([9, 9, 1.0, 1.0, 1.0])]
    r = bg.ratio_summary(x, y)
    assert r is not None
    assert r["median"] == pytest.approx(1.10) and r["min"] == pytest.approx(1.0) and r["max"] == pytest.approx(1.30)
    assert r["n"] == 3
    # A round where one side ran out of memory drops out of the pairing; none left: None.
    assert bg.ratio_summary([{"error": "out of memory"}], y[:1]) is None
    assert bg.ratio_summary([x[0], {"error": "oom"}], y[:2])["n"] == 1
    assert bg.variant_summary([{"error": "out of memory: 1 GiB"}]) == {"error": "out of memory: 1 GiB"}


def test_peak_is_the_largest_over_rounds_and_the_table_shows_spreads() -> None:
    rounds = {v: [_run([3, 2, 1.0, 1.1]) | {"peak_gib": 5.0 + i}, _run([3, 2, 1.05, 1.0]) | {"peak_gib": 5.5 + i}]
              for i, v in enumerate(bg.VARIANTS)}
    runs = {"rounds": rounds, "summary": {v: bg.variant_summary(rs) for v, rs in rounds.items()},
            "ratios": {f"{x} / {y}": bg.ratio_summary(rounds[x], rounds[y]) for x, y in bg.RATIOS}}
    assert runs["summary"]["ict"]["peak_gib"] == 7.5
    md = bg.markdown({"device_name": "cpu", "torch": "x", "settings": "s", "shapes": {"tiny": runs}})
    row = next(line for line in md.splitlines() if line.startswith("| tiny |"))
    assert "+-" in row and "(" in row and "-" in row  # each step time with its spread, each ratio with its range
    assert "| 6.50 | 7.50 | 1.154 |" in row  # peaks of all and ict, and their ratio


def test_defaults_are_two_rounds_of_six_steps_with_two_dropped() -> None:
    a = bg.parser().parse_args([])
    assert (a.rounds, a.steps, a.warmup) == (2, 6, 2)


@pytest.mark.integration
def test_bench_gpu_tiny_cpu_smoke(tmp_path: Path) -> None:
    out = tmp_path / "gpu.json"
    path = f"{REPO / 'src'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=path)
    res = subprocess.run([sys.executable, str(REPO / "bench" / "bench_gpu.py"), "--tiny", "--device", "cpu",
                          "--steps", "2", "--out", str(out)], capture_output=True, text=True, env=env, timeout=900)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    data = json.loads(out.read_text())
    runs = data["shapes"]["tiny"]
    for variant in ("trl", "all", "ict", "ict+sparse"):
        assert [len(r["step_times"]) for r in runs["rounds"][variant]] == [2, 2], variant  # 2 rounds of 2 steps
        assert all(r["warmup"] == 1 for r in runs["rounds"][variant])
        assert runs["summary"][variant]["step_s"] > 0 and runs["summary"][variant]["steps"]["n"] == 2
    assert runs["ratios"]["ict / all"]["n"] == 2
    assert runs["sweep"]["rows"] == 8 * 16 and runs["sweep"]["seconds"] > 0 and runs["sweep"]["log_softmax_s"] > 0
    assert any(r.get("top_kernels") for r in runs["rounds"]["ict"])
    md = out.with_suffix(".md").read_text()
    assert "| tiny |" in md and "ict / all" in md and "log_softmax" in md
    assert not list(tmp_path.glob("*.tmp*"))  # written atomically: no temporary left behind
