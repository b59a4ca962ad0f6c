"""``ictrl train`` with the recipe keys from YAML/flags: dynamic sampling, overlong shaping, truncation masking and
evaluation during training, on the tiny model (CPU)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ictrl import cli

CELL = Path(__file__).resolve().parents[2] / "configs" / "qwen2.5-0.5b" / "ict.yaml"


@pytest.mark.integration
def test_recipe_keys_reach_the_trainer(tiny_model_dir: Path, shared_data: Path, tmp_path: Path) -> None:
    bench = tmp_path / "digits.jsonl"
    bench.write_text("".join(json.dumps({"question": f"What is {i}+0?", "answer": f"#### {i}"}) + "\n"
                             for i in range(3)))
    out = tmp_path / "out"
    argv = [
        "train", str(CELL), f"--model_name_or_path={tiny_model_dir}", f"--output_dir={out}", "--max_steps=2",
        "--prompts_per_step=2", "--per_device_train_batch_size=8", "--num_generations=4",
        "--max_completion_length=8", "--dataset_name=[gsm8k_train]", "--dataset_limit=6", "--max_prompt_length=null",
        "--selection_warmup_steps=0", "--save_steps=1", "--disable_tqdm=true",
        "--overlong_buffer_length=4", "--overlong_penalty_factor=0.5", "--mask_truncated_completions=true",
        "--dynamic_sampling=true", "--dynamic_sampling_max_rounds=1", "--use_vllm=false",
        f"--eval_benchmarks=jsonl:{bench}:kind=gsm8k", "--eval_steps=1", "--eval_max_new_tokens=4",
        "--metric_for_best_model=eval/total",
    ]
    assert cli.main(argv) == 0
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        # the penalty is the second reward, weighted 0.5: reward = verifier + 0.5 x penalty (means, equal rounds)
        penalty = r["rewards/soft_overlong_punishment_reward/mean"]
        assert -1.0 <= penalty <= 0.0
        assert r["reward"] == pytest.approx(r["rewards/verifiable/mean"] + 0.5 * penalty, abs=1e-6)
        assert r["ictrl/dynamic_sampling_rounds"] in (0.0, 1.0) and 0 <= r["ictrl/informative_groups"] <= 2
        assert 0.0 <= r["eval/total"] <= 1.0 and "eval/avg/pass@1" in r
    state = json.loads((out / "checkpoint-2" / "trainer_state.json").read_text())
    assert state["best_global_step"] in (1, 2) and state["best_model_checkpoint"].endswith(
        f"checkpoint-{state['best_global_step']}")
    labels = json.loads((out / "run.json").read_text())
    inputs = labels.pop("inputs")  # what resume compares: the training rows' and the base model's content hashes
    assert set(inputs) == {"data", "model"} and all(len(v) == 64 and int(v, 16) >= 0 for v in inputs.values())
    rule = labels.pop("selector")  # the rule's identity: ictrl's own, by its registered name
    assert (rule["spec"], rule["file"], rule["sha256"]) == ("ict", None, None), rule
    assert labels == {"method": "ict", "token_selector": "ict", "selection_ratio": 0.1, "selection_scope": "response",
                      "selection_warmup_steps": 0, "loss_normalization": "per_response_selected", "loss_type": "dapo",
                      "method_from": "file", "seed": 0}  # the method resolved, and where token_selector came from
    from ictrl.eval.cli import train_run_labels

    assert train_run_labels(str(out)) == ("ict", 0)
    saved = (out / "config.yaml").read_text()
    assert "overlong_buffer_length: 4" in saved and "dynamic_sampling: true" in saved
