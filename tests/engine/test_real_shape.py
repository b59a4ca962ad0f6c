"""The trainer at the real width: Qwen2.5-0.5B's hidden size and heads, vocabulary 151,936, one layer."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import mp_worker as w


@pytest.mark.integration
def test_one_ict_step_with_sparse_backward_at_qwen25_width(tmp_path: Path) -> None:
    from ictrl.models import build_real_shape

    model, tokenizer = build_real_shape("qwen2.5-0.5b", num_layers=1, seed=0)
    tokenizer.padding_side = "left"
    assert (model.config.hidden_size, model.config.vocab_size, len(tokenizer)) == (896, 151936, 151936)
    # SGD: no optimizer state, so the test stays near 2 GB (weights and one gradient of 151M parameters).
    args = w.make_config(tmp_path, token_selector="ict", sparse_backward=True, max_steps=1, optim="sgd",
                         learning_rate=1e-2, max_completion_length=12)
    trainer = w.stub_trainer_class(one_pass=True)(model=model, reward_funcs=w.digit_reward, args=args,
                                                  train_dataset=w.make_dataset(), processing_class=tokenizer)
    watched = ("model.embed_tokens.weight", "model.layers.0.mlp.down_proj.weight")
    before = {n: p.detach().clone() for n, p in model.named_parameters() if n in watched}
    trainer.train()

    logs = [h for h in trainer.state.log_history if "loss" in h]
    assert len(logs) == 1 and torch.isfinite(torch.tensor(float(logs[0]["loss"])))
    assert logs[0]["ictrl/stats_path"] == 2.0  # statistics from the loss's own forward
    batch = trainer.recorded[0]
    mask = batch["completion_mask"].bool()
    assert 0 < logs[0]["ictrl/selected_frac"] < 1 and int(mask.sum()) > 8
    for name, p in model.named_parameters():
        if name in watched:
            assert not torch.equal(p.detach(), before[name]), name

    # The sparse head's loss equals TRL's fused head over all 151,936 logits on a fresh batch (separate pass, so
    # the batch carries its selection).
    w.separate_pass(trainer)
    trainer.model.train()
    inputs = trainer._prepare_inputs([{"prompt": p} for p in w.PROMPTS[:2] for _ in range(trainer.num_generations)])
    w.select_now(trainer, inputs)
    selected = inputs["ictrl_selected"] & inputs["completion_mask"].bool()
    assert 0 < int(selected.sum()) < int(inputs["completion_mask"].sum())
    noise = torch.randn(selected.shape, generator=torch.Generator().manual_seed(0))
    inputs["old_per_token_logps"] = -12.0 + 0.4 * noise  # off-policy, so the ratios leave 1
    losses = {}
    with torch.no_grad():
        for sparse in (False, True):
            trainer.args.sparse_backward = sparse
            losses[sparse] = trainer._compute_loss(trainer.model, inputs)
    assert abs(float(losses[False])) > 1e-4
    torch.testing.assert_close(losses[True], losses[False], rtol=1e-5, atol=1e-6)
