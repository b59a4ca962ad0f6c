"""ICTGRPOConfig.sparse_backward: the trainer's loss through ictrl.core.logprobs equals the dense (TRL fused) path."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

import mp_worker as w
from ictrl.engine.config import ICTGRPOConfig


def _trainer(model_dir: Path, tmp_path: Path, **overrides: Any) -> Any:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    return w.stub_trainer_class()(model=model, reward_funcs=w.digit_reward, args=w.make_config(tmp_path, **overrides),
                                  train_dataset=w.make_dataset(), processing_class=tokenizer)


def test_config_sparse_backward_defaults_off_and_validates(tmp_path: Path) -> None:
    cfg = ICTGRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to="none")
    assert cfg.sparse_backward is False
    with pytest.raises(ValueError, match="sparse_backward"):
        ICTGRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to="none", sparse_backward="yes")


@pytest.mark.parametrize(("selector", "beta"), [("ict", 0.0), ("all", 0.0), ("ict", 0.1)])
def test_sparse_loss_and_gradients_equal_dense(tiny_model_dir: Path, tmp_path: Path, selector: str,
                                               beta: float) -> None:
    trainer = _trainer(tiny_model_dir, tmp_path, token_selector=selector, temperature=0.8, beta=beta,
                       epsilon_high=0.28)
    trainer.model.train()
    inputs = trainer._prepare_inputs([{"prompt": p} for p in w.PROMPTS[:2] for _ in range(trainer.num_generations)])
    w.select_now(trainer, inputs)
    selected, mask = inputs["ictrl_selected"], inputs["completion_mask"].bool()
    assert 0 < int((selected & mask).sum()) < int(mask.sum()) or selector == "all"
    # Off-policy old log-probs so the ratios leave 1 and both clip branches can engage.
    g = torch.Generator().manual_seed(0)
    inputs["old_per_token_logps"] = -5.0 + 0.4 * torch.randn(mask.shape, generator=g)

    results = {}
    for sparse in (False, True):
        trainer.args.sparse_backward = sparse
        trainer.model.zero_grad(set_to_none=True)
        loss = trainer._compute_loss(trainer.model, inputs)
        loss.backward()
        grads = {n: p.grad.clone() for n, p in trainer.model.named_parameters() if p.grad is not None}
        results[sparse] = (loss.detach(), grads)
    (dense_loss, dense_grads), (sparse_loss, sparse_grads) = results[False], results[True]
    assert abs(float(dense_loss)) > 1e-4
    torch.testing.assert_close(sparse_loss, dense_loss, rtol=1e-5, atol=1e-6)
    assert sparse_grads.keys() == dense_grads.keys() and len(dense_grads) > 3
    for name, want in dense_grads.items():
        torch.testing.assert_close(sparse_grads[name], want, rtol=1e-4, atol=1e-6, msg=name)
    assert max(float(v.abs().max()) for v in dense_grads.values()) > 1e-4


def test_sparse_backward_trains_and_logs(tiny_model_dir: Path, tmp_path: Path) -> None:
    trainer = _trainer(tiny_model_dir, tmp_path, token_selector="ict", sparse_backward=True)
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    logs = [h for h in trainer.state.log_history if "loss" in h]
    assert len(logs) == 2 and all(torch.isfinite(torch.tensor(float(h["loss"]))) for h in logs)
    assert any(not torch.equal(p, before[n]) for n, p in trainer.model.named_parameters())
