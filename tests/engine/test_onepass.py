"""One pass serves all (ictrl.engine.stats_source): the statistics taken from the loss's forward give the same masks,
losses and gradients as the separate statistics pass (float64, tiny Qwen2), and the backbone runs the counted number
of times per optimizer step."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import TrainerCallback

import mp_worker as w
from ictrl.engine.stats_source import STATS_PATHS


class _GradRecorder(TrainerCallback):
    def __init__(self) -> None:
        self.grads: list[dict[str, torch.Tensor]] = []

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        self.grads.append({n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None})


def _run(model_dir: Path, tmp_path: Path, one_pass: bool, **overrides: Any) -> dict[str, Any]:
    """Train 2 optimizer steps; returns per-micro-batch selections/losses, per-step gradients, backbone calls."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float64)
    base = w.stub_trainer_class()

    class Recording(base):  # type: ignore[misc, valid-type]
        def _compute_loss(self, model: Any, inputs: dict[str, Any]) -> torch.Tensor:
            loss = super()._compute_loss(model, inputs)
            self.record.append((inputs["ictrl_selected"] & inputs["completion_mask"].bool(), loss.detach()))
            self.masks.append(inputs["completion_mask"].bool())
            return loss

    Recording.one_pass = one_pass
    Recording.record, Recording.masks = [], []
    recorder = _GradRecorder()
    trainer = Recording(model=model, reward_funcs=w.digit_reward,
                        args=w.make_config(tmp_path / str(one_pass), temperature=0.8, **overrides),
                        train_dataset=w.make_dataset(), processing_class=tokenizer, callbacks=[recorder])
    calls = [0]
    trainer.model.model.register_forward_pre_hook(lambda m, a: calls.__setitem__(0, calls[0] + 1))
    trainer.train()
    paths = [h["ictrl/stats_path"] for h in trainer.state.log_history if "ictrl/stats_path" in h]
    return {"record": Recording.record, "masks": Recording.masks, "grads": recorder.grads, "calls": calls[0], "paths": paths,
            "steps": trainer.state.global_step}


CASES = [
    # selector, overrides, expected path, backbone calls over 2 optimizer steps (one pass, separate pass)
    ("ict", {}, "training_forward", 2, 4),
    ("ict", {"sparse_backward": True}, "training_forward", 2, 4),
    ("entropy", {}, "training_forward", 2, 4),
    ("entropy", {"sparse_backward": True}, "training_forward", 2, 4),
    ("all", {}, "training_forward", 2, 4),
    ("stapo", {}, "training_forward", 2, 4),
    # num_iterations 2: one generation batch serves both steps; a selector that reads none selects at generation
    ("all", {"num_iterations": 2}, "training_forward", 3, 4),
    # two micro-batches per generation batch: a micro-batch does not hold the batch scope, the pass stays separate
    # (per step: the statistics pass in 2 chunks of 4 rows, then 2 loss micro-batches)
    ("ict", {"per_device_train_batch_size": 4, "gradient_accumulation_steps": 2}, "separate", 8, 8),
]


@pytest.mark.parametrize(("selector", "overrides", "path", "calls_one", "calls_sep"), CASES,
                         ids=[f"{c[0]}-{'-'.join(f'{k}={v}' for k, v in c[1].items()) or 'default'}" for c in CASES])
def test_one_pass_equals_separate_pass_and_counts_forwards(tiny_model_dir: Path, tmp_path: Path, selector: str,
                                                           overrides: dict[str, Any], path: str, calls_one: int,
                                                           calls_sep: int) -> None:
    kwargs = dict(token_selector=selector, beta=0.0, **overrides)
    one = _run(tiny_model_dir, tmp_path, True, **kwargs)
    sep = _run(tiny_model_dir, tmp_path, False, **kwargs)
    assert one["steps"] == sep["steps"] == 2
    assert one["paths"] and set(one["paths"]) == {STATS_PATHS[path]}
    assert set(sep["paths"]) == {STATS_PATHS["separate"]}
    assert (one["calls"], sep["calls"]) == (calls_one, calls_sep)
    assert len(one["record"]) == len(sep["record"]) > 0
    tol = dict(rtol=1e-9, atol=1e-12)  # the training forward's own log-probs are float64 here
    for (sel_a, loss_a), (sel_b, loss_b) in zip(one["record"], sep["record"]):
        assert torch.equal(sel_a, sel_b)
        torch.testing.assert_close(loss_a, loss_b, **tol)
    if selector != "all":
        assert any(int(s.sum()) < int(m.sum()) for (s, _), m in zip(sep["record"], sep["masks"]))
    assert len(one["grads"]) == len(sep["grads"]) == 2
    for ga, gb in zip(one["grads"], sep["grads"]):
        assert ga.keys() == gb.keys() and len(ga) > 3
        for name, want in gb.items():
            torch.testing.assert_close(ga[name], want, msg=name, **tol)
    assert max(float(v.abs().max()) for g in sep["grads"] for v in g.values()) > 1e-6


def test_fused_head_statistics_equal_the_sweep(tiny_model_dir: Path, tmp_path: Path) -> None:
    """TRL's fused head (log-probs, entropy, log Σp²) gives the statistics of the sweep: float64 reference."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ictrl.engine.heads import backbone
    from ictrl.engine.stats_source import Wants, fused_forward, stats_from_fused

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float64)
    trainer = w.stub_trainer_class()(model=model, reward_funcs=w.digit_reward,
                                     args=w.make_config(tmp_path, token_selector="entropy", temperature=0.7),
                                     train_dataset=w.make_dataset(), processing_class=tokenizer)
    trainer.model.train()
    batch = trainer._prepare_inputs([{"prompt": p} for p in w.PROMPTS[:2] for _ in range(4)])
    ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], 1)
    am = torch.cat([batch["prompt_mask"], batch["completion_mask"]], 1)
    mask = batch["completion_mask"].bool()
    T = mask.size(1)
    with torch.no_grad():
        fused = fused_forward(trainer.model, ids, am, T, trainer.accelerator.autocast,
                              Wants(hidden=backbone(trainer.accelerator, trainer.model)))
        lss, hidden = fused.log_sum_sq, fused.hidden
        logits = trainer.model(input_ids=ids, attention_mask=am).logits[:, -T - 1:-1]
        plain = trainer.model(input_ids=ids, attention_mask=am, labels=ids, fused_lm_head=True)
        no_lss = fused_forward(trainer.model, ids, am, T, trainer.accelerator.autocast, Wants(sum_sq=False)).log_sum_sq
    assert lss is not None and hidden is not None and hidden.shape[:2] == mask.shape
    # TRL's own calls and fused_forward(sum_sq=False) skip log Σp² (one multiply and sum per logit tile)
    assert plain.log_sum_sq_probs is None and plain.entropy is not None and no_lss is None
    got = stats_from_fused(fused, mask)
    want = w.naive_stats(logits, batch["completion_ids"], mask, 0.7)
    for field, ref in want.items():
        torch.testing.assert_close(getattr(got, field).double(), ref, rtol=1e-5, atol=1e-6, msg=field)
