"""python -m studies compare --tune: the tuning grid, the fixed choice rule, matched update size, and the whole
protocol end to end with resume (--quick, countdown)."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import pytest

from studies import compare
from ictrl.experiments.grid import runner as grid
from ictrl.experiments.grid import tinyrun
from studies.protocols import tune
from ictrl.experiments.reports.update_norm import KEY


def proto(**kw) -> tune.Protocol:  # type: ignore[no-untyped-def]
    return tune.Protocol(**{"variants": ("grpo", "ict", "random10"), "lrs": (1e-4, 2e-4),
                            "norms": ("default", "per_response_all"), "tune_seeds": 2, "final_seeds": 5, **kw})


def test_tuning_grid_covers_norms_for_sparse_only_and_seeds_are_disjoint() -> None:
    p = proto()
    specs = tune.tuning_specs(p)
    # grpo: 1 normaliser, ict/random10: 2; x 2 lrs x 2 seeds
    assert len(specs) == (1 + 2 + 2) * 2 * 2 == len(set(specs))
    assert {s.norm for s in specs if s.method == "grpo"} == {None}
    assert {s.norm for s in specs if s.method == "ict"} == {None, "per_response_all"}
    chosen = {label: {"lr": 1e-4, "norm": None} for label in p.variants}
    final = tune.final_rows(p, chosen, {})
    assert {s.seed for s in specs}.isdisjoint({s.seed for row in final.values() for s in row})
    assert [s.seed for s in final["ict"]] == [0, 1, 2, 3, 4]
    assert tune.spec_of("ict20", 0, 1e-4, None).relpath == "lr0.0001/ict-r0.2/seed0"
    # The default variants: every registered method plus ICT at 20% and 30%; STAPO (no ratio) keeps its normaliser.
    from ictrl.core.selection import SELECTORS

    assert {s.label for s in SELECTORS.values()} | {"ict20", "ict30"} == set(tune.ABLATION)
    assert tune.VARIANTS["ict30"] == ("ict", 0.3)
    assert tune.norms_for("stapo", p) == [None] and tune.norms_for("entropy20", p) == [None, "per_response_all"]
    with pytest.raises(ValueError, match="unknown variant 'ictt'"):
        proto(variants=("ictt",))
    with pytest.raises(ValueError, match="unknown normaliser"):
        proto(norms=("bogus",))
    with pytest.raises(ValueError, match="final-seeds >= 2"):
        proto(final_seeds=1)


def test_choice_rule_best_mean_then_smaller_lr_then_default_norm() -> None:
    p = proto()
    scores = {  # (label, lr, norm) -> per-seed Totals (p1 = p4 = Total)
        ("grpo", 1e-4, None): [0.3, 0.5], ("grpo", 2e-4, None): [0.5, 0.3],  # tie at 0.4: smaller lr wins
        ("ict", 1e-4, None): [0.2, 0.2], ("ict", 2e-4, None): [0.6, 0.0],
        ("ict", 1e-4, "per_response_all"): [0.1, 0.1], ("ict", 2e-4, "per_response_all"): [0.35, 0.35],
        ("random10", 1e-4, None): [0.25, 0.25], ("random10", 1e-4, "per_response_all"): [0.25, 0.25],
        ("random10", 2e-4, None): [0.0, 0.0], ("random10", 2e-4, "per_response_all"): [0.1, 0.1],
    }
    results = {}
    for (label, lr, norm), vals in scores.items():
        for i, v in enumerate(vals):
            results[tune.spec_of(label, tune.TUNE_SEED_START + i, lr, norm)] = {"p1": v, "p4": v}
    chosen = tune.choose(p, results)
    assert (chosen["grpo"]["lr"], chosen["grpo"]["norm"]) == (1e-4, None)
    assert (chosen["ict"]["lr"], chosen["ict"]["norm"]) == (2e-4, "per_response_all")
    assert math.isclose(chosen["ict"]["score"], 0.35)
    assert [1e-4, None, 0.2, 0] in chosen["ict"]["scores"]
    assert (chosen["random10"]["lr"], chosen["random10"]["norm"]) == (1e-4, None)  # tie on norm: default


def write_metrics(path: Path, norms: list[float]) -> None:
    path.mkdir(parents=True, exist_ok=True)
    (path / "metrics.jsonl").write_text("".join(json.dumps({"step": i + 1, KEY: u}) + "\n" for i, u in enumerate(norms)))


def test_matched_lr_scales_by_the_measured_update_norms(tmp_path: Path) -> None:
    p = proto(tune_seeds=1)
    chosen = {"grpo": {"lr": 2e-4, "norm": None}, "ict": {"lr": 1e-4, "norm": "per_response_all"},
              "random10": {"lr": 1e-4, "norm": None}}
    seed = tune.TUNE_SEED_START
    # Steps <= Θ = 2 are left out of the mean: the warm-up updates every token.
    write_metrics(tmp_path / tune.spec_of("grpo", seed, 2e-4, None).relpath, [9.0, 9.0, 1.0, 3.0])
    write_metrics(tmp_path / tune.spec_of("ict", seed, 2e-4, "per_response_all").relpath, [9.0, 9.0, 4.0, 4.0])
    write_metrics(tmp_path / tune.spec_of("random10", seed, 2e-4, None).relpath, [9.0, 9.0, 0.5, 0.5])
    matched = tune.matched_lrs(p, chosen, tmp_path, theta=2)
    assert math.isclose(matched["ict-matched"]["lr"], 2e-4 * 2.0 / 4.0)
    assert matched["ict-matched"]["norm"] == "per_response_all"
    assert math.isclose(matched["random10-matched"]["lr"], 2e-4 * 2.0 / 0.5)
    rows = tune.final_rows(p, chosen, matched)
    assert rows["ict-matched"][0] == grid.RunSpec("ict", 0, 1e-4, norm="per_response_all")
    # No measurable update (all-zero advantages): no matched row rather than a division by zero.
    write_metrics(tmp_path / tune.spec_of("random10", seed, 2e-4, None).relpath, [0.0, 0.0, 0.0, 0.0])
    assert "random10-matched" not in tune.matched_lrs(p, chosen, tmp_path, theta=2)


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    compare.add_arguments(parser)
    return parser.parse_args(argv)


def test_a_bad_lr_grid_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from studies.__main__ import main

    assert main(["compare", "--tune", "--lrs", "1e-4,x", "--output-dir", str(tmp_path)]) == 2
    assert capsys.readouterr().err.startswith("studies compare: error: --lrs: expected comma-separated numbers")


@pytest.mark.integration
def test_tune_quick_countdown_end_to_end_and_resume(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ICTRL_CACHE_DIR", str(tmp_path / "cache"))
    out = tmp_path / "tune"
    argv = ["--tune", "--quick", "--task", "studies.tasks.countdown", "--variants", "grpo,ict,random10", "--lrs", "1e-4,1e-3",
            "--norms", "default", "--final-seeds", "2", "--output-dir", str(out)]
    assert compare.run(parse(argv)) == 0
    choices = json.loads((out / "choices.json").read_text())
    assert set(choices["chosen"]) == {"grpo", "ict", "random10"}
    for label, c in choices["chosen"].items():
        assert c["lr"] in (1e-4, 1e-3)
        assert (out / "final" / tune.spec_of(label, 1, c["lr"], c["norm"]).relpath / grid.DONE_FILE).is_file()
    assert len(list((out / "tune").glob("*/*/seed1000/done.json"))) == 3 * 2
    records = [json.loads(x) for x in (out / "final" / tune.spec_of("ict", 0, choices["chosen"]["ict"]["lr"], None)
                                        .relpath / "metrics.jsonl").read_text().splitlines()]
    assert all(KEY in r and r[KEY] >= 0 for r in records)  # the update norm is logged every step
    base = json.loads((out / "base" / "result.json").read_text())
    assert 0 <= base["p1"] <= base["p4"] <= 1
    text = (out / "results.md").read_text()
    assert text.startswith("QUICK RUN") and "NOT A RESULT" in text.splitlines()[0]
    assert "Task studies.tasks.countdown" in text and tune.CHOICE_RULE in text
    assert "NOT A RESULT" in (out / "report.html").read_text()

    # Resume: a finished protocol trains nothing; a run without its done marker (a crash) is redone alone.
    calls: list[str] = []
    real = tinyrun.train_tiny

    def counting(settings, base, spec, run_dir):  # type: ignore[no-untyped-def]
        calls.append(f"{settings.eval_split}:{spec.relpath}")
        return real(settings, base, spec, run_dir)

    monkeypatch.setattr(tinyrun, "train_tiny", counting)
    assert compare.run(parse(argv)) == 0
    assert calls == []
    lost = tune.spec_of("random10", 1, choices["chosen"]["random10"]["lr"], None)
    (out / "final" / lost.relpath / grid.DONE_FILE).unlink()
    assert compare.run(parse(argv)) == 0
    assert calls == [f"test:{lost.relpath}"]


def test_report_answers_first_with_the_welch_ci_stable_range_and_norms(tmp_path: Path) -> None:
    """tune_report.write on hand-made runs: the first lines carry the CI scipy gives, a diverged lr leaves the
    stable range, the update-norm ratio is the measured one, and a full run is not called a quick one."""
    from scipy import stats

    from studies.reports import tune_report

    p = proto(tune_seeds=1, final_seeds=3, lrs=(1e-4, 2e-4))
    seed = tune.TUNE_SEED_START
    tune_results = {}
    for s in tune.tuning_specs(p):
        bad = s.method == "ict" and s.lr == 2e-4 and s.norm is None
        tune_results[s] = {"p1": 0.0 if bad else 0.3, "p4": 0.0 if bad else 0.5, "seconds": 1.0,
                           **({"diverged": "nan"} if bad else {})}
    chosen = tune.choose(p, tune_results)
    assert chosen["ict"]["lr"] == 1e-4
    totals = {"grpo": [0.40, 0.42, 0.44], "ict": [0.30, 0.34, 0.32], "random10": [0.20, 0.25, 0.21]}
    rows = tune.final_rows(p, chosen, {})
    final = {}
    for label, specs in rows.items():
        for s, t in zip(specs, totals[label]):
            final[s] = {"p1": t, "p4": t, "seconds": 2.0}
            u = 2.0 if label == "grpo" else 1.0
            (tmp_path / "final" / s.relpath).mkdir(parents=True)
            (tmp_path / "final" / s.relpath / "metrics.jsonl").write_text("".join(
                json.dumps({"step": k + 1, KEY: u, "ictrl/h1/all": 0.5, "ictrl/h2/all": 0.4,
                            "ictrl/h1/selected": 0.9 if label == "ict" else 0.5 + 0.01 * s.seed,
                            "ictrl/prob/selected": 0.2 + 0.01 * s.seed if label == "ict" else 0.8,
                            "ictrl/selected/high_entropy_frac": 0.5}) + "\n"
                for k in range(6)))
    settings = {"rl": {"steps": 6, "prompts_per_step": 4, "num_generations": 4, "eval_problems": 8, "eval_n": 4,
                       "temperature": 1.0}}
    paths = tune_report.write(tmp_path, p, settings, tune_results, {"p1": 0.3, "p4": 0.5}, chosen, {}, rows, final,
                              {"p1": 0.1, "p4": 0.2}, theta=0, seconds=1.0, quick=False, task="countdown")
    text = paths["table"].read_text()
    first = text.splitlines()[0]
    assert first.startswith("Task countdown") and "QUICK" not in text
    a, b = [100 * t for t in totals["ict"]], [100 * t for t in totals["random10"]]
    ref = stats.ttest_ind(a, b, equal_var=False)
    lo, hi = ref.confidence_interval(0.95)
    assert f"[{lo:+.2f}, {hi:+.2f}]" in first and "beats random10 beyond seed noise" in first
    # ict at 2e-4 (default normaliser, its choice) diverged: not stable; its dev Total 40 equals the base's elsewhere.
    assert "ict {0.0001}" in text and "random10 {0.0001, 0.0002}" in text and "narrower than" in text
    assert "| ict | 0.0001 | 1 ± 0 | 0.50 |" in text  # measured update norm and its ratio to GRPO's
    assert "H1 selected ict − random10 +0.39" in text
    # π of the selected tokens: ict 0.20/0.21/0.22 vs random10 0.8 -> −0.59; a key equal in both rows gives +0.00.
    assert "π selected ict − random10 -0.59" in text and "high-H1 share of selected ict − random10 +0.00" in text
    assert "π 0.18 ± 0.09" in text.split("\n\n|")[0]  # the paper's description sits in the answer, above the tables
    assert "(1 diverged)" in text and tune.CHOICE_RULE in text
    # Every choice here is the grid's smallest lr (all tie, ties go to the smaller): the answer says so.
    assert "Chosen at the edge of the lr grid" in text and "ict 0.0001 (smallest)" in text
    assert (tmp_path / "report.html").is_file()
    # A base model at 0% (nothing for RL to find) is flagged in the first line of a full run.
    paths = tune_report.write(tmp_path, p, settings, tune_results, {"p1": 0.3, "p4": 0.5}, chosen, {}, rows, final,
                              {"p1": 0.0, "p4": 0.0}, theta=0, seconds=1.0, quick=False, task="countdown")
    assert paths["table"].read_text().startswith("WARNING: the base model scores P@1 0.0% / P@4 0.0%")
    assert any(pth.name.startswith("curve_update") for pth in tmp_path.glob("curve_*.png"))


def test_edge_choices_name_choices_at_either_end_of_the_grid_only() -> None:
    from studies.reports.tune_report import edge_choices

    lrs = (1e-4, 2e-4, 4e-4)
    chosen = {"grpo": {"lr": 4e-4}, "ict": {"lr": 2e-4}, "random10": {"lr": 1e-4}}
    assert edge_choices(chosen, lrs) == ["grpo 0.0004 (largest)", "random10 0.0001 (smallest)"]
    assert edge_choices({"ict": {"lr": 1e-4}}, (1e-4,)) == []  # one lr: nothing was tuned, no edge to report
