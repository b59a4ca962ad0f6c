"""The documented way in: ``ictrl tiny-model`` then ``accelerate launch --config_file configs/accelerate/ddp.yaml
--num_processes 2 -m ictrl train configs/tiny/ict.yaml`` (cut to 2 steps) trains on 2 CPU processes, writes metrics,
checkpoints and the final model, and ``--resume`` continues a run cut after its first checkpoint."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import mp_worker as w

TINY = w.REPO_ROOT / "configs" / "tiny" / "ict.yaml"


def test_tiny_config_and_accelerate_configs_parse() -> None:
    from ictrl.engine.run_config import load_config

    cfg = load_config(str(TINY), [])
    assert cfg.trainer["token_selector"] == "ict" and cfg.model.name_or_path == "runs/tiny-model"
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


@pytest.mark.integration
def test_accelerate_launch_tiny_config_two_processes_and_resume(tmp_path: Path) -> None:
    assert subprocess.run([sys.executable, "-m", "ictrl", "tiny-model", "runs/tiny-model", "--untrained"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120).returncode == 0
    # the config's 40 steps cut to 2, at the former plumbing shape (4 prompts x 4 completions, a checkpoint a step)
    args = ["-m", "ictrl", "train", str(TINY), "--max_steps=2", "--save_steps=1", "--prompts_per_step=4",
            "--num_generations=4", "--per_device_train_batch_size=8", "--max_completion_length=32",
            "--num_iterations=1"]
    proc = w.launch(args, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    run = tmp_path / "runs" / "tiny" / "ict"
    assert proc.stderr.count("no CUDA device: training on CPU") == 1  # two processes, rank 0 logs
    steps = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2]
    assert (run / "checkpoint-1" / "trainer_state.json").is_file() and (run / "final" / "model.safetensors").is_file()

    # Cut after checkpoint-1 (as a kill before step 2 would leave it), then resume on 2 processes.
    shutil.rmtree(run / "checkpoint-2")
    shutil.rmtree(run / "final")
    proc = w.launch([*args, "--resume"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "resuming from" in proc.stderr and "checkpoint-1" in proc.stderr
    state = json.loads((run / "final" / "trainer_state.json").read_text())
    assert state["global_step"] == 2 and (run / "checkpoint-2").is_dir()
