"""python -m studies sweep: labels, stable fractions, widest ranges and the report from synthetic runs; end to end
(--quick)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from studies import sweep
from ictrl.experiments.grid import runner as grid
from ictrl.experiments.grid import tinyrun
from studies.reports.outcomes import OutcomeThresholds
from ictrl.experiments.reports.report import PNG_MAGIC

LRS = [1e-4, 5e-4, 2e-3]


def synthetic_records(kind: str, steps: int = 24) -> list[dict]:
    """Curves that the default (v2) thresholds label unambiguously (base reward 0.2); v1 calls "degraded" stable."""
    recs = []
    for t in range(steps):
        f = t / (steps - 1)
        h, r = {"stable": (0.3 - 0.1 * f, 0.2 + 0.1 * f),
                "exploded": (0.3 + 1.5 * f, 0.2 - 0.2 * f),
                "collapsed": (0.3 if t < 5 else 0.01, 0.2),
                "degraded": (0.3, 0.2 - 0.2 * f)}[kind]
        recs.append({"step": t + 1, "reward": r, "ictrl/h1/all": h, "ictrl/h2/all": 0.8 * h,
                     "ictrl/purity/all": 1 - h / 2, "ictrl/prob/selected": 0.2, "ictrl/purity/selected": 0.3,
                     "ictrl/warmup": float(t < 3)})
    return recs


def planned_kind(spec: grid.RunSpec) -> str:
    """grpo explodes above 1e-4 (one seed collapses at 1e-4); ict is stable except at 2e-3 (seed 0 degrades, seed 1
    explodes)."""
    if spec.method == "grpo":
        if spec.lr == 1e-4:
            return "collapsed" if spec.seed == 1 else "stable"
        return "exploded"
    if spec.lr == 2e-3:
        return "exploded" if spec.seed == 1 else "degraded"
    return "stable"


def fake_runner(spec: grid.RunSpec, run_dir: Path) -> dict:
    recs = synthetic_records(planned_kind(spec))
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    return {"p1": 0.3 if planned_kind(spec) == "stable" else 0.05, "p4": 0.5, "final_reward": recs[-1]["reward"]}


def test_report_from_synthetic_runs(tmp_path: Path) -> None:
    methods = ["grpo", "ict"]
    specs = grid.grid_specs(methods, 2, LRS)
    results = grid.run_grid(specs, tmp_path, fake_runner, log=lambda _: None)
    thresholds = OutcomeThresholds()
    page = sweep.write_report(tmp_path, methods, LRS, specs, results, {"p1": 0.2, "p4": 0.4}, thresholds,
                              {"source": "test"}, 1.0)
    saved = json.loads((tmp_path / "sweep.json").read_text())
    assert saved["thresholds"] == {**thresholds.__dict__}
    assert saved["base_reward"] == 0.2
    for row in saved["runs"]:
        spec = grid.RunSpec(row["method"], row["seed"], row["lr"])
        assert row["label"] == planned_kind(spec), spec
    # Stable fractions and widest ranges against a hand count of the plan.
    for m in methods:
        for lr in LRS:
            kinds = [planned_kind(grid.RunSpec(m, s, lr)) for s in range(2)]
            assert saved["stability"][m]["stable_fraction"][f"{lr:g}"] == kinds.count("stable") / 2
    assert saved["stability"]["grpo"]["widest_stable_range"] is None  # 1e-4 has a collapsed seed
    assert saved["stability"]["ict"]["widest_stable_range"] == [1e-4, 5e-4]
    assert {k: v["method"] for k, v in saved["examples"].items() if v} == {"collapsed": "grpo", "exploded": "grpo",
                                                                          "degraded": "ict", "stable": "grpo"}
    assert saved["examples"]["unrewarded"] is None  # every synthetic run earned some reward
    md = (tmp_path / "stability.md").read_text()
    assert "| grpo | 1/2 stable (1 C) | 0/2 stable (2 E) | 0/2 stable (2 E) | none |" in md
    assert "| ict | 2/2 stable | 2/2 stable | 0/2 stable (1 E, 1 D) | 0.0001 – 0.0005 |" in md
    assert "| ict | 30.0 / 50.0 | 30.0 / 50.0 | 5.0 / 50.0 |" in md
    assert md.startswith("Labels: outcome thresholds v2")
    html = page.read_text()
    # heat map + 4 example curves (one per H1 / H2 / purity / reward, each with a run per label) + the scatter
    assert html.count("data:image/png;base64,") == 6
    for name in ("stability_heatmap.png", "prob_vs_purity.png", "examples/curve_h1_entropy_all_tokens_nats.png"):
        assert (tmp_path / name).read_bytes()[:8] == PNG_MAGIC


def test_v1_relabels_the_same_runs_with_a_note(tmp_path: Path) -> None:
    methods = ["grpo", "ict"]
    specs = grid.grid_specs(methods, 2, LRS)
    results = grid.run_grid(specs, tmp_path, fake_runner, log=lambda _: None)
    sweep.write_report(tmp_path, methods, LRS, specs, results, {"p1": 0.2, "p4": 0.4}, OutcomeThresholds.v1(),
                       {}, 0.0, note="v1 labels, for comparison")
    saved = json.loads((tmp_path / "sweep.json").read_text())
    assert saved["thresholds"]["version"] == "v1" and saved["note"] == "v1 labels, for comparison"
    for row in saved["runs"]:  # v1 has no "degraded": those runs are stable; the rest keep their label
        want = planned_kind(grid.RunSpec(row["method"], row["seed"], row["lr"]))
        assert row["label"] == ("stable" if want == "degraded" else want)
    assert set(saved["examples"]) == {"collapsed", "exploded", "unrewarded", "stable"}
    md = (tmp_path / "stability.md").read_text()
    assert md.startswith("**v1 labels, for comparison**\n\nLabels: outcome thresholds v1")
    assert "| ict | 2/2 stable | 2/2 stable | 1/2 stable (1 E) | 0.0001 – 0.0005 |" in md
    page = (tmp_path / "report.html").read_text()
    assert page.index("v1 labels, for comparison") < page.index("Widest learning-rate range") < page.index("<table>")
    assert "{'version'" not in page  # the rules in words, not a dict dump
    assert "Collapsed: the last-window entropy H1" in page and "below 0.05 nats" in page


def test_seed_start_and_thresholds_options() -> None:
    specs = sweep.sweep_specs(["grpo", "ict"], 3, [1e-4, 1e-3], seed_start=3)
    assert [(s.lr, s.seed, s.method) for s in specs[:4]] == [(1e-4, 3, "grpo"), (1e-4, 3, "ict"), (1e-4, 4, "grpo"),
                                                             (1e-4, 4, "ict")]
    assert len(specs) == 12 and {s.seed for s in specs} == {3, 4, 5}
    assert sweep.sweep_specs(["ict"], 2, [1e-4]) == grid.grid_specs(["ict"], 2, [1e-4])
    with pytest.raises(ValueError, match="--seed-start"):
        sweep.sweep_specs(["ict"], 2, [1e-4], seed_start=-1)
    args = parse(["--seed-start", "3", "--thresholds", "v1"])
    assert (args.seed_start, args.thresholds, parse([]).thresholds) == (3, "v1", "v2")
    with pytest.raises(SystemExit):
        parse(["--thresholds", "v3"])


def test_missing_label_is_reported(tmp_path: Path) -> None:
    specs = grid.grid_specs(["ict"], 1, [1e-4])
    results = grid.run_grid(specs, tmp_path, fake_runner, log=lambda _: None)
    page = sweep.write_report(tmp_path, ["ict"], [1e-4], specs, results, {"p1": 0.2, "p4": 0.4},
                              OutcomeThresholds(), {}, 0.0)
    assert "No run was labelled collapsed or exploded or degraded or unrewarded." in page.read_text()
    assert sweep.pick_examples([])["stable"] is None


def test_after_warmup_drops_warmup_steps() -> None:
    recs = synthetic_records("stable", steps=6)
    assert [r["step"] for r in sweep.after_warmup(recs)] == [4, 5, 6]


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    sweep.add_arguments(parser)
    return parser.parse_args(argv)


def test_defaults_and_bad_arguments(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = parse([])
    assert len(sweep.parse_lrs(args.lrs)) >= 5 and args.seeds >= 3
    assert grid.parse_methods(args.methods) == ["grpo", "entropy20", "stapo", "ict", "random10"]
    assert sweep.parse_lrs("2e-3,1e-4,1e-4") == [1e-4, 2e-3]
    for bad in ("1e-4,x", "0,1e-3", ""):
        with pytest.raises(ValueError, match="--learning-rate"):
            sweep.parse_lrs(bad)
    from studies.__main__ import main

    assert main(["sweep", "--methods", "ict,stapoo", "--output-dir", str(tmp_path)]) == 2
    assert capsys.readouterr().err.startswith("studies sweep: error: methods: unknown method 'stapoo'")


@pytest.mark.integration
def test_sweep_quick_end_to_end(tmp_path: Path, quick_cache_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ICTRL_CACHE_DIR", str(quick_cache_dir))
    out = tmp_path / "sweep"
    argv = ["--quick", "--methods", "ict", "--seeds", "1", "--lrs", "1e-4,1e-3", "--output-dir", str(out)]
    assert sweep.run(parse(argv)) == 0
    saved = json.loads((out / "sweep.json").read_text())
    assert [(r["method"], r["lr"]) for r in saved["runs"]] == [("ict", 1e-4), ("ict", 1e-3)]
    assert all(r["label"] in ("collapsed", "exploded", "degraded", "unrewarded", "stable") for r in saved["runs"])
    for r in saved["runs"]:  # a run that never earned a reward tested nothing: never "stable"
        if r["label"] == "stable":
            assert max(r["summary"]["reward_first"], r["summary"]["reward_last"]) > 0
    assert "PIPELINE CHECK" in (out / "report.html").read_text()
    assert saved["thresholds"]["entropy_floor"] == OutcomeThresholds().entropy_floor
    for name in ("report.html", "stability.md", "stability_heatmap.png", "lr0.001/ict/seed0/done.json"):
        assert (out / name).is_file(), name

    def no_training(*_: object) -> dict:
        raise AssertionError("a finished run was trained again")

    monkeypatch.setattr(tinyrun, "train_tiny", no_training)
    # a rerun with other thresholds relabels and re-renders the finished runs without training them again
    assert sweep.run(parse([*argv, "--thresholds", "v1"])) == 0
    relabelled = json.loads((out / "sweep.json").read_text())
    assert relabelled["thresholds"]["version"] == "v1"
    assert [r["p1"] for r in relabelled["runs"]] == [r["p1"] for r in saved["runs"]]


def test_a_diverged_run_is_exploded(tmp_path: Path) -> None:
    import torch

    with pytest.raises(RuntimeError) as info:  # what TRL's sampling raises once the weights are non-finite
        torch.multinomial(torch.tensor([[float("nan"), 1.0]]), 1)
    assert tinyrun.is_divergence(info.value) and not tinyrun.is_divergence(RuntimeError("shape mismatch"))

    def runner(spec: grid.RunSpec, run_dir: Path) -> dict:
        if spec.seed == 0:
            return fake_runner(spec, run_dir)
        (run_dir / "metrics.jsonl").write_text("")  # blew up before the first log
        return {"p1": 0.0, "p4": 0.0, "diverged": "probability tensor contains either inf, nan or element < 0"}

    specs = grid.grid_specs(["ict"], 2, [1e-4])
    results = grid.run_grid(specs, tmp_path, runner, log=lambda _: None)
    sweep.write_report(tmp_path, ["ict"], [1e-4], specs, results, {"p1": 0.2, "p4": 0.4}, OutcomeThresholds(), {}, 0)
    rows = json.loads((tmp_path / "sweep.json").read_text())["runs"]
    assert [(r["label"], r["diverged"]) for r in rows] == [("stable", False), ("exploded", True)]
    assert "1 such run(s)" in (tmp_path / "report.html").read_text()


def test_an_output_dir_under_a_file_is_one_line_before_any_run(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    from studies.__main__ import main

    (tmp_path / "FILE").write_text("x")
    assert main(["sweep", "--quick", "--output-dir", str(tmp_path / "FILE" / "under")]) == 2
    lines = capsys.readouterr().err.strip().split("\n")
    assert len(lines) == 1 and lines[0].startswith("studies sweep: error: --output-dir:"), lines
    assert not (tmp_path / "FILE").is_dir()

