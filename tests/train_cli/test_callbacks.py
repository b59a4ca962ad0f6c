"""metrics.jsonl rows: a wall-clock timestamp on every row, non-finite values as null, resume trimming."""

from __future__ import annotations

import json
import math
import time
from datetime import datetime
from pathlib import Path
from types import SimpleNamespace

import pytest

from ictrl.train_cli.callbacks import MetricsJSONL


def _state(step: int) -> SimpleNamespace:
    return SimpleNamespace(global_step=step, is_world_process_zero=True)


def test_every_row_has_iso_utc_and_unix_time(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    cb = MetricsJSONL(path, accuracy_reward="acc")
    cb.on_train_begin(None, _state(0), None)
    before = time.time()
    cb.on_log(None, _state(1), None, logs={"reward": 0.5, "rewards/acc/mean": 0.25, "loss": math.nan})
    cb.on_log(None, _state(2), None, logs={"reward": 0.75})
    after = time.time()
    cb.on_log(None, _state(2), None, logs={"train_runtime": 3.0})  # the end-of-training summary is not a step
    cb.on_train_end(None, _state(2), None)
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    for row in rows:
        assert row["time"].endswith("Z")
        parsed = datetime.fromisoformat(row["time"].replace("Z", "+00:00"))
        assert abs(parsed.timestamp() - row["unix_time"]) < 1e-3
        assert before - 1e-3 <= row["unix_time"] <= after + 1e-3
    assert rows[0]["accuracy"] == 0.25
    assert rows[0]["loss"] is None and rows[0]["nonfinite"] == ["loss"]


def test_resume_keeps_rows_up_to_the_checkpoint(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps({"step": s, "reward": s}) + "\n" for s in (1, 2, 3)) + '{"step": 4, "rew')
    cb = MetricsJSONL(path)
    cb.on_train_begin(None, _state(2), None)
    cb.on_log(None, _state(3), None, logs={"reward": 30.0})
    cb.on_train_end(None, _state(3), None)
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert [(r["step"], r["reward"]) for r in rows] == [(1, 1), (2, 2), (3, 30.0)]


def test_report_to_list_comma_string_and_missing_tracker(monkeypatch) -> None:
    import pytest

    from ictrl.engine import ICTGRPOConfig, config_fields

    common = dict(output_dir="unused", use_cpu=True, bf16=False, num_generations=2, per_device_train_batch_size=2)
    assert ICTGRPOConfig(report_to="tensorboard, none", **common).report_to == ["tensorboard"]
    assert ICTGRPOConfig(report_to=["tensorboard"], **common).report_to == ["tensorboard"]
    assert ICTGRPOConfig(report_to="none", **common).report_to in ("none", [])
    monkeypatch.setitem(config_fields.TRACKERS, "wandb", ("ictrl_no_such_package", "pip install wandb"))
    with pytest.raises(ValueError, match=r"report_to: wandb needs the 'ictrl_no_such_package' package, which is not "
                                         r"installed: pip install wandb"):
        ICTGRPOConfig(report_to="tensorboard,wandb", **common)


def test_log_line_shows_the_running_mean_of_the_logged_rewards() -> None:
    import io
    from types import SimpleNamespace

    from rich.console import Console

    from ictrl.train_cli.callbacks import TREND, RichProgress, step_line

    assert step_line(3, 9, {"reward": 0.5}, None).startswith("step 3/9  reward 0.500  sel -")  # no accuracy column
    assert step_line(3, 9, {"reward": 0.5, "rewards/math/mean": 0.25}, "rewards/math/mean").startswith(
        "step 3/9  reward 0.500  acc 0.250  sel -")
    assert step_line(3, 9, {"reward": 0.5}, None, [0.25, 0.5]).startswith("step 3/9  reward 0.500 (avg2 0.375)  ")
    out = io.StringIO()
    bar = RichProgress(console=Console(file=out, width=200, force_terminal=False))
    state = SimpleNamespace(is_local_process_zero=True, global_step=0, max_steps=30)
    bar.on_train_begin(None, state, None)
    for step in range(1, 25):  # a reward on every other step, as with num_iterations=2
        state.global_step = step
        bar.on_log(None, state, None, logs={"reward": step / 100} if step % 2 else {"loss": 0.0})
    bar.on_train_end(None, state, None)
    lines = [line for line in out.getvalue().splitlines() if line.startswith("step ")]
    assert len(lines) == 24 and lines[0].startswith("step 1/30  reward 0.010 (avg1 0.010)")
    last = [s / 100 for s in range(1, 25, 2)][-TREND:]  # the last 10 of the 12 rewards
    assert lines[-1].startswith(f"step 24/30  reward - (avg10 {sum(last) / len(last):.3f})"), lines[-1]


def test_without_the_bar_each_logged_step_is_still_one_line() -> None:
    """disable_tqdm: no live bar, and the same step line per logged step (a batch job's log shows the run)."""
    import io

    from rich.console import Console

    from ictrl.train_cli.callbacks import RichProgress

    out = io.StringIO()
    quiet = RichProgress(console=Console(file=out, width=200, force_terminal=True), bar=False)
    other = RichProgress(console=Console(file=io.StringIO(), width=200), bar=False)
    state = SimpleNamespace(is_local_process_zero=True, global_step=0, max_steps=3)
    quiet.on_train_begin(None, state, None)
    other.on_train_begin(None, SimpleNamespace(is_local_process_zero=False), None)
    assert quiet.progress is None
    for step in range(1, 4):
        state.global_step = step
        quiet.on_step_end(None, state, None)
        quiet.on_log(None, state, None, logs={"reward": 0.5, "loss": 0.25})
        other.on_log(None, state, None, logs={"reward": 0.5})
    quiet.on_log(None, state, None, logs={"train_runtime": 1.5})
    quiet.on_train_end(None, state, None)
    lines = out.getvalue().splitlines()
    assert [line.split("  ")[0] for line in lines] == ["step 1/3", "step 2/3", "step 3/3", "done: 3 steps in 1.5s"]
    assert "loss 0.25" in lines[0] and "\x1b[?25l" not in out.getvalue()  # no live display's cursor codes
    assert other.console.file.getvalue() == ""  # another process prints nothing


def test_the_running_mean_continues_across_resume() -> None:
    """A resumed run's first lines average the rewards logged before the checkpoint (its trainer state's log
    history), not only those since the resume; rows after the checkpoint's step (redone now) are not counted."""
    import io
    from types import SimpleNamespace

    from rich.console import Console

    from ictrl.train_cli.callbacks import RichProgress

    out = io.StringIO()
    bar = RichProgress(console=Console(file=out, width=200, force_terminal=False))
    history = [{"reward": step / 100, "loss": 0.1, "step": step} for step in range(1, 13)]
    history.append({"train_runtime": 5.0, "step": 12})
    state = SimpleNamespace(is_local_process_zero=True, global_step=10, max_steps=30, log_history=history)
    bar.on_train_begin(None, state, None)
    state.global_step = 11
    bar.on_log(None, state, None, logs={"reward": 0.5})
    bar.on_train_end(None, state, None)
    line = next(line for line in out.getvalue().splitlines() if line.startswith("step 11/30"))
    earlier = [step / 100 for step in range(2, 11)] + [0.5]  # steps 2-10 from the checkpoint, then step 11
    assert f"reward 0.500 (avg10 {sum(earlier) / len(earlier):.3f})" in line, line


def test_a_run_inside_the_selection_warmup_says_so(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    import logging

    from ictrl.engine.config import ICTGRPOConfig
    from ictrl.train_cli.callbacks import warmup_line

    def cpu_args(out: Path, **kw: object) -> ICTGRPOConfig:
        return ICTGRPOConfig(output_dir=str(out), use_cpu=True, bf16=False, report_to="none", num_generations=4,
                             per_device_train_batch_size=8, **{"selection_warmup_steps": 0, **kw})

    ict = cpu_args(tmp_path / "a", token_selector="ict", selection_warmup_steps=10)
    state = SimpleNamespace(global_step=0, is_world_process_zero=True, max_steps=2)
    with caplog.at_level(logging.INFO, logger="ictrl.train"):
        MetricsJSONL(tmp_path / "metrics.jsonl").on_train_begin(ict, state, None)
    lines = [r.getMessage() for r in caplog.records if "warm-up" in r.getMessage()]
    assert len(lines) == 1
    assert lines[0].startswith("selection warm-up: steps 1-10 train on all tokens (selection_warmup_steps=10)")
    assert "ends at step 2, inside the warm-up" in lines[0] and "--selection_warmup_steps=0" in lines[0]
    assert "inside" not in (warmup_line(ict, 0, 40) or "")  # a longer run: the warm-up, then ict selects
    assert warmup_line(ict, 0, 40) is not None and "ict selects from step 11" in warmup_line(ict, 0, 40)
    assert warmup_line(ict, 4, 40).startswith("selection warm-up: steps 5-10")  # resumed inside it
    assert warmup_line(ict, 10, 40) is None  # resumed after it
    assert warmup_line(cpu_args(tmp_path / "b", token_selector="all"), 0, 2) is None
    assert warmup_line(cpu_args(tmp_path / "c", token_selector="ict"), 0, 2) is None  # Θ=0


def test_an_evaluation_row_prints_its_metrics_not_a_blank_step_line() -> None:
    """An ``eval_strategy`` row (TRL's ``eval_*`` keys) is an eval line with its reward, accuracy, length, loss and
    time; a training row with the pass@k evaluation's ``eval/`` numbers prints them under its step line."""
    import io

    from rich.console import Console

    from ictrl.train_cli.callbacks import RichProgress

    out = io.StringIO()
    progress = RichProgress(accuracy_reward="acc", console=Console(file=out, width=300), bar=False)
    state = SimpleNamespace(global_step=1, max_steps=2, is_local_process_zero=True, log_history=[])
    progress.on_train_begin(None, state, None)
    progress.on_log(None, state, None, logs={"eval_loss": 0.0125, "eval_reward": 0.25, "eval_reward_std": 0.5,
                                             "eval_rewards/acc/mean": 0.5, "eval_completions/mean_length": 7.5,
                                             "eval_runtime": 1.234, "epoch": 0.5})
    progress.on_log(None, state, None, logs={"reward": 0.75, "loss": 0.5, "eval/gsm8k/pass@1": 0.125,
                                             "eval/time": 3.0})
    lines = out.getvalue().splitlines()
    assert lines[0] == "eval at step 1/2  reward 0.250  acc 0.500  reward_std 0.500  length 7.5  loss 0.0125  1.23s"
    assert lines[1].startswith("step 1/2  reward 0.750") and lines[2] == "  eval gsm8k/pass@1 0.125"
    assert len(lines) == 3
