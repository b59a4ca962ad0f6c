import json
import math
import shutil
import statistics
from pathlib import Path
from typing import Any

import pytest

from ictrl.cli import main
from ictrl.eval.harness import RESULTS_JSON
from ictrl.eval.table import TABLE_HTML, TABLE_JSON, TABLE_MD, TableError, build_table, find_results, load_run

# Student t quantiles t_{0.975, df}, from tables (independent of scipy)
T975 = {1: 12.706204736174707, 2: 4.302652729911275, 3: 3.182446305284263}
GEN = {"max_new_tokens": 8, "temperature": 0.6, "top_p": 0.95}


def write_result(root: Path, method: str | None, seed: int | None, scores: dict[str, tuple[float, float]],
                 num: int = 10, gen: dict | None = None) -> Path:
    """A results.json as `ictrl eval` writes it (only the fields the table reads)."""
    benchmarks = {b: {"num_problems": num, "generation": gen or GEN,
                      "pass_at_k": {"1": {"mean": p1}, "4": {"mean": p4}}} for b, (p1, p4) in scores.items()}
    settings = {"model": "m", "method": method, "train_seed": seed, "generation": {b: gen or GEN for b in scores}}
    out = root / f"{method}-{seed}"
    out.mkdir(parents=True)
    (out / RESULTS_JSON).write_text(json.dumps({"summary": {"settings": settings, "benchmarks": benchmarks}}))
    return out


SCORES = {  # (method, seed) -> {benchmark: (P@1, P@4)}
    ("grpo", 0): {"a": (0.10, 0.30), "b": (0.20, 0.50)},
    ("grpo", 1): {"a": (0.12, 0.28), "b": (0.26, 0.40)},
    ("grpo", 2): {"a": (0.30, 0.60), "b": (0.10, 0.20)},  # no ict run with seed 2: unpaired
    ("ict", 0): {"a": (0.15, 0.35), "b": (0.25, 0.45)},
    ("ict", 1): {"a": (0.20, 0.30), "b": (0.22, 0.60)},
    ("base", None): {"a": (0.05, 0.10), "b": (0.08, 0.20)},
}


def total(scores: dict[str, tuple[float, float]]) -> float:
    avg1 = statistics.fmean(v[0] for v in scores.values())
    avg4 = statistics.fmean(v[1] for v in scores.values())
    return (avg1 + avg4) / 2


def test_table_statistics_match_a_naive_reference(tmp_path: Path) -> None:
    for (method, seed), scores in SCORES.items():
        write_result(tmp_path, method, seed, scores)
    runs = [load_run(p) for p in find_results([tmp_path])]
    table = build_table(runs)
    assert [m["method"] for m in table["methods"]] == ["base", "grpo", "ict"]
    keys = [c["key"] for c in table["columns"]]
    assert keys == ["a/P@1", "a/P@4", "b/P@1", "b/P@4", "avg/P@1", "avg/P@4", "total"]

    grpo = next(m for m in table["methods"] if m["method"] == "grpo")
    assert grpo["seeds"] == [0, 1, 2]
    totals = [total(SCORES[("grpo", s)]) for s in (0, 1, 2)]
    assert grpo["mean"][-1] == pytest.approx(statistics.fmean(totals), abs=1e-12)
    assert grpo["std"][-1] == pytest.approx(statistics.stdev(totals), abs=1e-12)
    avg4 = [statistics.fmean(v[1] for v in SCORES[("grpo", s)].values()) for s in (0, 1, 2)]
    assert grpo["mean"][keys.index("avg/P@4")] == pytest.approx(statistics.fmean(avg4), abs=1e-12)
    base = table["methods"][0]
    assert base["seeds"] == [None] and math.isnan(base["std"][0])

    diffs = {d["baseline"]: d for d in table["differences"]}
    # ict vs grpo: paired on seeds 0 and 1 (grpo's seed 2 has no partner)
    d = diffs["grpo"]
    assert d["seeds"] == [0, 1]
    paired = [total(SCORES[("ict", s)]) - total(SCORES[("grpo", s)]) for s in (0, 1)]
    mean, sd = statistics.fmean(paired), statistics.stdev(paired)
    assert d["mean"][-1] == pytest.approx(mean, abs=1e-12)
    assert d["ci_low"][-1] == pytest.approx(mean - T975[1] * sd / math.sqrt(2), abs=1e-9)
    assert d["ci_high"][-1] == pytest.approx(mean + T975[1] * sd / math.sqrt(2), abs=1e-9)
    # ict vs base: the single untrained run pairs with every ict seed
    d = diffs["base"]
    assert d["seeds"] == [0, 1]
    paired = [SCORES[("ict", s)]["a"][0] - SCORES[("base", None)]["a"][0] for s in (0, 1)]
    assert d["mean"][0] == pytest.approx(statistics.fmean(paired), abs=1e-12)
    half = T975[1] * statistics.stdev(paired) / math.sqrt(2)
    assert [d["ci_low"][0], d["ci_high"][0]] == pytest.approx([statistics.fmean(paired) - half,
                                                               statistics.fmean(paired) + half], abs=1e-9)

    # three pairs and another level: df = 2 and the 90% quantile
    table90 = build_table(runs, target="grpo", methods=["ict", "grpo"], ci=0.9)
    d = table90["differences"][0]
    assert d["baseline"] == "ict" and d["seeds"] == [0, 1]
    from scipy import stats

    paired = [total(SCORES[("grpo", s)]) - total(SCORES[("ict", s)]) for s in (0, 1)]
    half = stats.t.ppf(0.95, 1) * statistics.stdev(paired) / math.sqrt(2)
    assert d["ci_high"][-1] - d["mean"][-1] == pytest.approx(half, abs=1e-12)


def test_one_pair_has_no_interval_and_one_seed_no_std(tmp_path: Path) -> None:
    write_result(tmp_path, "grpo", 0, SCORES[("grpo", 0)])
    write_result(tmp_path, "ict", 0, SCORES[("ict", 0)])
    write_result(tmp_path, "stapo", 5, SCORES[("ict", 1)])
    table = build_table([load_run(p) for p in find_results([tmp_path])])
    d = {x["baseline"]: x for x in table["differences"]}
    assert d["grpo"]["seeds"] == [0] and math.isnan(d["grpo"]["ci_low"][0])
    assert d["stapo"]["seeds"] == []
    from ictrl.eval.table import format_html, table_markdown

    md = table_markdown(table)
    assert "| ict − stapo | 0 | no shared training seed |" in md
    assert "| ict − grpo | 1 | +5.00 |" in md  # a/P@1: 0.15 − 0.10, no interval from one pair
    assert " ± " not in md.split("\n\n")[1]  # one seed per method: no spread
    assert "<th colspan=\"2\">a</th>" in format_html(table)


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        ("dup", "method 'ict' with train seed 0 is also in"),
        ("missing_bench", "no benchmark 'b'"),
        ("num_problems", "benchmarks.a.num_problems is 7"),
        ("generation", "generation settings of a"),
        ("no_method", "settings.method is not set; set summary.settings.method in this file"),
        ("bad_json", "cannot read"),
    ],
)
def test_bad_runs_are_named(tmp_path: Path, edit: str, message: str) -> None:
    write_result(tmp_path / "x", "ict", 0, SCORES[("ict", 0)])
    other = dict(SCORES[("grpo", 0)])
    kwargs: dict = {}
    method, seed = "grpo", 0
    if edit == "dup":
        method = "ict"
    elif edit == "missing_bench":
        other.pop("b")
    elif edit == "num_problems":
        kwargs["num"] = 7
    elif edit == "generation":
        kwargs["gen"] = {**GEN, "max_new_tokens": 4096}
    elif edit == "no_method":
        method = None
    path = write_result(tmp_path / "y", method, seed, other, **kwargs)
    if edit == "bad_json":
        (path / RESULTS_JSON).write_text("{")
    with pytest.raises(TableError, match=message) as info:
        build_table([load_run(p) for p in find_results([tmp_path / "x", tmp_path / "y"])])
    if edit != "dup":
        assert str(path / RESULTS_JSON) in str(info.value)


def test_cli_error_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["table", str(tmp_path / "nowhere")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("ictrl table: error:") and "nowhere" in err[0]


@pytest.mark.integration
def test_table_from_real_eval_outputs_of_tiny_models(tmp_path: Path, shared_data: Path, digits_only: Any,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """2 methods x 2 training seeds: tiny models saved where `ictrl train` saves them, evaluated by `ictrl eval`
    (ten real GSM8K problems + ten one-digit problems), then tabulated. The models' generation config allows
    only digits and EOS, so one-token answers are right about one time in ten and the scores differ by seed."""
    from ictrl.models import save_tiny_model

    digits = tmp_path / "digits.jsonl"
    digits.write_text("".join(json.dumps({"question": f"What is {i}+0?", "answer": f"#### {i}"}) + "\n"
                              for i in range(10)))
    benchmarks = ["gsm8k", f"jsonl:{digits}:kind=gsm8k"]
    eval_dirs = []
    for i, (method, seed) in enumerate([("grpo", 0), ("grpo", 1), ("ict", 0), ("ict", 1)]):
        run = tmp_path / "runs" / f"{method}-s{seed}"
        save_tiny_model(run / "final", seed=i)
        digits_only(run / "final")
        # what `ictrl train` leaves beside final/: run.json with the resolved method label and seed
        (run / "run.json").write_text(json.dumps({"method": method, "token_selector": method, "seed": seed}))
        out = tmp_path / "eval" / f"{method}-s{seed}"
        assert main(["eval", "--model", str(run / "final"), "--benchmarks", *benchmarks, "--limit", "10",
                     "--n", "8", "--k", "1", "4", "--max-new-tokens", "1", "--temperature", "1.0", "--top-p", "1.0",
                     "--output-dir", str(out), "--no-progress"]) == 0
        eval_dirs.append(out)
    capsys.readouterr()

    table_dir = tmp_path / "table"
    assert main(["table", *map(str, eval_dirs), "--output-dir", str(table_dir)]) == 0
    printed = capsys.readouterr().out
    md = (table_dir / TABLE_MD).read_text()
    assert printed == md
    saved = json.loads((table_dir / TABLE_JSON).read_text())
    assert "<table>" in (table_dir / TABLE_HTML).read_text()
    assert [m["method"] for m in saved["methods"]] == ["grpo", "ict"]
    assert saved["methods"][0]["seeds"] == [0, 1] and saved["methods"][1]["seeds"] == [0, 1]

    # every cell recomputed from the per-run results.json files
    results = {d.name: json.loads((d / RESULTS_JSON).read_text())["summary"] for d in eval_dirs}
    assert results["ict-s1"]["benchmarks"]["gsm8k"]["num_problems"] == 10
    def run_total(name: str) -> float:
        return results[name]["total"]["mean"]  # the eval's own Total over the same two benchmarks
    for m, method in enumerate(("grpo", "ict")):
        totals = [run_total(f"{method}-s{s}") for s in (0, 1)]
        assert saved["methods"][m]["mean"][-1] == pytest.approx(statistics.fmean(totals), abs=1e-12)
        assert saved["methods"][m]["std"][-1] == pytest.approx(statistics.stdev(totals), abs=1e-12)
    paired = [run_total(f"ict-s{s}") - run_total(f"grpo-s{s}") for s in (0, 1)]
    diff = saved["differences"][0]
    assert diff["baseline"] == "grpo" and diff["seeds"] == [0, 1]
    assert diff["mean"][-1] == pytest.approx(statistics.fmean(paired), abs=1e-12)
    assert diff["ci_high"][-1] - diff["mean"][-1] == pytest.approx(
        T975[1] * statistics.stdev(paired) / math.sqrt(2), abs=1e-9)
    assert any(v > 0 for m in saved["methods"] for v in m["mean"])  # the digit problems are sometimes solved
    assert "| ict − grpo | 2 |" in md and "| grpo | 2 |" in md

    # a rerun of one eval directory under another label is refused as a duplicate run
    shutil.copytree(eval_dirs[0], tmp_path / "copy")
    assert main(["table", *map(str, eval_dirs), str(tmp_path / "copy")]) == 2
    assert "method 'grpo' with train seed 0 is also in" in capsys.readouterr().err


def test_unlabelled_run_is_refused_in_one_line_and_the_named_fix_works(tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    write_result(tmp_path, "ict", 0, SCORES[("ict", 0)])
    path = write_result(tmp_path, None, 0, SCORES[("grpo", 0)]) / RESULTS_JSON
    assert main(["table", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(path) in err[0] and "set summary.settings.method in this file" in err[0]
    data = json.loads(path.read_text())
    data["summary"]["settings"]["method"] = "grpo"  # the fix the line names
    path.write_text(json.dumps(data))
    assert main(["table", str(tmp_path)]) == 0
    assert "grpo" in capsys.readouterr().out


def test_a_table_file_ictrl_did_not_write_is_never_replaced(tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    run = write_result(tmp_path / "runs", "grpo", 0, SCORES[("grpo", 0)])
    out = tmp_path / "table"
    assert main(["table", str(run), "--output-dir", str(out)]) == 0
    assert main(["table", str(run), "--output-dir", str(out)]) == 0  # its own files, listed
    (out / ".ictrl-files.json").unlink()  # written by an earlier ictrl, before the list: known by its table.json
    assert main(["table", str(run), "--output-dir", str(out)]) == 0
    capsys.readouterr()
    (out / TABLE_JSON).write_text('{"mine": 1}')
    (out / ".ictrl-files.json").unlink()
    before = (out / TABLE_MD).read_bytes()
    assert main(["table", str(run), "--output-dir", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines() == [f"ictrl table: error: --output-dir: {out / TABLE_MD} (and {TABLE_JSON}, "
                                        f"{TABLE_HTML}) was not written by ictrl and the command would replace it; "
                                        "choose another output directory or move the file away"]
    assert (out / TABLE_MD).read_bytes() == before and (out / TABLE_JSON).read_text() == '{"mine": 1}'
