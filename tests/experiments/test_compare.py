"""ictrl compare and the shared grid: method table, resumable runner, report numbers, end to end (--quick)."""

from __future__ import annotations

import argparse
import json
import math
import re
from pathlib import Path

import pytest

from ictrl.errors import UserError
from ictrl.experiments import compare
from ictrl.experiments.grid import runner as grid
from ictrl.experiments.grid import cli as gridcli
from ictrl.experiments.grid import tinyrun
from ictrl.experiments.reports.report import PNG_MAGIC


def fake_result(spec: grid.RunSpec) -> dict:
    """Deterministic but spec-dependent scores, so that table numbers can be recomputed by hand."""
    order = list(grid.METHODS).index(spec.method) if spec.method in grid.METHODS else len(grid.METHODS)
    p1 = 0.1 + 0.05 * order + 0.01 * spec.seed
    return {"p1": p1, "p4": min(1.0, 2 * p1), "final_reward": p1}


def fake_metrics(spec: grid.RunSpec, steps: int = 12) -> list[dict]:
    return [{"step": t + 1, "reward": 0.1 + 0.01 * t, "ictrl/h1/all": 0.3 - 0.01 * t, "ictrl/h2/all": 0.2,
             "ictrl/purity/all": 0.8, "ictrl/selected_frac": 1.0 if spec.method == "grpo" else 0.1,
             "ictrl/warmup": 0.0} for t in range(steps)]


class CountingRunner:
    """A stand-in for training: writes metrics.jsonl, counts calls, optionally crashes on one spec."""

    def __init__(self, crash_on: grid.RunSpec | None = None) -> None:
        self.calls: list[grid.RunSpec] = []
        self.crash_on = crash_on

    def __call__(self, spec: grid.RunSpec, run_dir: Path) -> dict:
        self.calls.append(spec)
        (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in fake_metrics(spec)))
        if spec == self.crash_on:
            raise RuntimeError("simulated crash")
        return fake_result(spec)


# ------------------------------------------------------------------------------------------------ method table


def test_parse_methods_names_the_bad_method() -> None:
    assert grid.parse_methods("grpo, ict,grpo") == ["grpo", "ict"]
    assert grid.parse_methods("all,entropy,frequent,random10") == ["grpo", "entropy20", "frequent90", "random10"]
    with pytest.raises(ValueError, match=r"unknown method 'ictt'.*did you mean 'ict'"):
        grid.parse_methods("grpo,ictt")
    with pytest.raises(ValueError, match="unknown method 'bogus'"):
        grid.parse_methods(["bogus"])
    with pytest.raises(ValueError, match="at least one"):
        grid.parse_methods(" , ")


def test_every_method_maps_to_a_valid_trainer_config(tmp_path: Path) -> None:
    """The name -> selector table goes through the engine's own config mapping and validation."""
    from ictrl.train_cli.trainer_inputs import build_trainer_args

    base = tmp_path / "base"
    base.mkdir()
    (base / "warm_start.json").write_text(json.dumps({"recipe": {"difficulty": [2], "seed": 0}}))
    expected = {"grpo": ("all", None), "entropy20": ("entropy", 0.2), "stapo": ("stapo", None),
                "ict": ("ict", 0.1), "random10": ("random", 0.1), "frequent90": ("frequent", 0.1)}
    assert set(expected) == set(grid.METHODS)
    assert grid.DEFAULT_METHODS == ("grpo", "entropy20", "stapo", "ict", "random10")
    settings = tinyrun.TinyRL(steps=3, prompts_per_step=2, num_generations=2, selection_warmup=5)
    for name, (selector, ratio) in expected.items():
        spec = grid.RunSpec(name, seed=4, lr=3e-4)
        args = build_trainer_args(tinyrun.tiny_run_config(settings, base, spec, tmp_path / name), name, cpu=True)
        assert args.token_selector == selector
        assert args.selection_ratio == ratio
        assert args.learning_rate == 3e-4 and args.seed == 4 and args.max_steps == 3
        assert args.selection_warmup_steps == (5 if selector in ("ict", "random", "frequent") else 0)
    with pytest.raises(UserError, match="unknown method 'nope'"):
        grid.parse_methods(["nope"])


def test_grid_specs_and_paths() -> None:
    specs = grid.grid_specs(["grpo", "ict"], 2, [1e-4, 2e-3])
    assert len(specs) == 8 and len({s.relpath for s in specs}) == 8
    assert grid.RunSpec("ict", 1, 2e-3).relpath == "lr0.002/ict/seed1"
    assert grid.RunSpec("ict", 0).relpath == "ict/seed0"
    with pytest.raises(ValueError, match="seeds"):
        grid.grid_specs(["grpo"], 0)
    # the learning rates are checked at the flags: test_cli_errors_name_the_bad_method, studies' test_sweep


# ------------------------------------------------------------------------------------------------ resumable grid


def test_run_grid_skips_done_runs_and_redoes_unfinished_ones(tmp_path: Path) -> None:
    specs = grid.grid_specs(["grpo", "ict"], 2)
    crash = grid.RunSpec("ict", 1)
    first = CountingRunner(crash_on=crash)
    with pytest.raises(RuntimeError, match="simulated crash"):
        grid.run_grid(specs, tmp_path, first, log=lambda _: None)
    assert first.calls == specs  # ict/seed1 is last: everything before it finished
    assert (tmp_path / "ict/seed1/metrics.jsonl").is_file()  # the crashed attempt left files ...
    assert not (tmp_path / "ict/seed1" / grid.DONE_FILE).exists()  # ... but no done marker

    second = CountingRunner()
    results = grid.run_grid(specs, tmp_path, second, log=lambda _: None)
    assert second.calls == [crash]  # only the unfinished run is redone
    for spec in specs:
        done = json.loads((tmp_path / spec.relpath / grid.DONE_FILE).read_text())
        assert done["p1"] == fake_result(spec)["p1"] and done["spec"]["method"] == spec.method
        assert results[spec] == done

    third = CountingRunner()
    grid.run_grid(specs, tmp_path, third, log=lambda _: None)
    assert third.calls == []


def test_run_grid_rejects_a_result_without_scores(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no 'p4'"):
        grid.run_grid([grid.RunSpec("grpo", 0)], tmp_path, lambda s, d: {"p1": 0.5}, log=lambda _: None)
    assert not (tmp_path / "grpo/seed0" / grid.DONE_FILE).exists()


# ------------------------------------------------------------------------------------------------ report


def test_write_report_numbers_match_a_naive_computation(tmp_path: Path) -> None:
    methods = ["grpo", "ict", "random10"]
    specs = grid.grid_specs(methods, 3)
    results = grid.run_grid(specs, tmp_path, CountingRunner(), log=lambda _: None)
    base = {"p1": 0.05, "p4": 0.15}
    paths = compare.write_report(tmp_path, methods, specs, results, base, {"source": "test"}, 1.0)
    md = paths["table"].read_text()

    def naive(method: str, key: str) -> tuple[float, float]:
        xs = [100.0 * fake_result(grid.RunSpec(method, s))[key] for s in range(3)]
        m = sum(xs) / 3
        return m, math.sqrt(sum((x - m) ** 2 for x in xs) / 2)

    for method in methods:
        row = next(line for line in md.splitlines() if line.startswith(f"| {method} (n=3)"))
        for key in ("p1", "p4"):
            m, sd = naive(method, key)
            assert f"{m:.2f} ± {sd:.2f}" in row
    assert "| base (n=1) | 5.00 ± n/a | 15.00 ± n/a |" in md
    diff = 100 * (fake_result(grid.RunSpec("ict", 0))["p1"] - fake_result(grid.RunSpec("random10", 0))["p1"])
    assert re.search(rf"ict − random10 \(95% Welch CI\) \| {diff:+.2f}", md)
    html = paths["report"].read_text()
    logged = set(fake_metrics(grid.RunSpec("ict", 0))[0])
    # one embedded plot per curve key that the runs logged (a key no run logged is skipped, not drawn empty)
    assert html.count("data:image/png;base64,") == sum(key in logged for key in compare.CURVE_KEYS.values()) >= 5
    assert "ict − random10" in html and "<table>" in html
    for name in ("curve_reward.png", "curve_selected_fraction.png", "curve_purity_beta_all_tokens.png"):
        assert (tmp_path / name).read_bytes()[:8] == PNG_MAGIC
    saved = json.loads((tmp_path / "results.json").read_text())
    assert len(saved["runs"]) == 9 and saved["base"] == base


EMBEDDED_RL = {"steps": 40, "prompts_per_step": 32, "num_generations": 8, "num_iterations": 1, "lr": 2e-4,
               "eval_problems": 200, "eval_n": 8, "selection_warmup": None}


def test_report_page_reads_at_a_glance_without_local_paths(tmp_path: Path) -> None:
    methods = ["grpo", "ict", "random10"]
    specs = grid.grid_specs(methods, 3)
    results = grid.run_grid(specs, tmp_path, CountingRunner(), log=lambda _: None)
    settings = {"source": "embedded", "base": str(tmp_path / "cache" / "tiny-base-0123"), "rl": EMBEDDED_RL}
    paths = compare.write_report(tmp_path, methods, specs, results, {"p1": 0.05, "p4": 0.15}, settings, 1.0,
                                 note="NOTE-AT-TOP")
    page = paths["report"].read_text()
    assert str(tmp_path) not in page and "tiny-base-0123" in page
    assert page.index("NOTE-AT-TOP") < page.index("Highest mean Total") < page.index("<table>")
    assert "ict − random10 on Total" in page and "3 seeds per method" in page
    assert "<figcaption>reward per training step: mean over 3 seeds" in page


def test_quick_report_is_a_pipeline_check_and_names_no_winner_among_ties(tmp_path: Path) -> None:
    from ictrl.experiments.grid.cli import PIPELINE_CHECK

    methods = ["grpo", "ict"]
    specs = grid.grid_specs(methods, 1)

    def zeros(spec: grid.RunSpec, run_dir: Path) -> dict:
        (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in fake_metrics(spec)))
        return {"p1": 0.0, "p4": 0.0}

    results = grid.run_grid(specs, tmp_path, zeros, log=lambda _: None)
    settings = {"source": "embedded", "base": "tiny-base-q", "rl": EMBEDDED_RL, "quick": True}
    page = compare.write_report(tmp_path, methods, specs, results, {"p1": 0.0, "p4": 0.0}, settings, 1.0)["report"]
    text = page.read_text()
    assert PIPELINE_CHECK in text and "Highest mean Total" not in text
    assert "No highest mean Total (mean of P@1 and P@4): grpo, ict tie at 0.0%" in text
    settings["quick"] = False
    results[specs[1]] = {**results[specs[1]], "p1": 0.5, "p4": 0.5}
    text = compare.write_report(tmp_path, methods, specs, results, {"p1": 0.0, "p4": 0.0}, settings,
                                1.0)["report"].read_text()
    assert PIPELINE_CHECK not in text and "Highest mean Total (mean of P@1 and P@4): ict, 50.0%" in text


def test_write_report_without_the_ict_random_pair(tmp_path: Path) -> None:
    specs = grid.grid_specs(["grpo"], 2)
    results = grid.run_grid(specs, tmp_path, CountingRunner(), log=lambda _: None)
    paths = compare.write_report(tmp_path, ["grpo"], specs, results, {"p1": 0.0, "p4": 0.0}, {}, 0.0)
    assert "Welch" not in paths["table"].read_text()


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    compare.add_arguments(parser)
    return parser.parse_args(argv)


def test_cli_errors_name_the_bad_method(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from ictrl.cli import main

    assert main(["compare", "--methods", "grpo,entropyy", "--output-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("ictrl compare: error: methods: unknown method 'entropyy'; did you mean 'entropy")
    assert "entropy20" in err and len(err.strip().splitlines()) == 1
    assert main(["compare", "--seeds", "0", "--output-dir", str(tmp_path)]) == 2
    assert "seeds" in capsys.readouterr().err
    for lr in ("0", "inf", "nan"):  # the flag is the one check of the grid's learning rates
        assert main(["compare", "--learning-rate", lr, "--output-dir", str(tmp_path)]) == 2
        assert f"--learning-rate must be finite and > 0, got {float(lr)}" in capsys.readouterr().err


def test_a_bug_inside_a_run_keeps_its_traceback(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Only a UserError becomes one line: a ValueError from inside training is a bug and must surface whole
    (it used to be caught with the user errors and printed as 'ictrl compare: error: ...', even under --debug)."""
    from ictrl.cli import main

    def broken(spec: grid.RunSpec, run_dir: Path) -> dict[str, float]:
        raise ValueError("shapes do not match inside the loss")

    monkeypatch.setattr(gridcli, "make_experiment", lambda args: gridcli.Experiment(
        runner=broken, eval_base=lambda out: {"p1": 0.0, "p4": 0.0}, settings={}, default_lr=None))
    with pytest.raises(ValueError, match="shapes do not match"):
        main(["compare", "--methods", "grpo", "--seeds", "1", "--output-dir", str(tmp_path)])


# ------------------------------------------------------------------------------------------------ end to end


QUICK_ARGV = ["--quick", "--methods", "ict", "--seeds", "1", "--eval-every", "1"]


@pytest.fixture(scope="module")
def quick_compare(quick_cache_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One quick ``ictrl compare`` (ict, one seed, held-out evaluation every step), read by the tests below; a test
    that changes the output works on a copy, so the tests pass in any order."""
    out = tmp_path_factory.mktemp("quick_compare") / "cmp"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("ICTRL_CACHE_DIR", str(quick_cache_dir))
        assert compare.run(parse([*QUICK_ARGV, "--output-dir", str(out)])) == 0
    return out


@pytest.mark.integration
def test_compare_quick_end_to_end_and_resume(quick_compare: Path, tmp_path: Path, quick_cache_dir: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    import shutil

    monkeypatch.setenv("ICTRL_CACHE_DIR", str(quick_cache_dir))
    out = tmp_path / "cmp"
    shutil.copytree(quick_compare, out)
    argv = [*QUICK_ARGV, "--output-dir", str(out)]
    for name in ("results.md", "results.json", "report.html", "curve_reward.png", "base/result.json"):
        assert (out / name).is_file(), name
    records = [json.loads(line) for line in (out / "ict/seed0/metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == list(range(1, gridcli.QUICK_RL["steps"] + 1))
    assert all("ictrl/h1/all" in r and "reward" in r for r in records)
    done = json.loads((out / "ict/seed0" / grid.DONE_FILE).read_text())
    assert 0.0 <= done["p1"] <= done["p4"] <= 1.0
    assert "| ict (n=1) |" in (out / "results.md").read_text()

    # A second invocation trains nothing; a run without its done marker (a crash) is trained again.
    calls: list[str] = []
    real = tinyrun.train_tiny

    def counting(settings, base, spec, run_dir):  # type: ignore[no-untyped-def]
        calls.append(spec.relpath)
        return real(settings, base, spec, run_dir)

    monkeypatch.setattr(tinyrun, "train_tiny", counting)
    assert compare.run(parse(argv)) == 0
    assert calls == []
    (out / "ict/seed0" / grid.DONE_FILE).unlink()
    assert compare.run(parse(argv)) == 0
    assert calls == ["ict/seed0"]
    assert (out / "ict/seed0" / grid.DONE_FILE).is_file()


@pytest.mark.integration
def test_compare_draws_the_held_out_curve(quick_compare: Path) -> None:
    """Held-out pass@k during training on the embedded task: the eval/* curves of ``ictrl compare``."""
    out = quick_compare
    records = [json.loads(line) for line in (out / "ict/seed0/metrics.jsonl").read_text().splitlines()]
    steps = gridcli.QUICK_RL["steps"]
    assert [r["step"] for r in records] == list(range(1, steps + 1))
    for r in records:  # every step evaluated, beside its training metrics
        assert 0.0 <= r["eval/avg/pass@1"] <= r["eval/avg/pass@4"] <= 1.0 and "reward" in r
    png = out / "curve_held_out_pass_1_evaluated_during_training.png"
    assert png.read_bytes()[:8] == PNG_MAGIC
    done = json.loads((out / "ict/seed0" / grid.DONE_FILE).read_text())
    # the last in-training evaluation uses the end-of-run settings and seed on the first curve_problems problems;
    # with the quick task's 8 held-out problems (< curve_problems) it is the end-of-run evaluation itself
    assert gridcli.QUICK_RL["eval_problems"] <= tinyrun.TinyRL().curve_problems
    assert records[-1]["eval/avg/pass@1"] == pytest.approx(done["p1"], abs=1e-12)


@pytest.mark.integration
def test_compare_from_a_run_config_resumes_from_a_checkpoint(tiny_model_dir: Path, shared_data: Path,
                                                             tmp_path: Path) -> None:
    import yaml

    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump({
        "model_name_or_path": str(tiny_model_dir), "output_dir": "replaced-per-run",
        "dataset_name": "gsm8k_train", "eval_datasets": ["gsm8k"], "dataset_limit": 6, "max_prompt_length": None,
        "num_generations": 4, "max_completion_length": 8, "prompts_per_step": 2, "per_device_train_batch_size": 8,
        "max_steps": 5, "learning_rate": 1e-5, "save_steps": 1, "token_selector": "stapo",  # replaced per method
    }))
    out = tmp_path / "cmp"
    argv = ["--config", str(config), "--methods", "ict", "--seeds", "1", "--steps", "2", "--eval-problems", "2",
            "--output-dir", str(out)]
    assert compare.run(parse(argv)) == 0
    run_dir = out / "ict/seed0"
    done = json.loads((run_dir / grid.DONE_FILE).read_text())
    assert done["steps"] == 2 and done["resumed"] is False  # --steps overrides the config's max_steps
    saved = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert saved["token_selector"] == "ict" and saved["output_dir"] == str(run_dir)
    assert json.loads((out / "base/result.json").read_text()).keys() >= {"p1", "p4"}

    # A crash between checkpoint-1 and checkpoint-2: the rerun resumes from checkpoint-1 rather than step 0.
    import shutil

    (run_dir / grid.DONE_FILE).unlink()
    shutil.rmtree(run_dir / "checkpoint-2")
    for name in ("config.json", "trainer_state.json", "manifest.json"):  # the final model in run_dir, unpublished
        (run_dir / name).unlink()
    assert compare.run(parse(argv)) == 0
    done = json.loads((run_dir / grid.DONE_FILE).read_text())
    assert done["resumed"] is True and done["steps"] == 2
    assert [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()] == [1, 2]


def test_a_rule_from_the_users_own_module_is_a_method(h2rule: Path) -> None:
    """``--methods h2rule:top_h2,ict``: the run is named by the rule's label, and its config names the module, so a
    worker process (``--jobs``) or a rerun of the run's config.yaml imports it."""
    from ictrl.train_cli.run_config import method_config

    assert grid.parse_methods("h2rule:top_h2,ict") == ["top_h2", "ict"]
    assert method_config("top_h2")["token_selector"] == "h2rule:top_h2"
    assert method_config("ict")["token_selector"] == "ict"


@pytest.mark.integration
def test_compare_runs_a_rule_from_the_users_own_module(h2rule: Path, quick_cache_dir: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ICTRL_CACHE_DIR", str(quick_cache_dir))
    out = h2rule / "cmp"
    argv = ["--quick", "--methods", "h2rule:top_h2,ict", "--seeds", "1", "--output-dir", str(out)]
    assert compare.run(parse(argv)) == 0
    records = [json.loads(line) for line in (out / "top_h2/seed0/metrics.jsonl").read_text().splitlines()]
    assert records and all("ictrl/h2/all" in r and "ictrl/ict_score/all" not in r for r in records)
    assert (out / "ict/seed0" / grid.DONE_FILE).is_file()
    assert "| top_h2 (n=1) |" in (out / "results.md").read_text()


# ------------------------------------------------------------------------------------------------ the output folder


def fake_experiment(monkeypatch: pytest.MonkeyPatch, runner: CountingRunner) -> None:
    monkeypatch.setattr(gridcli, "make_experiment", lambda args: gridcli.Experiment(
        runner=runner, eval_base=lambda out: {"p1": 0.1, "p4": 0.2}, settings={}, default_lr=None))


def compare_cli(out: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, list[str]]:
    """``ictrl compare`` of two methods, two seeds into ``out``: its status and error lines."""
    from ictrl.cli import main

    code = main(["compare", "--methods", "ict,random10", "--seeds", "2", "--output-dir", str(out)])
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    return code, [line for line in err.splitlines() if line.startswith("ictrl compare: error:")]


@pytest.mark.parametrize("name", ["results.md", "results.json", "report.html", "curve_reward.png", "base", "ict"])
def test_a_file_ictrl_did_not_write_is_never_replaced(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    runner = CountingRunner()
    fake_experiment(monkeypatch, runner)
    out = tmp_path / "cmp"
    (out / name if name in ("base", "ict") else out).mkdir(parents=True)
    mine = out / name / "notes.txt" if name in ("base", "ict") else out / name
    mine.write_text("mine")
    code, lines = compare_cli(out, capsys)
    assert code == 2 and lines == [f"ictrl compare: error: --output-dir: {out / name} was not written by ictrl and "
                                   "the command would replace it; choose another output directory or move the file "
                                   "away"], lines
    assert runner.calls == [] and mine.read_text() == "mine"
    assert sorted(p.name for p in out.rglob("*")) == sorted(["notes.txt", name] if name in ("base", "ict") else [name])


@pytest.mark.parametrize("torn, says", [
    ("ict/seed0/done.json", "not valid JSON"),
    ("base/result.json", "not valid JSON"),
    ("random10/seed1/metrics.jsonl", "random10/seed1/metrics.jsonl:13, column"),
    (".ictrl-files.json", "cannot read ictrl's list of the files it wrote"),
])
def test_a_torn_file_compare_reads_back_is_one_line_naming_it(torn: str, says: str, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    runner = CountingRunner()
    fake_experiment(monkeypatch, runner)
    out = tmp_path / "cmp"
    assert compare_cli(out, capsys) == (0, [])
    assert len(runner.calls) == 4
    path = out / torn
    text = path.read_text()
    path.write_text(text[: len(text) // 2] if torn.endswith(".json") else text + '{"step": 13, "rew\n')
    code, lines = compare_cli(out, capsys)
    assert code == 2 and len(lines) == 1 and str(path) in lines[0] and says in lines[0], lines
    assert len(runner.calls) == 4  # nothing ran again over it


def test_an_earlier_compare_folder_without_the_list_resumes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    runner = CountingRunner()
    fake_experiment(monkeypatch, runner)
    out = tmp_path / "cmp"
    assert compare_cli(out, capsys) == (0, [])
    (out / ".ictrl-files.json").unlink()  # a folder written before ictrl listed its files: its results.json says
    assert compare_cli(out, capsys) == (0, [])
    assert len(runner.calls) == 4 and (out / ".ictrl-files.json").is_file()


# ------------------------------------------------------------------------------------------------ a rule's identity


def compare_main(out: Path, methods: str, capsys: pytest.CaptureFixture[str], *extra: str) -> tuple[int, list[str]]:
    """``ictrl compare --methods METHODS --seeds 1`` into ``out``: its status and error lines (no traceback)."""
    from ictrl.cli import main

    code = main(["compare", "--methods", methods, "--seeds", "1", "--output-dir", str(out), *extra])
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    return code, [line for line in err.splitlines() if line.startswith("ictrl compare: error:")]


def test_a_ratio_sweep_of_a_users_rule_is_one_command(h2rule: Path, monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    runner = CountingRunner()
    fake_experiment(monkeypatch, runner)
    out = h2rule / "cmp"
    methods = "ict,h2rule:top_h2(ratio=0.2),h2rule:top_h2(ratio=0.3)"
    assert compare_main(out, methods, capsys) == (0, [])
    assert [(s.method, s.options, s.relpath) for s in runner.calls] == [
        ("ict", (), "ict/seed0"), ("top_h2", (("ratio", 0.2),), "top_h2-ratio=0.2/seed0"),
        ("top_h2", (("ratio", 0.3),), "top_h2-ratio=0.3/seed0")]
    table = (out / "results.md").read_text()
    assert "| top_h2(ratio=0.2) (n=1) |" in table and "| top_h2(ratio=0.3) (n=1) |" in table
    saved = json.loads((out / "results.json").read_text())
    assert saved["methods"] == ["ict", "top_h2(ratio=0.2)", "top_h2(ratio=0.3)"]
    assert [saved["selectors"][m]["options"] for m in saved["methods"]] == [
        {"ratio": 0.1, "scope": "response"}, {"ratio": 0.2}, {"ratio": 0.3}]
    # each run trains with its own options: the trainer's config gets them
    from ictrl.train_cli.trainer_inputs import build_trainer_args

    base = h2rule / "base"
    base.mkdir()
    (base / "warm_start.json").write_text(json.dumps({"recipe": {"difficulty": [2], "seed": 0}}))
    spec = runner.calls[2]
    config = tinyrun.tiny_run_config(tinyrun.TinyRL(steps=1, prompts_per_step=2, num_generations=2), base, spec,
                                     h2rule / "run")
    args = build_trainer_args(config, spec.label, cpu=True)
    assert args.token_selector == "h2rule:top_h2" and args.selection_ratio == 0.3


@pytest.mark.parametrize("methods, says", [
    ("h2rule:top_h2(ratio=2)", "methods: h2rule:top_h2(ratio=2): ratio"),
    ("h2rule:top_h2(bogus=1)", "methods: h2rule:top_h2(bogus=1): unknown option(s) ['bogus']"),
    ("h2rule:top_h2(0.2)", "methods: h2rule:top_h2(0.2): options are key=value pairs"),
    ("ict(ratio=0.2, ratio=0.3)", "option 'ratio' given twice"),
    ("ict(scope=f(1))", "option 'scope' is not a literal value"),
])
def test_a_bad_method_option_is_one_line(methods: str, says: str, h2rule: Path, monkeypatch: pytest.MonkeyPatch,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    runner = CountingRunner()
    fake_experiment(monkeypatch, runner)
    code, lines = compare_main(h2rule / "cmp", methods, capsys)
    assert code == 2 and len(lines) == 1 and says in lines[0], lines
    assert runner.calls == []


def test_method_options_map_onto_the_config() -> None:
    from ictrl.experiments.grid.methods import config_keys, parse_entry, split_entries

    assert split_entries("ict, random(ratio=0.2, seed=3),entropy(scope='response')") == [
        "ict", "random(ratio=0.2, seed=3)", "entropy(scope='response')"]
    assert parse_entry("entropy(scope=response, ties='include')") == (
        "entropy20", (("scope", "response"), ("ties", "include")))
    assert config_keys((("ratio", 0.2), ("seed", 3), ("ties", "include"), ("count", (1, 2)))) == {
        "selection_ratio": 0.2, "selection_seed": 3, "selection_options": {"ties": "include", "count": [1, 2]}}
    assert grid.parse_methods("random10(ratio=0.2),random(ratio=0.2)") == ["random10(ratio=0.2)"]


def test_an_edited_rule_runs_again_and_its_source_is_recorded(h2rule: Path, monkeypatch: pytest.MonkeyPatch,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    import hashlib

    runner = CountingRunner()
    fake_experiment(monkeypatch, runner)
    out = h2rule / "cmp"
    assert compare_main(out, "h2rule:top_h2,ict", capsys) == (0, [])
    assert compare_main(out, "h2rule:top_h2,ict", capsys) == (0, [])
    assert len(runner.calls) == 2  # nothing changed: both done
    rule = h2rule / "h2rule.py"
    rule.write_text(rule.read_text().replace("inputs.renyi2, inputs, ratio", "-inputs.renyi2, inputs, ratio"))
    assert compare_main(out, "h2rule:top_h2,ict", capsys) == (0, [])
    assert [s.relpath for s in runner.calls[2:]] == ["top_h2/seed0"]  # the edited rule only, never "already done"
    sha = hashlib.sha256(rule.read_bytes()).hexdigest()
    done = json.loads((out / "top_h2/seed0" / grid.DONE_FILE).read_text())
    assert done["selector"]["sha256"] == sha and done["selector"]["spec"] == "h2rule:top_h2"
    assert json.loads((out / "results.json").read_text())["selectors"]["top_h2"]["sha256"] == sha
    page = (out / "report.html").read_text()
    assert f"top_h2 = h2rule:top_h2 (h2rule.py, sha256 {sha[:16]})" in page and str(h2rule) not in page
    # a run recorded before runs named their rule: ictrl's own rule is kept, a user's is run again
    for relpath in ("top_h2/seed0", "ict/seed0"):
        path = out / relpath / grid.DONE_FILE
        path.write_text(json.dumps({k: v for k, v in json.loads(path.read_text()).items() if k != "selector"}))
    assert compare_main(out, "h2rule:top_h2,ict", capsys) == (0, [])
    assert [s.relpath for s in runner.calls[3:]] == ["top_h2/seed0"]


# ------------------------------------------------------------------------------------------------ one compare per folder


def test_a_second_compare_in_the_folder_stops_naming_the_holder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    import os

    from ictrl.dirlock import OutputLock

    runner = CountingRunner()
    fake_experiment(monkeypatch, runner)
    out = tmp_path / "cmp"
    with OutputLock(out):  # the first compare (or a train or eval) holds the folder
        code, lines = compare_main(out, "ict", capsys)
    assert code == 2 and len(lines) == 1, lines
    assert f"--output-dir: {out} is in use by another command (pid {os.getpid()} on" in lines[0]
    assert runner.calls == [] and not (out / "ict").exists()
    assert compare_main(out, "ict", capsys) == (0, [])  # free again: it runs
    assert len(runner.calls) == 1


LEAVING = '''
from ictrl.core.selection import register_selector


@register_selector("up", label="../escape")
def up(inputs):
    return inputs.mask


@register_selector("slash", label="a/b")
def slash(inputs):
    return inputs.mask
'''


def test_a_label_with_a_path_keeps_its_run_inside_the_output_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    import sys

    (tmp_path / "leaving.py").write_text(LEAVING)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    runner = CountingRunner()
    fake_experiment(monkeypatch, runner)
    out = tmp_path / "cmp"
    try:
        assert compare_main(out, "leaving:up,leaving:slash", capsys) == (0, [])
    finally:
        sys.modules.pop("leaving", None)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cmp", "leaving.py"]  # nothing beside the output dir
    assert (out / "_.._escape/seed0" / grid.DONE_FILE).is_file() and (out / "a_b/seed0" / grid.DONE_FILE).is_file()
    assert "| ../escape (n=1) |" in (out / "results.md").read_text()


# ------------------------------------------------------------------------------------------------ one line, exit 2


@pytest.mark.parametrize("flag, value, says", [
    ("--prompts-per-step", "0", "--prompts-per-step: must be >= 1, got 0"),
    ("--eval-every", "-1", "--eval-every: must be >= 0, got -1"),
])
def test_a_bad_budget_flag_is_one_line_before_the_base_model_builds(flag: str, value: str, says: str, tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    from ictrl.experiments.tasks import tinymodel

    def no_build(*args: object, **kwargs: object) -> None:
        raise AssertionError("the base model was built")

    monkeypatch.setattr(tinymodel, "build_tiny_base", no_build)
    code, lines = compare_main(tmp_path / "cmp", "ict", capsys, "--quick", flag, value)
    assert code == 2 and lines == [f"ictrl compare: error: {says}"], lines
    assert not (tmp_path / "cmp").exists()


def test_a_full_disk_while_the_report_is_written_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    import errno

    runner = CountingRunner()
    fake_experiment(monkeypatch, runner)
    real = compare.atomic_write_text

    def full(path: Path, text: str) -> Path:
        if Path(path).name == "results.md":
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        return real(path, text)

    monkeypatch.setattr(compare, "atomic_write_text", full)
    out = tmp_path / "cmp"
    code, lines = compare_main(out, "ict,random10", capsys)
    assert code == 2 and len(lines) == 1, lines
    assert lines[0].startswith(f"ictrl compare: error: cannot write {out / 'results.md'}: No space left on device (")
    assert "the finished runs are kept; free space and rerun the same command to write the report" in lines[0]
    assert (out / "ict/seed0" / grid.DONE_FILE).is_file() and (out / "random10/seed0" / grid.DONE_FILE).is_file()
    monkeypatch.setattr(compare, "atomic_write_text", real)
    assert compare_main(out, "ict,random10", capsys) == (0, [])  # the rerun writes the report, training nothing
    assert len(runner.calls) == 2 and (out / "results.md").is_file()


def test_an_unfinished_run_of_an_edited_rule_starts_over(h2rule: Path, monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    """A run stopped before its done.json (``--config`` runs resume from their checkpoints) whose rule changed since:
    the rerun clears its folder rather than going on from the old rule's checkpoints; an unchanged one is left to
    resume."""
    seen: list[list[str]] = []

    class Resuming(CountingRunner):
        def __call__(self, spec: grid.RunSpec, run_dir: Path) -> dict:
            seen.append(sorted(p.name for p in run_dir.iterdir()))
            (run_dir / "checkpoint-1").mkdir(exist_ok=True)
            return super().__call__(spec, run_dir)

    runner = Resuming(crash_on=grid.RunSpec("top_h2", 0))
    fake_experiment(monkeypatch, runner)
    out = h2rule / "cmp"
    from ictrl.cli import main

    with pytest.raises(RuntimeError, match="simulated crash"):
        main(["compare", "--methods", "h2rule:top_h2", "--seeds", "1", "--output-dir", str(out)])
    assert seen == [[grid.RULE_FILE]]  # the rule is recorded before the run trains
    runner.crash_on = None
    assert compare_main(out, "h2rule:top_h2", capsys) == (0, [])  # unchanged: resumes where it stopped
    assert seen[1] == sorted([grid.RULE_FILE, "checkpoint-1", "metrics.jsonl"])
    (out / "top_h2/seed0" / grid.DONE_FILE).unlink()
    rule = h2rule / "h2rule.py"
    rule.write_text(rule.read_text() + "\n# edited\n")
    assert compare_main(out, "h2rule:top_h2", capsys) == (0, [])
    assert seen[2] == [grid.RULE_FILE]  # another rule: started over, no checkpoint of the old one left
