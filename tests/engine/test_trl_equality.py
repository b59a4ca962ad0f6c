"""With ``token_selector: all`` and only TRL options set, ICTGRPOTrainer's step equals TRL's stock GRPOTrainer's.

On one batch the two losses and their gradients are compared (TRL's own ``GRPOTrainer._compute_loss`` run on the
same trainer, batch and weights; a plain-SGD step is lr x gradient, so equal gradients are equal steps), for every
loss type of TRL 1.16 and every loss option. Old log-probs are moved off the current policy (as on the second
update of num_iterations > 1), so ratios leave 1, both clip branches engage and the KL bias correction is visible.
One end-to-end test trains one SGD step with each trainer class and compares the weights."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from trl import GRPOTrainer

import mp_worker as w
from ictrl.core.loss import LOSS_TYPES
from rollout_helpers import _inputs, _vllm_trainer
from test_trainer import _load, _trainer


def _off_policy(trainer: Any, inputs: dict[str, Any], spread: float = 0.3) -> dict[str, Any]:
    """Old (and reference) log-probs away from the current policy, so every ratio-dependent option acts."""
    mask = inputs["completion_mask"].bool()
    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
    attention = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
    with torch.no_grad():
        logp, _, _ = GRPOTrainer._get_per_token_logps_and_entropies(trainer, trainer.model, ids, attention,
                                                                    mask.size(1))
    g = torch.Generator().manual_seed(3)
    inputs["old_per_token_logps"] = logp + spread * torch.randn(logp.shape, generator=g)
    if "ref_per_token_logps" in inputs:
        inputs["ref_per_token_logps"] = logp + 0.5 * torch.randn(logp.shape, generator=g)
    return inputs


def _step(trainer: Any, inputs: dict[str, Any], trl: bool) -> tuple[float, dict[str, torch.Tensor]]:
    """(loss, gradients) of one micro-batch under ictrl's loss or TRL's own."""
    trainer.model.zero_grad(set_to_none=True)
    batch = dict(inputs)
    loss = GRPOTrainer._compute_loss(trainer, trainer.model, batch) if trl else trainer._compute_loss(
        trainer.model, batch)
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in trainer.model.named_parameters() if p.grad is not None}
    return float(loss.detach()), grads


def _assert_same_step(trainer: Any, inputs: dict[str, Any]) -> dict[str, torch.Tensor]:
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = trainer.args.gradient_accumulation_steps
    ours, g_ours = _step(trainer, inputs, trl=False)
    theirs, g_trl = _step(trainer, inputs, trl=True)
    assert ours == pytest.approx(theirs, rel=1e-5, abs=1e-7)
    assert set(g_ours) == set(g_trl) and max(float(g.abs().max()) for g in g_trl.values()) > 1e-4
    for name in g_trl:
        torch.testing.assert_close(g_ours[name], g_trl[name], rtol=1e-4, atol=1e-7, msg=name)
    return g_ours


def _max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def _batch(tiny_model_dir: Path, tmp_path: Path, cls: type | None = None, **overrides: Any
           ) -> tuple[Any, dict[str, Any]]:
    trainer = _trainer(tiny_model_dir, tmp_path, cls or w.stub_trainer_class(one_pass=True),
                       **{"token_selector": "all", "epsilon_high": 0.28, **overrides})
    trainer.model.train()
    return trainer, _off_policy(trainer, trainer._prepare_inputs(_inputs(trainer)))


@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_every_loss_type_and_level_equals_trl(tiny_model_dir: Path, tmp_path: Path, loss_type: str,
                                             level: str) -> None:
    if loss_type == "vespo" and level == "sequence":
        pytest.skip("TRL: VESPO computes its sequence weight itself (importance_sampling_level='token')")
    extra = {"epsilon_high": 5.0} if loss_type == "cispo" else {}  # cispo's cap on the ratio
    trainer, inputs = _batch(tiny_model_dir, tmp_path, loss_type=loss_type, importance_sampling_level=level, **extra)
    assert trainer.args.loss_normalization == {"grpo": "per_response_all", "sapo": "per_response_all",
                                               "dr_grpo": "dr_grpo", "luspo": "sequence_sum"}.get(
        loss_type, "token_mean_all")
    _assert_same_step(trainer, inputs)


@pytest.mark.parametrize("option", [
    {"beta": 0.1, "use_bias_correction_kl": True},
    {"beta": 0.1, "use_bias_correction_kl": False},
    {"beta": 0.1, "use_bias_correction_kl": True, "importance_sampling_level": "sequence", "loss_type": "grpo"},
    {"delta": 1.1},
    {"entropy_coef": 0.05},
    {"off_policy_mask_threshold": 0.0},
    {"loss_type": "bnpo", "gradient_accumulation_steps": 2},
    {"per_device_train_batch_size": 4, "steps_per_generation": 2},  # dapo's count: the buffer's average
])
def test_each_loss_option_equals_trl_and_changes_the_step(tiny_model_dir: Path, tmp_path: Path,
                                                         option: dict[str, Any]) -> None:
    trainer, inputs = _batch(tiny_model_dir, tmp_path, **option)
    grads = _assert_same_step(trainer, inputs)
    if "gradient_accumulation_steps" in option or "steps_per_generation" in option:
        halves = trainer._buffered_inputs
        second = _off_policy(trainer, dict(halves[1]))  # the generation batch's other half
        _assert_same_step(trainer, second)
        # the halves differ in token count, so a per-half count and the buffer's average differ too
        assert int(halves[0]["completion_mask"].sum()) != int(halves[1]["completion_mask"].sum())
        return
    # the option is not a no-op on this batch: without it ictrl's step differs
    plain = {k: v for k, v in option.items() if k in ("loss_type", "importance_sampling_level", "beta")}
    if "use_bias_correction_kl" in option:
        plain["use_bias_correction_kl"] = not option["use_bias_correction_kl"]
    base, base_inputs = _batch(tiny_model_dir, tmp_path / "base", **plain)
    base_inputs["old_per_token_logps"] = inputs["old_per_token_logps"]
    if "ref_per_token_logps" in inputs:
        base_inputs["ref_per_token_logps"] = inputs["ref_per_token_logps"]
    base.current_gradient_accumulation_steps = 1
    _, base_grads = _step(base, base_inputs, trl=False)
    assert _max_diff(grads, base_grads) > 1e-6


def _eos_stub_class() -> type:
    """The stub generation, with an EOS ending every other completion (the rest are truncated)."""
    base = w.stub_trainer_class(one_pass=True)

    class EOSStub(base):  # type: ignore[misc, valid-type]
        def _generate_single_turn(self, prompt_ids: Any, *args: Any, **kwargs: Any) -> Any:
            completions, extra = super()._generate_single_turn(prompt_ids, *args, **kwargs)
            eos = self.processing_class.eos_token_id
            return [c + [eos] if i % 2 == 0 else c for i, c in enumerate(completions)], extra

    return EOSStub


def test_mask_truncated_completions_equals_trl(tiny_model_dir: Path, tmp_path: Path) -> None:
    trainer, inputs = _batch(tiny_model_dir, tmp_path, _eos_stub_class(), mask_truncated_completions=True)
    rows = inputs["completion_mask"].sum(1)
    assert int((rows == 0).sum()) > 0 and int((rows > 0).sum()) > 0  # truncated rows left the loss, others stay
    _assert_same_step(trainer, inputs)


@pytest.mark.parametrize("mode", ["token_truncate", "token_mask", "sequence_truncate", "sequence_mask"])
def test_vllm_importance_sampling_modes_equal_trl(monkeypatch: pytest.MonkeyPatch, tiny_model_dir: Path,
                                                  tmp_path: Path, mode: str) -> None:
    token = mode.startswith("token")
    lo, hi = (0.86, 1.2) if token else (0.55, 1.1)
    trainer = _vllm_trainer(monkeypatch, tiny_model_dir, tmp_path, shift=0.15 if token else 0.0, jitter=0.1, token_selector="all",
                            epsilon_high=0.28, beta=0.1, vllm_importance_sampling_mode=mode,
                            vllm_importance_sampling_clip_min=lo, vllm_importance_sampling_clip_max=hi)
    trainer.model.train()
    inputs = trainer._prepare_inputs(_inputs(trainer))
    assert "importance_sampling_ratio" in inputs  # TRL computed its own weights from the fake sampler's log-probs
    with torch.no_grad():  # an off-policy π_θ, so the PPO ratio moves too
        for p in trainer.model.parameters():
            p.add_(0.02 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
    g = torch.Generator().manual_seed(4)
    inputs["ref_per_token_logps"] = inputs["old_per_token_logps"] + 0.5 * torch.randn(
        inputs["old_per_token_logps"].shape, generator=g)
    _assert_same_step(trainer, inputs)


@pytest.mark.parametrize(("trl_args", "ictrl_args"), [
    # TRL's defaults (loss_type dapo), the class swapped; two micro-batches per step
    ({"per_device_train_batch_size": 4, "gradient_accumulation_steps": 2, "max_steps": 1}, {"token_selector": "all"}),
    # 20-Entropy with TRL's denominator and ties kept whole against TRL's own 80/20 switch, step for step
    ({"per_device_train_batch_size": 8, "max_steps": 2, "top_entropy_quantile": 0.2},
     {"token_selector": "entropy", "loss_normalization": "token_mean_all", "selection_options": {"ties": "include"}}),
])
def test_sgd_steps_equal_the_stock_trainer(tiny_model_dir: Path, tmp_path: Path, trl_args: dict[str, Any],
                                          ictrl_args: dict[str, Any]) -> None:
    """The same weights after training with TRL's GRPOTrainer and with ICTGRPOTrainer (plain SGD)."""

    StockStub = w.stock_stub_class()

    from trl import GRPOConfig

    common = dict(use_cpu=True, bf16=False, report_to="none", save_strategy="no", num_generations=4,
                  max_completion_length=12, optim="sgd", learning_rate=0.1, max_grad_norm=0.0, seed=0,
                  disable_tqdm=True, dataloader_num_workers=0)
    stock = {**common, **trl_args}
    ours = {**common, **{k: v for k, v in trl_args.items() if k != "top_entropy_quantile"}, **ictrl_args}
    params = []
    for cls, args in ((StockStub, GRPOConfig(output_dir=str(tmp_path / "trl"), **stock)),
                      (w.stub_trainer_class(one_pass=True), w.make_config(tmp_path / "ictrl", **ours))):
        model, tokenizer = _load(tiny_model_dir)
        trainer = cls(model=model, reward_funcs=w.digit_reward, args=args, train_dataset=w.make_dataset(),
                      processing_class=tokenizer)
        trainer.train()
        params.append({k: v.detach().clone() for k, v in trainer.model.named_parameters()})
    start = dict(_load(tiny_model_dir)[0].named_parameters())
    assert max(float((params[0][k] - start[k]).abs().max()) for k in start) > 1e-4
    for k in start:
        torch.testing.assert_close(params[1][k], params[0][k], rtol=1e-4, atol=1e-7, msg=k)


@pytest.mark.parametrize("option", [
    {},
    {"beta": 0.1, "entropy_coef": 0.05},  # KL over every token, the bonus over TRL's entropy mask
    {"loss_type": "grpo", "gradient_accumulation_steps": 2},
])
def test_top_entropy_quantile_equals_trl(tiny_model_dir: Path, tmp_path: Path, option: dict[str, Any]) -> None:
    trainer, inputs = _batch(tiny_model_dir, tmp_path, top_entropy_quantile=0.2, **option)
    assert trainer.args.kl_scope == "all_tokens"
    grads = _assert_same_step(trainer, inputs)
    trainer.top_entropy_quantile = 1.0  # the mask bites: without it the step differs
    _, plain = _step(trainer, inputs, trl=False)
    assert _max_diff(grads, plain) > 1e-6


def test_entropy20_equals_trl_top_entropy_quantile_where_the_masks_agree(tiny_model_dir: Path,
                                                                        tmp_path: Path) -> None:
    """One micro-batch per generation batch: 20-Entropy with TRL's all-token denominator and ties kept whole
    selects TRL's mask (every token whose entropy reaches the ceil(0.2 N)-th highest = entropy >= TRL's 0.8
    quantile) and gives TRL's step. The first position of a group's completions has the same context, so its G
    entropies tie: this batch has ties."""
    trainer, inputs = _batch(tiny_model_dir, tmp_path, token_selector="entropy", loss_normalization="token_mean_all",
                             selection_options={"ties": "include"})
    trainer.current_gradient_accumulation_steps = 1
    ours, g_ours = _step(trainer, inputs, trl=False)
    trainer.top_entropy_quantile = 0.2  # TRL's own switch, read by its _compute_loss
    theirs, g_trl = _step(trainer, inputs, trl=True)
    assert ours == pytest.approx(theirs, rel=1e-5, abs=1e-7)
    for name in g_trl:
        torch.testing.assert_close(g_ours[name], g_trl[name], rtol=1e-4, atol=1e-7, msg=name)
    assert 0.15 < trainer._metrics["train"]["ictrl/selected_frac"][0] < 0.3  # ictrl's selection: a fifth
    # ictrl's default keeps exactly ceil(0.2 N), the earlier position winning a tie: on this batch another step
    default, default_inputs = _batch(tiny_model_dir, tmp_path / "position", token_selector="entropy",
                                     loss_normalization="token_mean_all")
    default_inputs["old_per_token_logps"] = inputs["old_per_token_logps"]
    default.current_gradient_accumulation_steps = 1
    _, g_default = _step(default, default_inputs, trl=False)
    assert _max_diff(g_default, g_trl) > 1e-6


def test_moe_router_aux_loss_equals_trl(tmp_path: Path) -> None:
    """A Mixture-of-Experts model: TRL adds router_aux_loss_coef x the router's load-balancing loss; so does ictrl."""
    from transformers import Qwen2MoeConfig, Qwen2MoeForCausalLM

    from ictrl.models import build_byte_tokenizer

    tokenizer = build_byte_tokenizer()
    torch.manual_seed(0)
    config = Qwen2MoeConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, moe_intermediate_size=32,
                            shared_expert_intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
                            num_key_value_heads=2, num_experts=4, num_experts_per_tok=2, router_aux_loss_coef=0.5,
                            bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                            pad_token_id=tokenizer.pad_token_id)
    model_dir = tmp_path / "moe"
    Qwen2MoeForCausalLM(config).save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    trainer, inputs = _batch(model_dir, tmp_path / "out")
    assert trainer.aux_loss_enabled and trainer.router_aux_loss_coef == 0.5
    grads = _assert_same_step(trainer, inputs)
    trainer.aux_loss_enabled = False  # the router loss moves the step
    _, plain = _step(trainer, inputs, trl=False)
    assert _max_diff(grads, plain) > 1e-6


@pytest.mark.parametrize(("loss_type", "norm"), [("grpo", "per_response_selected"), ("bnpo", "token_mean_selected"),
                                                 ("dapo", "token_mean_all"), ("dr_grpo", "dr_grpo"),
                                                 ("grpo", "per_response_all")])
def test_a_selection_is_trls_loss_over_the_selection_as_its_token_mask(tiny_model_dir: Path, tmp_path: Path,
                                                                       loss_type: str, norm: str) -> None:
    """Where the normaliser is one TRL computes from its token mask (one micro-batch), the loss over a selection
    equals TRL's own ``_compute_loss`` with the selection multiplied into that mask (TRL's ``tool_mask``): per
    response over the selected tokens, the micro-batch's selected tokens, the generation batch's response tokens
    (dapo's ``num_items_in_batch``), dr_grpo's constant. Not ``per_response_all``: TRL's grpo divides by the
    masked count, so a denominator over all response tokens does not ride on the mask."""
    from ictrl.core.selection import register_selector

    @register_selector("test_even_positions")
    def even_positions(inputs: Any) -> torch.Tensor:
        return inputs.mask & (torch.arange(inputs.mask.size(1), device=inputs.mask.device) % 2 == 0)

    trainer, inputs = _batch(tiny_model_dir, tmp_path, token_selector="test_even_positions", loss_type=loss_type,
                             loss_normalization=norm)
    trainer.current_gradient_accumulation_steps = trainer.args.gradient_accumulation_steps
    ours, g_ours = _step(trainer, inputs, trl=False)
    response = inputs["completion_mask"].bool()
    selected = response & (torch.arange(response.size(1)) % 2 == 0)
    assert 0 < int(selected.sum()) < int(response.sum())
    theirs, g_trl = _step(trainer, {**inputs, "tool_mask": selected.to(inputs["completion_mask"].dtype)}, trl=True)
    if norm == "per_response_all":
        assert _max_diff(g_ours, g_trl) > 1e-4
        return
    assert ours == pytest.approx(theirs, rel=1e-5, abs=1e-7)
    for name in g_trl:
        torch.testing.assert_close(g_ours[name], g_trl[name], rtol=1e-4, atol=1e-7, msg=name)


def test_a_batch_trl_did_not_buffer_is_normalised_as_its_own_window(tiny_model_dir: Path, tmp_path: Path) -> None:
    """On the separate statistics path, a micro-batch the loss is handed directly (not one of TRL's buffered ones) gets
    its own normalisers; with one micro-batch per optimizer step they equal those of the buffered batch it copies."""
    trainer, inputs = _batch(tiny_model_dir, tmp_path, w.stub_trainer_class(one_pass=False), token_selector="ict",
                             gradient_accumulation_steps=1, steps_per_generation=1)
    trainer.current_gradient_accumulation_steps = 1
    copy = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in inputs.items()
            if not k.startswith("ictrl_num")}
    assert copy["completion_ids"] is not inputs["completion_ids"]
    buffered, g_buffered = _step(trainer, inputs, trl=False)
    alone, g_alone = _step(trainer, copy, trl=False)
    assert alone == pytest.approx(buffered, rel=1e-6, abs=1e-9) and abs(buffered) > 0
    assert _max_diff(g_alone, g_buffered) < 1e-6
