"""Sampler/trainer importance weights in ICTGRPOTrainer: TRL's vllm_importance_sampling_* options are
honoured with every selector and normaliser. The sampler is TRL's own ``VLLMGeneration`` over the fake vLLM 0.31
engine of tests/fixtures/fake_vllm.py (it samples with a synced copy of the model and reports each sampled token's
log-prob shifted, as a mismatched engine would), or a ``rollout_func`` that reports log-probs; both on CPU."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

import mp_worker as w
from ictrl.engine.config import ICTGRPOConfig
from rollout_helpers import _inputs, _load, _vllm_trainer

CASES = [("ict", "per_response_selected", "token_truncate"), ("all", "dr_grpo", "sequence_mask"),
         ("entropy", "token_mean_selected", "token_mask"), ("stapo", "token_mean_all", "sequence_truncate"),
         ("random", "per_response_all", "token_truncate")]


def _reference(trainer: Any, inputs: dict[str, Any], mode: str, lo: float | None, hi: float | None) -> torch.Tensor:
    """The weighted loss in float64, from the batch's tensors only."""
    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
    attention = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
    P, T = inputs["prompt_ids"].size(1), inputs["completion_ids"].size(1)
    with torch.no_grad():
        logits = trainer.model(input_ids=ids, attention_mask=attention).logits[:, P - 1:P + T - 1].double()
    logp = torch.log_softmax(logits / trainer.temperature, -1).gather(-1, inputs["completion_ids"][..., None])[..., 0]
    mask = inputs["completion_mask"].bool()
    old, smp = inputs["old_per_token_logps"].double(), inputs["sampling_per_token_logps"].double()
    diff = torch.where(mask, old - smp, 0.0)
    if mode.startswith("sequence"):
        diff = diff.sum(1, keepdim=True).expand_as(diff)
    r = diff.exp()
    lo_, hi_ = (-torch.inf if lo is None else lo), (torch.inf if hi is None else hi)
    weight = r.clamp(lo_, hi_) if mode.endswith("truncate") else torch.where((r < lo_) | (r > hi_), 0.0, r)
    ratio = torch.exp(logp - old)
    adv = inputs["advantages"].double()[:, None]
    psi = torch.minimum(ratio * adv, ratio.clamp(1 - trainer.epsilon_low, 1 + trainer.epsilon_high) * adv)
    m = (inputs["ictrl_selected"] & mask).double()
    per_token = -psi * weight * m
    norm = trainer.args.loss_normalization
    if norm == "dr_grpo":
        return per_token.sum() / (float(inputs["ictrl_num_responses"]) * trainer.args.max_completion_length)
    if norm.startswith("per_response"):
        den = m.sum(1) if norm == "per_response_selected" else mask.double().sum(1)
        return (per_token.sum(1) / den.clamp(min=1)).sum() / float(inputs["ictrl_num_responses"])
    return per_token.sum() / float(inputs["ictrl_num_tokens"])


@pytest.mark.parametrize(("selector", "norm", "mode"), CASES)
def test_importance_weighted_loss_with_every_selector(tiny_model_dir: Path, tmp_path: Path, selector: str,
                                                      norm: str, mode: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # token modes: the sampler reports 0.15 + 0.1·N(0, 1) above the trainer, ratios exp(-0.15 ± 0.1) on both sides
    # of 0.86; sequence modes: 0.1·N(0, 1) per token, a sequence's ratio exp(N(0, 0.1²·length)) on both sides of 1
    token = mode.startswith("token")
    lo, hi = (0.86, 1.2) if token else (0.55, 1.1)
    trainer = _vllm_trainer(monkeypatch, tiny_model_dir, tmp_path, shift=0.15 if token else 0.0, jitter=0.1,
                            token_selector=selector, loss_normalization=norm,
                            epsilon_high=0.28, vllm_importance_sampling_mode=mode,
                            vllm_importance_sampling_clip_min=lo, vllm_importance_sampling_clip_max=hi)
    trainer.model.train()
    inputs = trainer._prepare_inputs(_inputs(trainer))
    assert "old_per_token_logps" in inputs and "sampling_per_token_logps" in inputs
    mask = inputs["completion_mask"].bool()
    gap = (inputs["sampling_per_token_logps"] - inputs["old_per_token_logps"])[mask]
    assert abs(float(gap.mean()) - (0.15 if token else 0.0)) < 0.05 and 0.05 < float(gap.std()) < 0.15
    # an off-policy π_θ, so the PPO ratio moves too
    with torch.no_grad():
        for p in trainer.model.parameters():
            p.add_(0.02 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
    got = trainer._compute_loss(trainer.model, inputs)
    expected = _reference(trainer, inputs, mode, lo, hi)
    got = got.detach()
    assert abs(float(got) - float(expected)) < 1e-5 * max(1.0, abs(float(expected))) and abs(float(expected)) > 1e-5
    metrics = trainer._metrics["train"]
    assert 0 < metrics["ictrl/is_ratio_mean"][-1] < 1.5 and 0 < metrics["ictrl/is_clipped_frac"][-1] < 1.0
    trainer.args.vllm_importance_sampling_correction = False
    plain = trainer._compute_loss(trainer.model, inputs)
    assert abs(float(plain.detach()) - float(got)) > 1e-6  # the weight changed the loss


def test_trains_two_steps_with_vllm_tis(tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    trainer = _vllm_trainer(monkeypatch, tiny_model_dir, tmp_path, shift=0.4, token_selector="ict", selection_topk=4,
                            vllm_importance_sampling_mode="token_truncate",
                            vllm_importance_sampling_clip_max=2.0)
    trainer.train()
    steps = [h for h in trainer.state.log_history if "loss" in h]
    assert len(steps) == 2
    for h in steps:  # ratio exp(-0.4) = 0.67 below the cap: weighted, never truncated
        assert h["ictrl/is_ratio_mean"] == pytest.approx(0.670, abs=0.01) and h["ictrl/is_clipped_frac"] == 0.0


def test_rollout_func_logprobs_get_the_weight_and_old_logprobs(tiny_model_dir: Path, tmp_path: Path) -> None:
    """A custom engine (TRL's rollout_func) reporting log-probs: the trainer computes π_old itself and weights."""
    model, tokenizer = _load(tiny_model_dir)

    def rollout(prompts: list[Any], trainer: Any) -> dict[str, Any]:
        ids = [tokenizer(p)["input_ids"] for p in prompts]
        completions = [w.stub_completion(p, i % trainer.num_generations) for i, p in enumerate(ids)]
        return {"prompt_ids": ids, "completion_ids": completions, "logprobs": [[-2.0] * len(c) for c in completions]}

    from ictrl.engine.trainer import ICTGRPOTrainer

    trainer = ICTGRPOTrainer(model=model, reward_funcs=w.digit_reward, train_dataset=w.make_dataset(),
                             processing_class=tokenizer, rollout_func=rollout,
                             args=w.make_config(tmp_path, token_selector="ict", vllm_importance_sampling_mode=
                                                "token_truncate", vllm_importance_sampling_clip_max=1.5))
    trainer.model.train()
    inputs = trainer._prepare_inputs(_inputs(trainer))
    assert "old_per_token_logps" in inputs  # computed by ictrl: TRL does so only for vLLM
    trainer._compute_loss(trainer.model, inputs)
    mask = inputs["completion_mask"].bool() & inputs["ictrl_selected"]
    r = torch.exp(inputs["old_per_token_logps"] + 2.0)[mask].clamp(max=1.5)
    assert trainer._metrics["train"]["ictrl/is_ratio_mean"][-1] == pytest.approx(float(r.mean()), rel=1e-5)


def test_config_accepts_trl_is_options_and_dr_grpo(tmp_path: Path) -> None:
    base = dict(output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to="none")
    cfg = ICTGRPOConfig(**base, use_vllm=True, vllm_importance_sampling_correction=True,
                        vllm_importance_sampling_mode="token_mask", vllm_importance_sampling_clip_min=0.5)
    assert cfg.vllm_importance_sampling_clip_max == 3.0  # TRL's default cap
    assert ICTGRPOConfig(**base, loss_type="dr_grpo").loss_normalization == "dr_grpo"
    assert ICTGRPOConfig(**base, token_selector="entropy", loss_normalization="dr_grpo").loss_normalization == \
        "dr_grpo"
    for overrides, field in [({"loss_type": "dr_grpo", "loss_normalization": "token_mean_all"}, "loss_normalization"),
                             ({"vllm_importance_sampling_mode": "token_clip"}, "vllm_importance_sampling_mode"),
                             ({"vllm_importance_sampling_clip_max": -1.0}, "vllm_importance_sampling_clip_max")]:
        with pytest.raises(ValueError, match=field):
            ICTGRPOConfig(**base, **overrides)
