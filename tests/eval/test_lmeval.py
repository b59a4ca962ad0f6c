"""``ictrl eval``'s lm-evaluation-harness layout: its values against a float64 reference, its files read by the
harness's own readers, and ``ictrl table`` reading it as it reads ``results.json``.

The readers exercised (lm-evaluation-harness 0.4.13):

- ``lm_eval.utils.make_table(result_dict)``: the table ``lm_eval`` prints, from ``results[task]["metric,filter"]``
  and ``"metric_stderr,filter"``, ``versions``, ``n-shot``, ``higher_is_better`` and ``group_subtasks``;
- ``lm_eval.utils.get_results_filenames`` / ``get_sample_results_filenames`` / ``get_file_task_name`` /
  ``get_file_datetime`` / ``get_latest_filename``: how ``EvaluationTracker.recreate_metadata_card`` and the Zeno
  visualiser find a run's files and tell its tasks apart by name;
- ``datasets.load_dataset("json", data_files=...)``: how ``recreate_metadata_card`` loads results and samples;
- ``lm_eval.result_schema.EvalResults`` and ``SampleResult``: the keys ``simple_evaluate`` returns and each samples
  line holds (the schema the readers above were written against).
"""

from __future__ import annotations

import json
import math
import random
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest

from ictrl.eval import lmeval
from ictrl.eval.harness import RESULTS_JSON, EvalConfig, EvalTask, evaluate
from ictrl.eval.table import build_table, find_results, load_run


@dataclass
class Problem:
    id: str
    gold: str


@dataclass
class CoinBackend:
    """Each completion is right with a probability set per problem, drawn from (prompt, seed)."""

    def generate(self, prompts: Sequence[str], n: int, max_new_tokens: int, temperature: float, top_p: float,
                 seed: int) -> list[list[str]]:
        out = []
        for p in prompts:
            rng, gold = random.Random(f"{p}|{seed}"), p.split()[-1]
            rate = int(gold) % 5 / 4
            out.append([f"answer {gold}" if rng.random() < rate else f"answer x{rng.random():.3f}" for _ in range(n)])
        return out


def task(name: str, num: int) -> EvalTask:
    return EvalTask(name, [Problem(f"{name}-{i}", str(i)) for i in range(num)], prompt_fn=lambda p: f"solve {p.gold}",
                    reward_fn=lambda c, g: float(c == f"answer {g}"), extract_fn=lambda c: c.split()[-1],
                    max_new_tokens=16, temperature=0.6, top_p=0.95)


NAMES = ("gsm8k", "math_train:levels=5")  # a registry name, and a spec whose name is no file name as it is


@pytest.fixture(scope="module")
def evaluated(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    out = tmp_path_factory.mktemp("eval") / "run"
    config = EvalConfig(model="runs/demo/ict", n=4, ks=(1, 2, 4), seeds=(0, 1), chunk_size=3, method="ict",
                        train_seed=2, n_bootstrap=50)
    result = evaluate([task(NAMES[0], 7), task(NAMES[1], 5)], CoinBackend(), config, output_dir=out, progress=False)
    return out, result


def files(out: Path) -> tuple[Path, dict[str, Path]]:
    folder = out / "runs__demo__ict"  # lm_eval.utils.sanitize_model_name("runs/demo/ict")
    (results,) = folder.glob("results_*.json")
    return results, {p.name: p for p in folder.glob("samples_*.jsonl")}


def comb_pass(n: int, c: int, k: int) -> float:
    return float(1 - Fraction(math.comb(n - c, k), math.comb(n, k)))


def test_values_match_a_float64_reference(evaluated: tuple[Path, Any]) -> None:
    out, result = evaluated
    results_path, samples = files(out)
    assert result.harness_file == results_path and len(samples) == len(NAMES)
    data = json.loads(results_path.read_text(encoding="utf-8"))
    for name in NAMES:
        per_problem: dict[str, list[float]] = {}
        for rec in result.records:
            if rec["benchmark"] == name:
                c = sum(s["reward"] >= 1 for s in rec["samples"])
                per_problem.setdefault(rec["problem_id"], []).append(c)
        for k in (1, 2, 4):
            scores = [statistics.fmean(comb_pass(4, c, k) for c in cs) for cs in per_problem.values()]
            cell = data["results"][name]
            assert cell[f"pass@{k},none"] == pytest.approx(statistics.fmean(scores), abs=1e-12)
            assert cell[f"pass@{k}_stderr,none"] == pytest.approx(statistics.stdev(scores) / math.sqrt(len(scores)),
                                                                  abs=1e-12)
            # the same number as ictrl's own summary
            assert cell[f"pass@{k},none"] == pytest.approx(result.summary["benchmarks"][name]["pass_at_k"][str(k)]
                                                           ["mean"], abs=1e-12)
        assert data["n-samples"][name] == {"original": len(per_problem), "effective": len(per_problem)}
        assert data["configs"][name]["repeats"] == 4
        assert data["configs"][name]["generation_kwargs"] == {"max_gen_toks": 16, "temperature": 0.6, "top_p": 0.95,
                                                              "do_sample": True}
    assert data["config"]["method"] == "ict" and data["config"]["train_seed"] == 2
    lines = [json.loads(x) for x in samples[next(n for n in samples if "gsm8k" in n)].read_text().splitlines()]
    assert [line["doc_id"] for line in lines] == list(range(7))
    first = [r for r in result.records if r["benchmark"] == "gsm8k" and r["problem_id"] == "gsm8k-0"]
    assert lines[0]["resps"] == [[s["completion"] for r in sorted(first, key=lambda r: r["seed"])
                                  for s in r["samples"]]]  # every seed's n completions, seed 0 first
    assert len(lines[0]["resps"][0]) == 8 and lines[0]["metrics"] == ["pass@1", "pass@2", "pass@4"]


def test_one_problem_has_no_stderr() -> None:
    assert lmeval._stderr([0.5]) == "N/A" and lmeval._stderr([0.0, 1.0]) == pytest.approx(0.5)


def test_the_harness_readers_load_the_files(evaluated: tuple[Path, Any]) -> None:
    utils = pytest.importorskip("lm_eval.utils")
    schema = pytest.importorskip("lm_eval.result_schema")
    from datasets import load_dataset

    out, _ = evaluated
    results_path, samples = files(out)
    listing = [str(p.relative_to(out.parent)) for p in out.rglob("*") if p.is_file()]
    assert utils.get_results_filenames(listing) == [str(results_path.relative_to(out.parent))]
    sample_files = utils.get_sample_results_filenames(listing)
    assert sorted(Path(f).name for f in sample_files) == sorted(samples)
    assert {utils.get_file_task_name(Path(f).stem) for f in sample_files} == {utils.sanitize_task_name(n)
                                                                                for n in NAMES}
    assert {utils.get_file_datetime(Path(f).name) for f in sample_files} == {
        utils.get_file_datetime(results_path.name).replace(".json", "")}
    assert utils.sanitize_model_name("runs/demo/ict") == results_path.parent.name

    data = json.loads(results_path.read_text(encoding="utf-8"))
    assert set(data) <= set(schema.EvalResults.__annotations__), set(data) - set(schema.EvalResults.__annotations__)
    table = utils.make_table(data)
    for name in NAMES:
        for k in (1, 2, 4):
            value, stderr = data["results"][name][f"pass@{k},none"], data["results"][name][f"pass@{k}_stderr,none"]
            assert f"|pass@{k}|↑|{value:.4f}|±|{stderr:.4f}|" in table.replace(" ", ""), table
    assert "math_train:levels=5" in table and "gsm8k" in table

    loaded = load_dataset("json", data_files=str(results_path), split="train")
    assert loaded[0]["results"]["gsm8k"]["pass@1,none"] == pytest.approx(data["results"]["gsm8k"]["pass@1,none"])
    required = set(schema.SampleResult.__annotations__)
    for name, path in samples.items():
        rows = load_dataset("json", data_files=str(path), split="train")
        assert required <= set(rows.column_names), required - set(rows.column_names)
        for row in rows:
            assert row["doc_hash"] == utils.hash_string(json.dumps(row["doc"], indent=2, ensure_ascii=False))
            assert row["prompt_hash"] == utils.hash_string(row["arguments"]["gen_args_0"]["arg_0"])
            assert row["target_hash"] == utils.hash_string(row["target"]) and row["filter"] == "none"
    task_name = next(n for n in NAMES if utils.sanitize_task_name(n) in next(iter(samples)))
    lines = [json.loads(x) for x in next(iter(samples.values())).read_text().splitlines()]
    assert data["task_hashes"][task_name] == utils.hash_string(
        "".join(s["doc_hash"] + s["prompt_hash"] + s["target_hash"] for s in lines))


def test_table_reads_the_harness_file_as_its_results_json(evaluated: tuple[Path, Any], tmp_path: Path) -> None:
    out, _ = evaluated
    results_path, _ = files(out)
    own, harness = load_run(out / RESULTS_JSON), load_run(results_path)
    assert (harness.method, harness.seed, harness.samples) == (own.method, own.seed, own.samples)
    assert harness.num_problems == own.num_problems and harness.generation == own.generation
    for name in NAMES:
        assert harness.scores[name] == pytest.approx(own.scores[name], abs=1e-12)
    # a folder holding both is one run, read from results.json; a harness file alone is found and read
    assert find_results([out.parent]) == [(out / RESULTS_JSON).resolve()]
    lone = tmp_path / "harness-only" / results_path.parent.name
    lone.mkdir(parents=True)
    older = json.loads(results_path.read_text())
    older["config"]["train_seed"] = 9  # an earlier rerun's file: the later one is the run
    (lone / "results_2000-01-01T00-00-00.000000.json").write_text(json.dumps(older))
    (lone / results_path.name).write_text(results_path.read_text())
    assert find_results([tmp_path / "harness-only"]) == [(lone / results_path.name).resolve()]
    from ictrl.eval.table import TableError

    with pytest.raises(TableError, match="also in"):  # the same method and seed twice, as for two results.json
        build_table([own, load_run(lone / results_path.name)])


def test_a_harness_file_without_a_method_is_one_line(evaluated: tuple[Path, Any], tmp_path: Path) -> None:
    from ictrl.eval.table import TableError

    results_path, _ = files(evaluated[0])
    data = json.loads(results_path.read_text())
    del data["config"]["method"]
    path = tmp_path / "results_2026-01-01T00-00-00.json"
    path.write_text(json.dumps(data))
    with pytest.raises(TableError, match=r"config.method is not set"):
        load_run(path)
