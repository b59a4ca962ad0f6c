"""The documented way in: ``ictrl tiny-model`` then ``accelerate launch --config_file configs/accelerate/ddp.yaml
--num_processes 2 -m ictrl train configs/tiny/ict.yaml`` (cut to 2 steps) trains on 2 CPU processes, writes metrics,
checkpoints and the final model, and ``--resume`` continues a run cut after its first checkpoint. The same launch
takes the ICT score's top-K from generation on each process (``--selection_topk``); the exact-head ICT path of
``ictrl train`` on 2 processes is launched by test_launcher_kill.py."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import mp_worker as w

TINY = w.REPO_ROOT / "configs" / "tiny" / "ict.yaml"


def test_tiny_config_and_accelerate_configs_parse() -> None:
    from ictrl.train_cli.run_config import load_config

    cfg = load_config(str(TINY), [])
    assert cfg.trainer["token_selector"] == "ict" and cfg.model.model_name_or_path == "runs/tiny-model"
    for name in ("ddp", "fsdp2", "zero2", "zero3"):
        data = yaml.safe_load((w.REPO_ROOT / "configs" / "accelerate" / f"{name}.yaml").read_text())
        assert data["distributed_type"] in ("MULTI_GPU", "FSDP", "DEEPSPEED"), name
    fsdp = yaml.safe_load((w.REPO_ROOT / "configs" / "accelerate" / "fsdp2.yaml").read_text())["fsdp_config"]
    assert fsdp["fsdp_version"] == 2 and fsdp["fsdp_state_dict_type"] == "SHARDED_STATE_DICT"


def test_tiny_model_command_writes_a_trainable_checkpoint(tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    from ictrl import cli

    out = tmp_path / "tiny"
    assert cli.main(["tiny-model", str(out), "--untrained", "--problems", "8"]) == 0
    tokenizer = AutoTokenizer.from_pretrained(out)
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "Q:3+4*5=A:"}], tokenize=False,
                                           add_generation_prompt=True)
    assert prompt == "Q:3+4*5=A:"  # plain-prompt mode: the text the model was trained on, no role markers
    rows = [json.loads(line) for line in (out / "train.jsonl").read_text().splitlines()]
    assert len(rows) == 8 and rows[0]["question"].startswith("Q:") and rows[0]["answer"].lstrip("-").isdigit()
    assert cli.main(["tiny-model", str(out), "--untrained"]) == 2  # refuses to overwrite


# the config's 40 steps cut to 2, at the former plumbing shape (4 prompts x 4 completions, a checkpoint a step), with
# the ICT score's top-K (selection_topk)
LAUNCH = ["-m", "ictrl", "train", str(TINY), "--max_steps=2", "--save_steps=1", "--prompts_per_step=4",
          "--num_generations=4", "--per_device_train_batch_size=8", "--max_completion_length=32", "--num_iterations=1",
          "--selection_topk=8"]


@pytest.fixture(scope="module")
def tiny_launch(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess[str]]:
    """``ictrl tiny-model`` then one 2-process launch of :data:`LAUNCH`: (its working directory, the launch), read by
    the tests below; a test that changes the run works on a copy, so the tests pass in any order."""
    root = tmp_path_factory.mktemp("tiny_launch")
    assert subprocess.run([sys.executable, "-m", "ictrl", "tiny-model", "runs/tiny-model", "--untrained"],
                          cwd=root, capture_output=True, text=True, timeout=120).returncode == 0
    return root, w.launch(LAUNCH, cwd=root)


@pytest.mark.integration
def test_accelerate_launch_tiny_config_two_processes_and_resume(
        tiny_launch: tuple[Path, subprocess.CompletedProcess[str]], tmp_path: Path) -> None:
    root, proc = tiny_launch
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    shutil.copytree(root, tmp_path / "launch", symlinks=True)
    run = tmp_path / "launch" / "runs" / "tiny" / "ict"
    assert proc.stderr.count("no CUDA device: training on CPU") == 1  # two processes, rank 0 logs
    steps = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2]
    assert (run / "checkpoint-1" / "trainer_state.json").is_file() and (run / "model.safetensors").is_file()

    # Cut after checkpoint-1 (as a kill before step 2 would leave it), then resume on 2 processes.
    shutil.rmtree(run / "checkpoint-2")
    for name in ("config.json", "trainer_state.json", "manifest.json"):  # the final model not yet published
        (run / name).unlink()
    proc = w.launch([*LAUNCH, "--resume"], cwd=tmp_path / "launch")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "resuming from" in proc.stderr and "checkpoint-1" in proc.stderr
    state = json.loads((run / "trainer_state.json").read_text())
    assert state["global_step"] == 2 and (run / "checkpoint-2").is_dir()


@pytest.mark.integration
def test_two_processes_score_the_topk_ict(tiny_launch: tuple[Path, subprocess.CompletedProcess[str]]) -> None:
    """selection_topk on 2 processes: each process takes the head's top-K of its own rows, and the selection runs on
    the gathered batch. Real sampling differs per process, so this checks the run (finite, a sparse selection), not
    equality with one process."""
    root, proc = tiny_launch
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = [json.loads(line) for line in (root / "runs" / "tiny" / "ict" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        assert 0 < r["ictrl/selected_frac"] < 0.5
        assert r["ictrl/ict_score/all"] > 0 and math.isfinite(r["loss"])
