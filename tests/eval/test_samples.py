"""samples.jsonl across reruns of ``ictrl eval``: a row is done for the gold answer it was graded against; a
corrected gold is regraded from the saved completions, with no new sample drawn."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from ictrl.cli import main
from ictrl.eval.harness import RESULTS_JSON, SAMPLES_FILE


class Scripted:
    """A backend that answers each prompt by its question (``What is 2+3?`` -> ``\\boxed{5}``) and counts its
    calls and loads: what the model writes is fixed, so only the gold decides a grade."""

    def __init__(self) -> None:
        self.calls = self.loads = 0

    def generate(self, prompts: Any, n: int, max_new_tokens: int, temperature: float, top_p: float,
                 seed: int) -> list[list[str]]:
        self.calls += 1
        answers = {"2+3": "5", "1+1": "2", "4*4": "16"}
        return [[f"so \\boxed{{{next(v for k, v in answers.items() if k in p)}}}"] * n for p in prompts]


@pytest.fixture
def backend(monkeypatch: pytest.MonkeyPatch) -> Scripted:
    import ictrl.eval.generate

    scripted = Scripted()

    def build(*args: Any, **kwargs: Any) -> Scripted:
        scripted.loads += 1
        return scripted

    monkeypatch.setattr(ictrl.eval.generate, "build_backend", build)
    return scripted


def write_rows(path: Path, golds: list[str]) -> None:
    questions = ["What is 2+3?", "What is 1+1?", "What is 4*4?"]
    path.write_text("".join(json.dumps({"question": q, "answer": g}) + "\n" for q, g in zip(questions, golds)))


def test_a_rerun_after_the_golds_were_corrected_regrades_the_saved_completions(
        backend: Scripted, tiny_model_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    data, out = tmp_path / "rows.jsonl", tmp_path / "eval"
    argv = ["eval", "--model", str(tiny_model_dir), "--benchmarks", f"jsonl:{data}", "--n", "2", "--k", "1",
            "--max-new-tokens", "8", "--temperature", "0", "--method", "base", "--output-dir", str(out),
            "--no-progress"]
    write_rows(data, ["5", "3", "16"])  # 1+1's gold is wrong
    assert main(argv) == 0
    assert backend.calls == 1
    first = json.loads((out / RESULTS_JSON).read_text())["records"]
    assert [r["num_correct"] for r in first] == [2, 0, 2]
    caplog.clear()

    write_rows(data, ["5", "2", "16\u200b"])  # 1+1 corrected; 16 pasted with a zero-width space
    assert main(argv) == 0
    assert (backend.calls, backend.loads) == (1, 1)  # the completions were saved: the model is not even loaded
    err = caplog.text
    assert "2 saved row(s)" in err and "problem jsonl:rows.jsonl-1" in err and "regraded" in err, err
    records = json.loads((out / RESULTS_JSON).read_text())["records"]
    assert [r["gold"] for r in records] == ["5", "2", "16\u200b"]
    assert [r["num_correct"] for r in records] == [2, 2, 2]
    assert [s["completion"] for s in records[1]["samples"]] == [s["completion"] for s in first[1]["samples"]]
    rows = [json.loads(line) for line in (out / SAMPLES_FILE).read_text().splitlines()]
    assert [(r["gold"], r["num_correct"]) for r in rows] == [("5", 2), ("2", 2), ("16\u200b", 2)]

    caplog.clear()
    assert main(argv) == 0  # the file holds the new grades: nothing to regrade a second time
    assert "regraded" not in caplog.text
    assert backend.calls == 1


def test_a_rerun_with_a_row_to_sample_loads_the_model_and_samples_only_that_row(
        backend: Scripted, tiny_model_dir: Path, tmp_path: Path) -> None:
    data, out = tmp_path / "rows.jsonl", tmp_path / "eval"
    argv = ["eval", "--model", str(tiny_model_dir), "--benchmarks", f"jsonl:{data}", "--n", "1", "--k", "1",
            "--max-new-tokens", "8", "--temperature", "0", "--method", "base", "--output-dir", str(out),
            "--no-progress", "--chunk-size", "1"]
    write_rows(data, ["5", "2"])
    assert main(argv) == 0
    write_rows(data, ["5", "2", "16"])
    assert main(argv) == 0
    assert (backend.calls, backend.loads) == (3, 2)
    assert [r["num_correct"] for r in json.loads((out / RESULTS_JSON).read_text())["records"]] == [1, 1, 1]
