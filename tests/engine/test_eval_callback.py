"""Evaluation during training (ictrl.train_cli.eval_callback) on CPU with the tiny Qwen2."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

import mp_worker as w
from ictrl.train_cli.eval_callback import PassAtKCallback, eval_metrics


def digits_benchmark(tmp_path: Path) -> str:
    path = tmp_path / "digits.jsonl"
    path.write_text("".join(json.dumps({"question": f"What is {i}+0?", "answer": f"#### {i}"}) + "\n" for i in range(10)))
    return f"jsonl:{path}:kind=gsm8k"


def test_eval_metrics_flatten_a_summary() -> None:
    summary = {"benchmarks": {"a": {"pass_at_k": {"1": {"mean": 0.25}, "4": {"mean": 0.5}}}},
               "average": {"pass_at_k": {"1": {"mean": 0.25}, "4": {"mean": 0.5}}}, "total": {"mean": 0.375}}
    assert eval_metrics(summary) == {"eval/a/pass@1": 0.25, "eval/a/pass@4": 0.5, "eval/avg/pass@1": 0.25,
                                     "eval/avg/pass@4": 0.5, "eval/total": 0.375}


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({}, "eval_benchmarks needs eval_steps"),
        ({"eval_steps": 0.5}, "eval_benchmarks needs eval_steps"),
        ({"eval_steps": 1, "gradient_accumulation_steps": 1, "steps_per_generation": 2}, "must be a multiple of"),
        ({"eval_steps": 1, "eval_ks": [1, 8]}, "eval_ks"),
        ({"eval_steps": 1, "eval_limit": 0}, "eval_limit"),
    ],
)
def test_config_checks(tmp_path: Path, overrides: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        w.make_config(tmp_path, **{"eval_benchmarks": ["gsm8k"], **overrides})


def test_benchmark_names_are_resolved_by_the_command(tmp_path: Path) -> None:
    """The library keeps ``eval_benchmarks`` as given (it imports no benchmark registry); ``ictrl train``'s
    trainer_inputs resolves each name and blames the one it does not know."""
    from ictrl.errors import ConfigError
    from ictrl.train_cli.trainer_inputs import check_trainer_inputs

    args = w.make_config(tmp_path, eval_benchmarks=["gsm8k", "math5000"], eval_steps=1)
    assert args.eval_benchmarks == ["gsm8k", "math5000"]
    with pytest.raises(ConfigError, match=r"^run\.yaml: eval_benchmarks\[1\]: .*unknown name 'math5000'"):
        check_trainer_inputs(args, "run.yaml")
    check_trainer_inputs(w.make_config(tmp_path, eval_benchmarks=["gsm8k"], eval_steps=1), "run.yaml")


@pytest.mark.integration
def test_pass_at_k_every_eval_steps_logged_and_the_best_checkpoint_kept(tiny_model_dir: Path, tmp_path: Path,
                                                                       digits_only: Any) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ictrl.train_cli.callbacks import MetricsJSONL
    from ictrl.engine.trainer import ICTGRPOTrainer
    from ictrl.eval.generate import HFBackend
    from ictrl.eval.harness import evaluate

    import shutil

    model_dir = tmp_path / "model"  # answers only digits at evaluation (its generation config), right ~1 in 10
    shutil.copytree(tiny_model_dir, model_dir)
    digits_only(model_dir)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    out = tmp_path / "run"
    args = w.make_config(out, token_selector="all", max_steps=6, learning_rate=5e-2, save_strategy="steps",
                         save_steps=2, save_total_limit=1, eval_benchmarks=[digits_benchmark(tmp_path)], eval_steps=2,
                         eval_limit=10, eval_num_samples=8, eval_ks=[1, 4], eval_seed=5, eval_max_new_tokens=1,
                         eval_temperature=1.0, metric_for_best_model="eval/total", per_device_eval_batch_size=16)
    trainer = ICTGRPOTrainer(model=model, reward_funcs=w.digit_reward, args=args, train_dataset=w.make_dataset(),
                             processing_class=tokenizer)
    callback = PassAtKCallback.from_args(args, tokenizer).bind(trainer)
    trainer.add_callback(callback)
    trainer.add_callback(MetricsJSONL(out / "metrics.jsonl"))
    snapshots: dict[int, dict[str, torch.Tensor]] = {}
    original = callback.evaluate_now

    def snapshot_then_evaluate() -> dict[str, float]:
        step = trainer.state.global_step
        snapshots[step] = {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}
        return original()

    callback.evaluate_now = snapshot_then_evaluate  # type: ignore[method-assign]
    trainer.train()

    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    evaluated = {r["step"]: r for r in rows if "eval/total" in r}
    assert sorted(evaluated) == [2, 4, 6] and sorted(snapshots) == [2, 4, 6]
    name = callback.tasks[0].name
    for row in evaluated.values():  # beside the training metrics of the same step
        assert "loss" in row and "reward" in row
        assert set(k for k in row if k.startswith("eval/")) == {
            f"eval/{name}/pass@1", f"eval/{name}/pass@4", "eval/avg/pass@1", "eval/avg/pass@4", "eval/total",
            "eval/time"}

    # each logged number is what ictrl.eval gives for the weights of that step (fixed problems, fixed seed)
    for step, weights in snapshots.items():
        fresh = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        fresh.load_state_dict(weights)
        summary = evaluate(callback.tasks, HFBackend(fresh, tokenizer, batch_size=16), callback.config,
                           progress=False).summary
        assert eval_metrics(summary)["eval/total"] == pytest.approx(evaluated[step]["eval/total"], abs=1e-12)
    assert not torch.equal(snapshots[2]["lm_head.weight"], snapshots[6]["lm_head.weight"])
    assert any(r["eval/total"] > 0 for r in evaluated.values())  # the digit problems are sometimes solved

    # the best step by eval/total (the earliest on a tie) is recorded and its checkpoint kept; with
    # save_total_limit=1 every other checkpoint is rotated away
    totals = {s: evaluated[s]["eval/total"] for s in (2, 4, 6)}
    best_step = max(totals, key=lambda s: (totals[s], -s))
    assert trainer.state.best_metric == pytest.approx(totals[best_step])
    assert trainer.state.best_global_step == best_step
    assert trainer.state.best_model_checkpoint == str(out / f"checkpoint-{best_step}")
    assert sorted(p.name for p in out.glob("checkpoint-*")) == [f"checkpoint-{best_step}"]
    saved = json.loads((out / f"checkpoint-{best_step}" / "trainer_state.json").read_text())
    assert saved["best_global_step"] == best_step
