"""``ictrl eval`` under faults, on the tiny model: SIGTERM mid-run, the model swapped or moved between a run and its
resume, a truncated model file. Each is one line and an exit status; the resumed samples equal an uninterrupted
run's."""

from __future__ import annotations

import os
import shutil
import signal
from pathlib import Path
from typing import Any

import pytest

from ictrl.cli import main
from ictrl.eval.harness import RESULTS_JSON, SAMPLES_FILE


def _args(model: Path, out: Path) -> list[str]:
    return ["eval", "--model", str(model), "--benchmarks", "gsm8k", "--limit", "4", "--n", "2", "--k", "1",
            "--max-new-tokens", "4", "--chunk-size", "2", "--seeds", "1", "--output-dir", str(out), "--no-progress"]


def _records(out: Path) -> list[Any]:
    import json

    return json.loads((out / RESULTS_JSON).read_text())["records"]


def _errors(err: str) -> list[str]:
    """The command's error lines (its warnings, e.g. no method label, left out)."""
    return [line for line in err.splitlines()
            if line.startswith("ictrl eval") and not line.startswith("ictrl eval: warning:")]


@pytest.mark.integration
def test_sigterm_is_one_line_and_the_rerun_equals_an_uninterrupted_run(
        tiny_model_dir: Path, shared_data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    from ictrl.eval.generate import HFBackend

    assert main(_args(tiny_model_dir, tmp_path / "clean")) == 0
    real = HFBackend.generate
    calls = []

    def terminated_in_second_call(self: Any, *args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        if len(calls) == 2:
            os.kill(os.getpid(), signal.SIGTERM)  # the scheduler's stop, while the second block is drawn
        return real(self, *args, **kwargs)

    monkeypatch.setattr(HFBackend, "generate", terminated_in_second_call)
    capsys.readouterr()
    out = tmp_path / "run"
    assert main(_args(tiny_model_dir, out)) == 143
    assert _errors(capsys.readouterr().err) == [
        f"ictrl eval: terminated (SIGTERM); 2 finished (seed, benchmark, problem) rows are in {out / SAMPLES_FILE}; "
        "run the same command again to continue"]
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # the handler is gone with the command
    monkeypatch.undo()
    assert main(_args(tiny_model_dir, out)) == 0
    assert _records(out) == _records(tmp_path / "clean")


@pytest.mark.integration
def test_eval_resume_knows_the_model_by_its_weights(tiny_model_dir: Path, shared_data: Path, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    from ictrl.models import save_tiny_model

    model, out = tmp_path / "model", tmp_path / "eval"
    shutil.copytree(tiny_model_dir, model)
    assert main(_args(model, out)) == 0
    samples = (out / SAMPLES_FILE).read_text()

    moved = tmp_path / "moved"  # the same weights elsewhere: the run is recognised, nothing is redrawn
    shutil.move(model, moved)
    assert main(_args(moved, out)) == 0
    assert (out / SAMPLES_FILE).read_text() == samples

    save_tiny_model(moved, seed=1)  # another model written over the directory
    capsys.readouterr()
    assert main(_args(moved, out)) == 2
    errors = _errors(capsys.readouterr().err)
    assert len(errors) == 1 and "the model's weights differ from those the samples were drawn with" in errors[0]
    assert (out / SAMPLES_FILE).read_text() == samples

    weights = moved / "model.safetensors"
    size = weights.stat().st_size
    weights.write_bytes(weights.read_bytes()[: size - 100])
    assert main(_args(moved, tmp_path / "other")) == 2
    assert _errors(capsys.readouterr().err) == [
        f"ictrl eval: error: --model: {moved}: model.safetensors has {size - 100} bytes, its header describes {size}; "
        "the model directory is damaged"]
    assert not (tmp_path / "other").exists()
