"""The library imports only the library: what ``from ictrl import ICTGRPOConfig, ICTGRPOTrainer`` loads, through a
training step and a save (imports inside functions included), is ``ictrl.core``, ``ictrl.engine`` and the
top-level modules :data:`test_layers.LIBRARY_TOP`; never the grader and its sandbox (``ictrl.rewards``), the
benchmark registry (``ictrl.data``), ``ictrl.eval``, ``ictrl.experiments`` or a command (``ictrl.train_cli``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from test_layers import LIBRARY_TOP, outside_the_library

SCRIPT = """
import json, sys
from ictrl import ICTGRPOConfig, ICTGRPOTrainer
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer

model_dir, out = sys.argv[1:3]
tokenizer = AutoTokenizer.from_pretrained(model_dir)
tokenizer.padding_side = "left"
model = AutoModelForCausalLM.from_pretrained(model_dir)
args = ICTGRPOConfig(output_dir=out, use_cpu=True, bf16=False, report_to="none", save_strategy="no", max_steps=1,
                     per_device_train_batch_size=4, num_generations=4, max_completion_length=6, learning_rate=1e-2,
                     seed=0, disable_tqdm=True, dataloader_num_workers=0, token_selector="ict",
                     selection_warmup_steps=0, reward_timeout=30.0, no_signal_steps=5)


def has_digit(prompts, completions, **columns):
    return [float(any(c.isdigit() for c in text)) for text in completions]


trainer = ICTGRPOTrainer(model=model, reward_funcs=has_digit, args=args, processing_class=tokenizer,
                         train_dataset=Dataset.from_dict({"prompt": [f"Q{i}: {i}+3=" for i in range(4)]}))
trainer.train()
trainer.save_model(out)
assert trainer.state.global_step == 1
print(json.dumps(sorted(m for m in sys.modules if m == "ictrl" or m.startswith("ictrl."))))
"""


@pytest.mark.integration  # a fresh interpreter (TRL's import) and a training step: about a minute on CPU
def test_a_training_step_loads_only_the_library(tiny_model_dir: Path, tmp_path: Path) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(tiny_model_dir), str(tmp_path / "out")], env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    loaded = json.loads(done.stdout.strip().splitlines()[-1])
    assert {"ictrl.engine.trainer", "ictrl.engine.reward_policy", "ictrl.core.loss"} <= set(loaded)
    assert outside_the_library(loaded) == []
    assert (tmp_path / "out" / "config.json").is_file()


def test_the_check_names_what_is_outside() -> None:
    assert outside_the_library(["ictrl", "ictrl.core.loss", "ictrl.engine.trainer", "ictrl.errors"]) == []
    assert outside_the_library(["ictrl.rewards.verify", "ictrl.data", "ictrl.train_cli.run", "ictrl.yamlfile"]) == [
        "ictrl.data", "ictrl.rewards.verify", "ictrl.train_cli.run", "ictrl.yamlfile"]
    # files, checkpoints, errors, hub, vllm_env, and validation: the one field check, which the data, eval and
    # reward settings below the library share with the config, so it cannot live in ictrl.engine
    assert len(LIBRARY_TOP) <= 6
