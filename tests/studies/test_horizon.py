"""python -m studies compare --horizon: the collapse / explosion / stop rules on synthetic logs, the tuned settings table,
and the protocol end to end with resume (--quick)."""

from __future__ import annotations

import json
import math
import runpy
import sys
from pathlib import Path

import pytest

from studies.protocols import horizon as hz

ROOT = Path(__file__).resolve().parents[2]
STUDIES = ROOT / "studies" / "horizon"  # the project's own settings, data beside the package
SETTINGS = {p.stem: hz.load_setting(str(p), need_tuned=False) for p in sorted(STUDIES.glob("*.json"))}
TUNED_HERE = ("paths-tuned", "paths-hard")  # settings whose own tuned protocol chooses their learning rates


def log(h1: list[float], reward: list[float] | None = None) -> list[dict[str, float]]:
    reward = reward if reward is not None else [0.5] * len(h1)
    return [{"step": i + 1, hz.H1_KEY: h, "reward": r, "loss": 0.0} for i, (h, r) in enumerate(zip(h1, reward))]


def test_start_is_the_mean_of_the_first_steps_and_rolling_the_trailing_window() -> None:
    records = log([1.0, 2.0, 3.0, 4.0, 5.0] + [0.0] * 10)
    assert hz.start_value(records) == pytest.approx(3.0)
    assert math.isnan(hz.start_value(records[:4]))  # too few steps: no start
    roll = dict(hz.rolling(records, hz.H1_KEY))
    assert min(roll) == hz.WINDOW  # defined from the WINDOW-th step
    assert roll[10] == pytest.approx(15.0 / 10) and roll[15] == 0.0


def test_collapse_is_the_first_step_the_rolling_h1_reaches_the_fraction() -> None:
    h1 = [1.0] * 20 + [0.1] * 30  # rolling mean <= 0.2 once 9 of the 10 are 0.1: 0.1*9 + 1.0 = 1.9/10 = 0.19
    assert hz.collapse_step(log(h1)) == 29
    assert hz.collapse_step(log([1.0] * 50)) is None
    # a record without the key (an eval-only row) is skipped, not read as 0
    records = log(h1)
    records.insert(3, {"step": 4, "eval/avg/pass@1": 0.3})
    assert hz.collapse_step(records) == 29


def test_explosion_needs_high_entropy_and_falling_reward() -> None:
    h1 = [1.0] * 10 + [3.0] * 40
    assert hz.explosion_step(log(h1)) is None  # reward flat: not an explosion
    reward = [0.5] * 10 + [0.1] * 40
    assert hz.explosion_step(log(h1, reward)) == 15  # rolling H1 (5x1 + 5x3)/10 = 2.0 >= 2 x 1.0 at step 15
    assert hz.explosion_step(log([1.0] * 12), diverged=True) == 12  # non-finite weights: at its last step


def test_stop_rule_waits_for_min_steps_and_the_fall() -> None:
    h1 = [1.0] * 10 + [0.1] * 90
    assert hz.stop_step(log(h1), min_steps=50) == 50  # fell long before: stops at the minimum
    assert hz.stop_step(log(h1), min_steps=5) == 19  # rolling (1 + 9 x 0.1) / 10 = 0.19 <= 0.2
    assert hz.stop_step(log([1.0] * 100), min_steps=50) is None
    assert hz.horizon([400, 420, 400]) == 420
    with pytest.raises(ValueError):
        hz.horizon([])


def test_the_projects_settings_are_the_ones_its_studies_ran() -> None:
    assert set(SETTINGS) == {"tinyarith", "countdown", "countdown-lesstrained", "paths", *TUNED_HERE}
    for name, setting in SETTINGS.items():
        assert setting.seeds == (2000, 2001, 2002, 2003, 2004)
        assert set(setting.tuned) == set(hz.METHODS) or (name in TUNED_HERE and not setting.tuned)
    assert SETTINGS["tinyarith"].tuned["ict"] == (1e-4, "per_response_all")  # docs/results/tune-tinyarith-2026-11-23.md
    assert SETTINGS["countdown"].tuned["random10"] == (1e-4, "per_response_all")  # tune-countdown-2026-11-23.md
    assert SETTINGS["paths"].tuned == SETTINGS["countdown"].tuned  # paths ran at countdown's tuned settings
    assert str(hz.COLLAPSE_FRACTION) in hz.DEFINITIONS and str(hz.MIN_STEPS) in hz.DEFINITIONS


def test_each_setting_warm_starts_its_own_base_on_its_task() -> None:
    from ictrl.experiments import demo
    from studies.horizoncli import base_recipe
    from ictrl.experiments.tasks.tinymodel import TinyRecipe
    from studies.tasks import paths

    full = {name: TinyRecipe(**base_recipe(s, False)) for name, s in SETTINGS.items()}
    assert full["paths-tuned"] == full["paths"]  # the same base, its methods tuned on it
    assert len({r.key() for r in full.values()}) == len(full) - 1  # otherwise one cached base per setting
    assert full["paths-hard"].difficulty == (7, 8) and full["paths-hard"].target_dev < full["paths"].target_dev
    for name, setting in SETTINGS.items():
        quick = TinyRecipe(**base_recipe(setting, True))
        assert full[name].task == quick.task == setting.task
        assert quick.max_steps == demo.QUICK_RECIPE["max_steps"]  # --quick keeps its own budget
    assert full["paths"].difficulty == paths.DEFAULT_DIFFICULTY and full["paths"].order_error == 0.5
    assert full["countdown-lesstrained"].max_steps == 1500 < full["countdown"].max_steps
    from ictrl.experiments.tasks.registry import task_recipe

    # `ictrl tiny-model --task studies.tasks.paths` exports it
    assert task_recipe("studies.tasks.paths") == base_recipe(SETTINGS["paths"], False)


def write_setting(tmp_path: Path, **changes: object) -> str:
    data = {**json.loads((STUDIES / "paths.json").read_text()), **changes}
    path = tmp_path / "mine.json"
    path.write_text(json.dumps({k: v for k, v in data.items() if v is not None}))
    return str(path)


@pytest.mark.parametrize("changes,message", [
    ({"task": "chess"}, "field 'task': unknown task 'chess'; choose tinyarith or an importable task module"),
    ({"task": "studies.tasks.chess"}, "field 'task': unknown task .* No module named 'studies.tasks.chess'"),
    ({"task": 3}, "field 'task': expected a task name or module path, got 3"),
    ({"seeds": None}, "missing field 'seeds'"),
    ({"colour": "red"}, "unknown field 'colour'"),
    ({"seeds": [1, 1]}, "field 'seeds': expected two or more distinct integers"),
    ({"tuned": {"ict": [1e-4, None]}}, "field 'tuned': needs exactly the methods"),
    ({"recipe": {"hidden": 3}}, "field 'recipe': 'hidden' is not a TinyRecipe field"),
])
def test_a_bad_setting_file_is_one_line_naming_the_field(tmp_path: Path, changes: dict, message: str) -> None:
    from ictrl.errors import UserError

    path = write_setting(tmp_path, **changes)
    with pytest.raises(UserError, match=f"^{path}: {message}"):
        hz.load_setting(path)
    tuned = {**SETTINGS["paths"].tuned, "ict": [-1, None]}
    with pytest.raises(UserError, match=r"field 'tuned.ict': expected \[lr > 0"):
        hz.load_setting(write_setting(tmp_path, tuned={m: list(v) for m, v in tuned.items()}))
    assert hz.load_setting(write_setting(tmp_path)).name == "mine"


def test_a_setting_is_found_by_name_from_any_directory(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from ictrl.errors import UserError

    monkeypatch.chdir(tmp_path)
    assert hz.load_setting("paths") == SETTINGS["paths"]  # studies/horizon/ beside the code, not the cwd's
    with pytest.raises(UserError, match=r"--horizon pathz: no setting file .*studies/horizon/pathz\.json "
                                        r"\(settings in .*: countdown, .*paths, "):
        hz.load_setting("pathz")


def test_renyi2_control_needs_h1_lowered_and_h2_held() -> None:
    def run(h1: list[float], h2: list[float]) -> dict:
        return hz.renyi2_control([{**r, hz.H2_KEY: v} for r, v in zip(log(h1), h2)])

    h1 = [1.0] * 10 + [0.5] * 20
    held = run(h1, [0.8] * 10 + [0.6] * 20)
    assert held["controls"] and held["h1_end_ratio"] == pytest.approx(0.5) and held["h2_min_ratio"] == pytest.approx(0.75)
    dropped = run(h1, [0.8] * 10 + [0.3] * 20)  # rolling H2 reaches 0.3 / 0.8 = 0.375 < 0.5
    assert dropped["h1_lowered"] and not dropped["h2_held"] and not dropped["controls"]
    assert dropped["h2_min_ratio"] == pytest.approx(0.375)
    flat = run([1.0] * 30, [0.8] * 30)  # nothing lowered: H2 kept trivially, not control
    assert flat["h2_held"] and not flat["h1_lowered"] and not flat["controls"]
    edge = run([1.0] * 10 + [0.9] * 20, [0.8] * 10 + [0.4] * 20)  # exactly at both thresholds: counts
    assert edge["controls"]
    assert run([1.0] * 4, [0.8] * 4)["controls"] is None  # too few steps for a start


def summary(collapse: list[int | None], p16: list[float], explosion: list[int | None] | None = None) -> list[dict]:
    explosion = explosion or [None] * len(collapse)
    return [{"collapse": c, "explosion": e, "p1": 0.1, "p16": p} for c, e, p in zip(collapse, explosion, p16)]


def test_verdict_follows_the_stated_rule() -> None:
    from studies.reports.horizon_report import event_text, verdict

    collapsed = summary([100, 120, 110], [0.5, 0.52, 0.51])
    kept = summary([None, None, 300], [0.6, 0.62, 0.61])
    summ = {"grpo": collapsed, "ict": kept, "random10": collapsed}
    assert verdict(summ, 400).startswith("Supported here") and "JS score matters" in verdict(summ, 400)
    assert "sparsity" in verdict({**summ, "random10": kept}, 400)
    assert "the learning rate explains it" in verdict(summ, 400, {"ict": (2e-4, "a"), "random10": (1e-4, "a")})
    assert verdict({**summ, "ict": collapsed}, 400).startswith("Not supported here: ICT collapsed too")
    worse = summary([None] * 3, [0.2, 0.21, 0.22])
    assert "below GRPO's" in verdict({**summ, "ict": worse}, 400)
    assert "cannot show" in verdict({**summ, "grpo": kept}, 400)
    assert event_text([None, None], 400) == "none within 400 steps (0/2 seeds)"
    assert event_text([100, None], 400).startswith("1/2 seeds, step 100")


def test_beats_reads_the_welch_interval_of_ict_minus_each_method() -> None:
    from studies.reports.horizon_report import beats

    def runs(p4: list[float], p16: list[float]) -> list[dict]:
        return [{"p4": a, "p16": b} for a, b in zip(p4, p16)]

    summ = {"grpo": runs([0.50, 0.52, 0.51], [0.80, 0.82, 0.81]), "ict": runs([0.60, 0.62, 0.61], [0.80, 0.83, 0.80]),
            "random10": runs([0.70, 0.72, 0.71], [0.81, 0.80, 0.82])}
    text = beats(summ)
    assert "pass@4: ICT beats grpo (+10.00 [" in text and "trails random10 (-10.00 [" in text
    assert "pass@16: ICT is level with grpo" in text and "is level with random10" in text and "ICT beats ict" not in text
    assert text.startswith("At each method's tuned setting, on final")
    assert beats(summ, "on countdown").startswith(
        "At each method's tuned setting (tuned on countdown, not on this task)")


def test_a_setting_tuned_on_another_task_says_so() -> None:
    from types import SimpleNamespace

    from studies.reports.horizon_report import tuned_elsewhere

    def setting(task: str, source: str) -> SimpleNamespace:
        return SimpleNamespace(task=task, tuned_source=source)

    countdown, hard = "docs/results/tune-countdown-2026-11-23.md, table", "docs/results/tune-paths-hard-2026-11-26.md"
    assert tuned_elsewhere("paths", setting("studies.tasks.paths", countdown)) == "on countdown"
    assert tuned_elsewhere("countdown-lesstrained", setting("studies.tasks.countdown", countdown)) is None
    assert tuned_elsewhere("countdown-lesstrained", setting("studies.tasks:countdown", countdown)) is None
    assert tuned_elsewhere("paths-hard", setting("studies.tasks.paths", "own protocol, " + hard)) is None
    assert tuned_elsewhere("mine", setting("studies.tasks.paths", "")) is None


def test_renyi2_verdict_follows_the_stated_rule() -> None:
    from studies.reports.horizon_report import renyi2_verdict

    def runs(*controls: bool) -> list[dict]:
        return [{"renyi2": {"controls": c, "h1_lowered": c, "h2_held": True}} for c in controls]

    summ = {"grpo": runs(False, False, True), "ict": runs(True, True, False), "random10": runs(False, False, False)}
    assert renyi2_verdict(summ).startswith("Rényi-2 half: supported here") and "JS score matters" in renyi2_verdict(summ)
    assert "sparsity" in renyi2_verdict({**summ, "random10": runs(True, True, True)})
    unequal = renyi2_verdict(summ, {"ict": (1e-4, "default"), "random10": (2e-4, "default")})
    assert "JS score matters" not in unequal and "random10 ran at lr 0.0002 and ICT at 0.0001" in unequal
    assert "JS score matters" in renyi2_verdict(summ, {"ict": (2e-4, "default"), "random10": (2e-4, "x")})
    assert renyi2_verdict({**summ, "ict": runs(False, False, True)}).startswith("Rényi-2 half: not supported here")
    assert "cannot separate" in renyi2_verdict({**summ, "grpo": runs(True, True, True)})


def test_horizon_quick_end_to_end_and_resume(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import argparse

    from studies import compare
    from ictrl.experiments.grid import runner as grid
    from ictrl.experiments.grid import tinyrun

    monkeypatch.setenv("ICTRL_CACHE_DIR", str(tmp_path.parent / "ictrl_quick_cache"))  # shared with test_compare
    out = tmp_path / "hz"
    argv = ["--horizon", str(STUDIES / "tinyarith.json"), "--quick", "--output-dir", str(out)]

    def parse(args: list[str]) -> argparse.Namespace:
        parser = argparse.ArgumentParser()
        compare.add_arguments(parser)
        return parser.parse_args(args)

    assert compare.run(parse(argv)) == 0
    info = json.loads((out / "horizon.json").read_text())
    assert info["steps"] == 6 and set(info["grpo_stop_steps"].values()) == {6}  # the rule cannot fire in 6 steps
    result = json.loads((out / "runs" / "lr0.0001" / "ict-per_response_all" / "seed0" / grid.DONE_FILE).read_text())
    assert 0 <= result["p1"] <= result["p4"] <= result["p16"] <= 1 and result["steps"] == 6
    records = [json.loads(x) for x in (out / "runs" / "lr0.0001" / "ict-per_response_all" / "seed0" /
                                       "metrics.jsonl").read_text().splitlines()]
    assert any("eval/avg/pass@16" in r for r in records)  # pass@16 along the way
    assert all(k in records[0] for k in ("ictrl/h1/all", "ictrl/h2/selected", "ictrl/purity/selected"))
    text = (out / "results.md").read_text()
    assert text.startswith("QUICK RUN") and hz.DEFINITIONS in text and hz.RENYI2_DEFINITION in text
    assert "Rényi-2 half:" in text and "| method | H1 all | H2 all | purity all | H1 sel | H2 sel | purity sel |" in text
    assert "none within 6 steps" in text
    assert "pass@16 − pass@1 during training" in text and "| step 2 | step 4 | step 6 |" in text

    # The kept compact metrics re-render the same report without the run directories.
    from studies.reports import horizon_report

    kept = tmp_path / "kept.json.gz"
    kept.write_bytes((out / horizon_report.COMPACT).read_bytes())
    assert horizon_report.main([str(kept), str(tmp_path / "again")]) == 0
    assert (tmp_path / "again" / "results.md").read_text() == text

    # Resume: nothing trains again; a lost done marker reruns that run alone.
    calls: list[str] = []
    real = tinyrun.train_tiny

    def counting(settings, base, spec, run_dir, callbacks=()):  # type: ignore[no-untyped-def]
        calls.append(spec.relpath)
        return real(settings, base, spec, run_dir, callbacks)

    monkeypatch.setattr(tinyrun, "train_tiny", counting)
    assert compare.run(parse(argv)) == 0 and calls == []
    lost = out / "runs" / "lr0.0002" / "random10" / "seed1" / grid.DONE_FILE
    lost.unlink()
    assert compare.run(parse(argv)) == 0 and calls == ["lr0.0002/random10/seed1"]

    # The lr control beside the finished study: random10 at ICT's lr on the study's seeds and N, against ICT.
    calls.clear()
    control = tmp_path / "control"
    monkeypatch.setattr(sys, "argv", ["horizon_control.py", str(STUDIES / "tinyarith.json"), "--study", str(out), "--method", "random10",
                                      "--lr", "1e-4", "--norm", "per_response_all", "--quick", "--out", str(control)])
    runpy.run_path(str(ROOT / "studies" / "horizon_control.py"), run_name="__main__")
    assert calls == ["lr0.0001/random10-per_response_all/seed0", "lr0.0001/random10-per_response_all/seed1"]
    table = (control / "control.md").read_text()
    assert "random10 at lr 0.0001 (per_response_all)" in table and "| P@16 |" in table and "6 steps" in table


def test_tune_with_a_setting_tunes_on_the_base_its_long_runs_start_from(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    import argparse

    from ictrl.errors import UserError
    from studies import compare
    from studies.horizoncli import base_recipe
    from ictrl.experiments.tasks import tinymodel

    class Built(Exception):
        pass

    def build(recipe: tinymodel.TinyRecipe, log: object = print) -> None:
        raise Built(recipe)

    monkeypatch.setattr(tinymodel, "build_tiny_base", build)
    path = write_setting(tmp_path, recipe={"difficulty": [7, 8], "train_problems": 900}, tuned=None)
    with pytest.raises(UserError, match="missing field 'tuned'"):
        hz.load_setting(path)  # --horizon needs the tuned learning rates
    setting = hz.load_setting(path, need_tuned=False)
    parser = argparse.ArgumentParser()
    compare.add_arguments(parser)
    with pytest.raises(Built) as built:
        compare.run(parser.parse_args(["--tune", "--setting", path, "--output-dir", str(tmp_path / "t")]))
    recipe = built.value.args[0]
    assert recipe == tinymodel.TinyRecipe(**base_recipe(setting, False)) and recipe.difficulty == (7, 8)


def test_the_tuned_study_script_passes_each_settings_tune_options_to_the_tuned_protocol() -> None:
    import argparse

    from studies import compare, tunecli
    from studies.protocols import tune

    study = runpy.run_path(str(STUDIES / "tuned.py"))
    parser = argparse.ArgumentParser()
    compare.add_arguments(parser)
    for name in TUNED_HERE:
        setting = SETTINGS[name]
        args = parser.parse_args(["--tune", "--setting", name, *study["tune_flags"](setting.tune)])
        protocol = tunecli.protocol_from_args(args)
        assert set(protocol.variants) == set(hz.METHODS) and protocol.tune_seeds >= 2
        tuning_seeds = range(tune.TUNE_SEED_START, tune.TUNE_SEED_START + protocol.tune_seeds)
        assert not set(tuning_seeds) & set(setting.seeds)  # the long runs' seeds are fresh
        assert (args.steps, args.prompts_per_step, args.selection_warmup) == (20, hz.PROMPTS_PER_STEP,
                                                                              hz.SELECTION_WARMUP)
    choices = {"chosen": {m: {"lr": 1e-4 * (i + 1), "norm": None if i % 2 else "per_response_all"}
                          for i, m in enumerate(hz.METHODS)}}
    tuned = study["chosen_tuned"](choices, list(hz.METHODS))
    assert tuned["ict"] == [choices["chosen"]["ict"]["lr"], choices["chosen"]["ict"]["norm"]]
    assert set(tuned) == set(hz.METHODS)


def test_the_tuned_study_script_runs_from_the_file_or_with_own_choices_from_a_copy(tmp_path: Path) -> None:
    study = runpy.run_path(str(STUDIES / "tuned.py"))
    horizon_setting = study["horizon_setting"]
    project = json.loads((STUDIES / "paths-tuned.json").read_text())
    path, runs = tmp_path / "paths-tuned.json", tmp_path / "runs"
    runs.mkdir()
    path.write_text(json.dumps(project))
    other = {**project["tuned"], "random10": [project["tuned"]["random10"][0], "per_response_all"]}
    assert other != project["tuned"]

    assert horizon_setting(path, project, project["tuned"], runs, False) == path  # the file's own choices
    with pytest.raises(SystemExit, match=r"paths-tuned\.json: its 'tuned' field .* --own-choices") as stop:
        horizon_setting(path, project, other, runs, False)
    assert "\n" not in str(stop.value) and not list(runs.iterdir())

    own = horizon_setting(path, project, other, runs, True)
    assert own == runs / "paths-tuned.json" and json.loads(path.read_text()) == project  # the project's file stays
    loaded = hz.load_setting(str(own))
    assert loaded.tuned["random10"] == (other["random10"][0], "per_response_all")
    assert loaded.tuned["ict"] == tuple(project["tuned"]["ict"]) and "--own-choices" in loaded.tuned_source

    untuned = {k: v for k, v in project.items() if k not in ("tuned", "tuned_source")}
    assert horizon_setting(path, untuned, other, runs, False) == path  # no 'tuned' field: this tune's is written
    assert hz.load_setting(str(path)).tuned["random10"] == (other["random10"][0], "per_response_all")
