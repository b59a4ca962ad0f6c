"""ICTGRPOConfig / ICTGRPOTrainer on CPU with a tiny Qwen2 (tests/conftest.py ``tiny_model_dir``)."""

from __future__ import annotations

import inspect
import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch

import mp_worker as w
from ictrl.core import reference as core_ref
from ictrl.core.loss import LossExtras, LossSpec, policy_loss
from ictrl.engine.config import ICTGRPOConfig
from ictrl.engine.loss_inputs import check_local_groups, model_inputs
from ictrl.engine.trainer import ICTGRPOTrainer
from ictrl.core.selection import SelectionInputs, select

SELECTORS = ("all", "ict", "entropy", "stapo", "random", "frequent")


def _load(model_dir: Path) -> tuple[Any, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    tokenizer.padding_side = "left"
    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32), tokenizer


def _trainer(model_dir: Path, tmp_path: Path, cls: type = ICTGRPOTrainer, **overrides: Any) -> Any:
    model, tokenizer = _load(model_dir)
    return cls(model=model, reward_funcs=w.digit_reward, args=w.make_config(tmp_path, **overrides),
               train_dataset=w.make_dataset(), processing_class=tokenizer)


def _generation_inputs(trainer: Any, n_prompts: int = 2) -> list[dict[str, str]]:
    """The local generation batch TRL's sampler would hand over: each prompt repeated num_generations times."""
    return [{"prompt": p} for p in w.PROMPTS[:n_prompts] for _ in range(trainer.num_generations)]


def _response_mask(batch: dict[str, Any]) -> torch.Tensor:
    return batch["completion_mask"].bool()


# ------------------------------------------------------------------------------------------------- config


@pytest.mark.parametrize(
    ("selector", "ratio", "scope", "norm", "warmup"),
    [
        ("all", None, None, "token_mean_all", 0),  # TRL's default loss_type dapo
        ("ict", 0.1, "response", "per_response_selected", 10),
        ("entropy", 0.2, "batch", "token_mean_selected", 0),
        ("stapo", None, None, "token_mean_selected", 0),
        ("random", 0.1, "response", "per_response_selected", 10),
        ("frequent", 0.1, "response", "per_response_selected", 10),
    ],
)
def test_config_resolves_per_selector_defaults(tmp_path: Path, selector: str, ratio: float | None,
                                               scope: str | None, norm: str, warmup: int) -> None:
    cfg = ICTGRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to="none",
                        token_selector=selector, temperature=0.7, seed=5)
    assert (cfg.selection_ratio, cfg.selection_scope, cfg.loss_normalization, cfg.selection_warmup_steps) == (
        ratio, scope, norm, warmup)
    assert cfg.selection_temperature == 0.7 and cfg.selection_seed == 5


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"token_selector": "topk"}, "token_selector"),
        ({"selection_ratio": 0.0}, "selection_ratio"),
        ({"selection_ratio": 1.5}, "selection_ratio"),
        ({"token_selector": "stapo", "selection_ratio": 0.1}, "selection_ratio"),
        ({"token_selector": "entropy", "selection_scope": "group"}, "selection_scope"),
        ({"selection_scope": "sequence"}, "selection_scope"),
        ({"selection_warmup_steps": -1}, "selection_warmup_steps"),
        ({"loss_normalization": "mean"}, "loss_normalization"),
        ({"token_selector": "stapo", "selection_options": {"tau_p": 0.0}}, "selection_options: tau_p"),
        ({"token_selector": "stapo", "selection_options": {"q": 2.0}}, "selection_options: q"),
        ({"selection_temperature": 0.0}, "selection_temperature"),
        ({"stats_chunk_size": 0}, "stats_chunk_size"),
        ({"top_entropy_quantile": 0.2}, "top_entropy_quantile"),
        ({"loss_type": "ppo"}, "loss_type"),
        ({"importance_sampling_level": "response"}, "importance_sampling_level"),
        ({"token_selector": "ict", "loss_type": "vespo"}, "loss_type='vespo'"),
        ({"use_adaptive_entropy": True}, "use_adaptive_entropy"),
        ({"sparse_backward": True, "entropy_coef": 0.01}, "entropy_coef"),
        ({"sparse_backward": True, "kl_scope": "all_tokens", "beta": 0.1}, "kl_scope"),
        ({"kl_scope": "tokens"}, "kl_scope"),
        ({"delta": 0.0}, "delta"),
    ],
)
def test_config_rejects_bad_values_naming_the_field(tmp_path: Path, overrides: dict[str, Any], field: str) -> None:
    with pytest.raises(ValueError, match=field):
        ICTGRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to="none", **overrides)


def test_trainer_refuses_args_that_are_not_a_grpo_config(tiny_model_dir: Path, tmp_path: Path) -> None:
    """A trl.GRPOConfig is converted (tests/engine/test_trl_args.py); other arguments are refused in one line."""
    from transformers import TrainingArguments

    model, tokenizer = _load(tiny_model_dir)
    args = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to="none")
    with pytest.raises(ValueError, match="args must be an ICTGRPOConfig, got TrainingArguments"):
        ICTGRPOTrainer(model=model, reward_funcs=w.digit_reward, args=args, train_dataset=w.make_dataset(),
                       processing_class=tokenizer)


# ------------------------------------------------------------------------------------- pinned TRL surface


def test_overridden_trl_methods_match_pinned_version() -> None:
    """A TRL upgrade that renames or re-signs what we override must fail here, not silently bypass ictrl."""
    import trl
    from trl import GRPOTrainer
    from trl.trainer.utils import shuffle_sequence_dict, split_tensor_dict

    assert trl.__version__ == "1.16.0"

    def params(name: str) -> list[str]:
        return list(inspect.signature(getattr(GRPOTrainer, name)).parameters)

    assert params("_generate_and_score_completions") == ["self", "inputs"]
    assert params("_prepare_inputs") == ["self", "generation_batch"]
    assert params("_compute_loss") == ["self", "model", "inputs"]
    assert params("_get_per_token_logps_and_entropies")[:6] == [
        "self", "model", "input_ids", "attention_mask", "logits_to_keep", "batch_size"]
    assert params("_generate_single_turn")[:5] == [  # the test stub of generation overrides it
        "self", "prompt_ids", "images", "multimodal_fields", "num_generations"]
    assert GRPOTrainer.loss_is_scaled_for_ga is True  # our loss is backpropagated as returned
    # what the loss reuses from TRL: its entropy mask, its dense forward's entropy / router loss, its switches
    assert params("get_high_entropy_mask") == ["self", "entropies", "mask", "threshold"]
    assert {"compute_entropy", "compute_aux_loss"} <= set(params("_get_per_token_logps_and_entropies"))
    init = inspect.getsource(GRPOTrainer.__init__)
    for attr in ("aux_loss_enabled", "router_aux_loss_coef", "top_entropy_quantile", "entropy_coef",
                 "use_adaptive_entropy"):
        assert f"self.{attr} = " in init
    # ICTGRPOTrainer.entropy_bonus is TRL's switch for its entropy bonus, derived as TRL derives it
    assert "= self.entropy_coef != 0.0 or self.use_adaptive_entropy\n" in init
    for name in ("_generate_and_score_completions", "_compute_loss"):
        assert getattr(ICTGRPOTrainer, name) is not getattr(GRPOTrainer, name)
    # How TRL carries our tensors through the buffer: [B, ...] rows shuffled/split together, 0-d kept whole.
    batch = {"x": torch.arange(8), "sel": torch.arange(8)[:, None].expand(8, 3) % 2 == 0, "n": torch.tensor(5.0)}
    shuffled = shuffle_sequence_dict(batch)
    assert torch.equal(shuffled["sel"][:, 0], shuffled["x"] % 2 == 0) and shuffled["n"] is batch["n"]
    parts = split_tensor_dict(shuffled, 2)
    assert [p["sel"].shape[0] for p in parts] == [4, 4] and all(p["n"] is batch["n"] for p in parts)


# -------------------------------------------------------------------------------------- every selector


@pytest.mark.parametrize("selector", SELECTORS)
def test_each_selector_trains_two_steps_and_logs(tiny_model_dir: Path, tmp_path: Path, selector: str) -> None:
    # tau_p = 0.01 > 1/259 so STAPO has candidates on a random model (at 0.002 it silences nothing).
    trainer = _trainer(tiny_model_dir, tmp_path, token_selector=selector,
                       selection_options={"tau_p": 0.01} if selector == "stapo" else None)
    before = {k: v.detach().clone() for k, v in trainer.model.named_parameters()}
    trainer.train()
    moved = max((v.detach() - before[k]).abs().max().item() for k, v in trainer.model.named_parameters())
    steps = [h for h in trainer.state.log_history if "loss" in h]
    assert len(steps) == 2
    assert moved > 0 and all(h["grad_norm"] > 0 for h in steps)
    for key in ("reward", "ictrl/selected_frac", "ictrl/h1/all", "ictrl/h2/all", "ictrl/purity/all",
                "ictrl/h1/selected", "ictrl/h2/selected", "ictrl/purity/selected", "ictrl/clip_frac",
                "ictrl/selected/high_entropy_frac", "ictrl/stats_time", "ictrl/warmup"):
        assert all(key in h for h in steps), key
    frac = [h["ictrl/selected_frac"] for h in steps]
    if selector == "all":
        assert frac == [1.0, 1.0]
    elif selector in ("ict", "random"):
        assert all(0.1 <= f < 0.3 for f in frac)  # ceil(10%) of 4–12 tokens per response
    elif selector == "frequent":
        assert all(0.7 < f <= 0.9 for f in frac)
    elif selector == "entropy":
        assert all(abs(f - 0.2) < 0.02 for f in frac)
    else:
        assert all(f < 1.0 for f in frac)
    if selector in ("ict", "frequent"):
        assert all("ictrl/ict_score/selected" in h for h in steps)


def test_all_computes_its_selection_metrics_only_on_logged_steps(tiny_model_dir: Path, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """log Σp² and the selection metrics are for the log only: steps off the logging cadence skip them, and the
    training is the same."""
    from ictrl.engine import stats_source

    params = []
    for logging_steps in (1, 2):
        trainer = _trainer(tiny_model_dir, tmp_path / str(logging_steps), token_selector="all", max_steps=4,
                           logging_steps=logging_steps)
        sum_sq: list[bool] = []

        def recording(*args: Any, _real: Any = stats_source.fused_forward, **kwargs: Any) -> Any:
            out = _real(*args, **kwargs)
            sum_sq.append(out[2] is not None)
            return out

        monkeypatch.setattr(stats_source, "fused_forward", recording)
        trainer.train()
        params.append([p.detach().clone() for p in trainer.model.parameters()])
        rows = [h for h in trainer.state.log_history if "loss" in h]
        assert [h["step"] for h in rows] == list(range(logging_steps, 5, logging_steps))
        assert all("ictrl/h2/all" in h and "ictrl/purity/selected" in h for h in rows)
        assert sum_sq == [True] * 4 if logging_steps == 1 else [False, True, False, True]
    assert all(torch.equal(a, b) for a, b in zip(*params))


# ----------------------------------------------------------------- statistics and mask = the core's


def test_statistics_and_ict_mask_match_naive_reference(tiny_model_dir: Path, tmp_path: Path) -> None:
    # stats_chunk_size=16 with 8 rows: the LM head runs over blocks of 2 positions.
    trainer = _trainer(tiny_model_dir, tmp_path, w.stub_trainer_class(), token_selector="ict", temperature=0.8,
                       stats_chunk_size=16)
    trainer.model.train()
    batch = trainer._generate_and_score_completions(_generation_inputs(trainer))
    w.select_now(trainer, batch)
    mask = _response_mask(batch)
    group_ids = torch.arange(mask.size(0)) // trainer.num_generations
    stats, js = trainer.stats_source(trainer.model, *model_inputs(batch), mask, group_ids)

    ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
    attention = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
    P, T = batch["prompt_ids"].size(1), batch["completion_ids"].size(1)
    with torch.no_grad():
        logits = trainer.model(input_ids=ids, attention_mask=attention).logits[:, P - 1:P + T - 1]
    ref = w.naive_stats(logits, batch["completion_ids"], mask, 0.8)
    ref_js = core_ref.group_js(logits, mask, group_ids, 0.8)
    for name, value in ref.items():
        torch.testing.assert_close(getattr(stats, name).double(), value, atol=2e-5, rtol=1e-5, msg=name)
    torch.testing.assert_close(js.double(), ref_js, atol=1e-6, rtol=1e-4)
    assert float(ref_js[mask].max()) > 0  # the check is not vacuous

    # TRL's fused log-probs (the loss path) see the same positions and temperature.
    fused, _, _ = trainer._get_per_token_logps_and_entropies(trainer.model, ids, attention, T)
    torch.testing.assert_close(torch.where(mask, fused, 0.0).double(), ref["logprob"], atol=2e-5, rtol=1e-5)

    expected = select("ict", SelectionInputs(mask=mask, ict_score=ref_js.float(), group_ids=group_ids),
                      ratio=0.1, scope="response")
    assert torch.equal(batch["ictrl_selected"], expected)
    n = mask.sum(1)
    assert torch.equal(batch["ictrl_selected"].sum(1), torch.tensor([math.ceil(0.1 * int(k)) for k in n]))


def test_runtime_group_check_rejects_split_groups() -> None:
    prompt_ids = torch.tensor([[5, 6], [5, 6], [5, 6], [5, 7]])
    batch = {"prompt_ids": prompt_ids, "prompt_mask": torch.ones_like(prompt_ids)}
    with pytest.raises(RuntimeError, match="share"):
        check_local_groups(batch, 4)
    with pytest.raises(RuntimeError, match="multiple of num_generations"):
        check_local_groups({k: v[:3] for k, v in batch.items()}, 2)
    check_local_groups({"prompt_ids": prompt_ids[:2], "prompt_mask": batch["prompt_mask"][:2]}, 2)


# ---------------------------------------------------------------------------------- loss normalisation


@pytest.mark.parametrize("norm", ["per_response_selected", "token_mean_selected", "token_mean_all",
                                  "per_response_all"])
def test_trainer_loss_equals_policy_loss(tiny_model_dir: Path, tmp_path: Path, norm: str) -> None:
    trainer = _trainer(tiny_model_dir, tmp_path, w.stub_trainer_class(), token_selector="ict",
                       loss_normalization=norm, epsilon_high=0.28)
    trainer.model.train()
    inputs = trainer._prepare_inputs(_generation_inputs(trainer))
    w.select_now(trainer, inputs)
    mask = _response_mask(inputs)
    selected = inputs["ictrl_selected"]

    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
    attention = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
    P, T = inputs["prompt_ids"].size(1), inputs["completion_ids"].size(1)
    with torch.no_grad():
        logits = trainer.model(input_ids=ids, attention_mask=attention).logits[:, P - 1:P + T - 1]
    logp = torch.log_softmax(logits.double(), -1).gather(-1, inputs["completion_ids"][..., None]).squeeze(-1)
    # An off-policy old log-prob so ratios move away from 1 and both clip branches engage.
    g = torch.Generator().manual_seed(0)
    old = (logp + 0.4 * torch.randn(logp.shape, generator=g, dtype=torch.float64)).float()
    inputs["old_per_token_logps"] = old
    got = trainer._compute_loss(trainer.model, inputs)
    # the loss attached the normalisers to the micro-batch it was handed
    assert float(inputs["ictrl_num_responses"]) == mask.size(0)
    expected_tokens = selected.sum() if norm == "token_mean_selected" else mask.sum()
    assert float(inputs["ictrl_num_tokens"]) == float(expected_tokens)

    ref, _ = policy_loss(logp.float(), old, inputs["advantages"], mask, selected,
                         LossSpec(norm=norm, eps_low=0.2, eps_high=0.28),
                         LossExtras(num_responses=inputs["ictrl_num_responses"], num_tokens=inputs["ictrl_num_tokens"]))
    torch.testing.assert_close(got, ref, atol=1e-6, rtol=1e-5)

    # Independent float64 formula of the same objective.
    ratio = torch.exp(logp - old.double())
    adv = inputs["advantages"].double()[:, None]
    psi = torch.minimum(ratio * adv, ratio.clamp(0.8, 1.28) * adv)
    m = (selected & mask).double()
    if norm.startswith("per_response"):
        den = m.sum(1) if norm == "per_response_selected" else mask.double().sum(1)
        manual = -((psi * m).sum(1) / den.clamp(min=1)).sum() / mask.size(0)
    else:
        manual = -(psi * m).sum() / float(inputs["ictrl_num_tokens"])
    assert abs(float(got) - float(manual)) < 1e-5 and abs(float(manual)) > 1e-4


# --------------------------------------------------------------------------------------------- warm-up


def test_warmup_selects_everything_then_the_sparse_mask(tiny_model_dir: Path, tmp_path: Path) -> None:
    trainer = _trainer(tiny_model_dir, tmp_path, w.stub_trainer_class(), token_selector="ict",
                       selection_warmup_steps=1)
    trainer.train()
    first, second = trainer.recorded
    assert torch.equal(first["ictrl_selected"], _response_mask(first))
    n = _response_mask(second).sum(1)
    assert torch.equal(second["ictrl_selected"].sum(1), torch.tensor([math.ceil(0.1 * int(k)) for k in n]))
    assert int(second["ictrl_selected"].sum()) < int(n.sum())
    steps = [h for h in trainer.state.log_history if "loss" in h]
    assert [h["ictrl/warmup"] for h in steps] == [1.0, 0.0]


# -------------------------------------------------------------------------- gradient accumulation


@pytest.mark.parametrize("selector", ["ict", "entropy"])  # per_response_selected and token_mean_selected
def test_gradient_accumulation_equals_one_big_batch(tiny_model_dir: Path, tmp_path: Path, selector: str) -> None:
    """One optimizer step over 2 micro-batches of 4 equals one micro-batch of 8 (SGD, no clipping: run_one_step)."""
    big = w.run_one_step(tmp_path / "big", str(tiny_model_dir), selector, per_device=8, grad_accum=1)
    split = w.run_one_step(tmp_path / "split", str(tiny_model_dir), selector, per_device=4, grad_accum=2)
    assert len(big["losses"]) == 1 and len(split["losses"]) == 2
    assert torch.equal(big["batches"][0]["ictrl_selected"], split["batches"][0]["ictrl_selected"])
    model, _ = _load(tiny_model_dir)
    start = dict(model.named_parameters())
    moved = max((big["params"][k] - start[k].detach()).abs().max().item() for k in start)
    assert moved > 1e-3
    for k in start:
        torch.testing.assert_close(split["params"][k], big["params"][k], atol=1e-6, rtol=1e-5, msg=k)


# ------------------------------------------------------------------------------------------ KL and eval


def test_kl_penalty_uses_reference_logprobs(tiny_model_dir: Path, tmp_path: Path) -> None:
    trainer = _trainer(tiny_model_dir, tmp_path, w.stub_trainer_class(), token_selector="ict", beta=0.1)
    trainer.model.train()
    inputs = trainer._prepare_inputs(_generation_inputs(trainer))
    w.select_now(trainer, inputs)
    assert "ref_per_token_logps" in inputs  # TRL's reference pass, kept as is
    mask, selected = _response_mask(inputs), inputs["ictrl_selected"]
    g = torch.Generator().manual_seed(1)
    inputs["ref_per_token_logps"] = inputs["ref_per_token_logps"] + 0.5 * torch.randn(mask.shape, generator=g)
    got = trainer._compute_loss(trainer.model, inputs)
    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
    attention = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
    with torch.no_grad():
        logp, _, _ = trainer._get_per_token_logps_and_entropies(trainer.model, ids, attention, mask.size(1))
    spec = LossSpec(norm="per_response_selected")
    extras = LossExtras(num_responses=inputs["ictrl_num_responses"], ref_logprobs=inputs["ref_per_token_logps"])
    ref, _ = policy_loss(logp, logp, inputs["advantages"], mask, selected, replace(spec, kl_coef=0.1), extras)
    no_kl, _ = policy_loss(logp, logp, inputs["advantages"], mask, selected, spec, extras)
    torch.testing.assert_close(got.detach(), ref, atol=1e-6, rtol=1e-5)
    assert float(ref - no_kl) > 1e-4
    assert trainer._metrics["train"]["ictrl/kl"][-1] > 0


def test_evaluate_logs_selection_metrics(tiny_model_dir: Path, tmp_path: Path) -> None:
    model, tokenizer = _load(tiny_model_dir)
    trainer = ICTGRPOTrainer(model=model, reward_funcs=w.digit_reward,
                             args=w.make_config(tmp_path, token_selector="ict", per_device_eval_batch_size=8),
                             train_dataset=w.make_dataset(), eval_dataset=w.make_dataset(4),
                             processing_class=tokenizer)
    result = trainer.evaluate()
    assert math.isfinite(result["eval_loss"])
    assert 0.1 <= result["eval_ictrl/selected_frac"] < 0.3


# ------------------------------------------------------------------------------------- custom selectors


def test_a_registered_selector_trains_with_its_options(tiny_model_dir: Path, tmp_path: Path) -> None:
    """The registry is open: a selector registered in user code is usable by name, gets selection_options, and
    the trainer computes the ICT score for it because it declares it in ``needs``."""
    from ictrl.core.selection import SELECTORS, register_selector

    seen: list[dict[str, Any]] = []

    @register_selector("test_lowest_u", needs=("ict_score",))
    def lowest_u(inputs: SelectionInputs, *, count: int = 1) -> torch.Tensor:
        seen.append({"count": count, "has_u": inputs.ict_score is not None})
        u = inputs.ict_score.masked_fill(~inputs.mask, float("inf"))
        idx = u.argsort(dim=1)[:, :count]
        return torch.zeros_like(inputs.mask).scatter(1, idx, True)

    try:
        with pytest.raises(ValueError, match="selection_options"):
            w.make_config(tmp_path, token_selector="ict", selection_options={"count": 2})
        trainer = _trainer(tiny_model_dir, tmp_path, token_selector="test_lowest_u", selection_options={"count": 2})
        assert trainer.args.loss_normalization == "per_response_selected"
        trainer.train()
    finally:
        SELECTORS.pop("test_lowest_u", None)
    assert seen and all(s == {"count": 2, "has_u": True} for s in seen)
    steps = [h for h in trainer.state.log_history if "loss" in h]
    # 2 of the 4-12 active tokens per response are selected.
    assert all(0.1 < h["ictrl/selected_frac"] <= 0.5 for h in steps)


def test_unknown_selector_names_the_registry(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="register_selector"):
        w.make_config(tmp_path, token_selector="no_such_selector")


# ------------------------------------------------------------------------------- sparse top-K ICT score


@pytest.mark.parametrize("value", [0, -3, 2.5, True, "8"])
def test_config_rejects_bad_selection_topk(tmp_path: Path, value: Any) -> None:
    with pytest.raises(ValueError, match="selection_topk"):
        w.make_config(tmp_path, selection_topk=value)


def test_selection_topk_full_vocab_equals_exact_and_small_k_trains(tiny_model_dir: Path, tmp_path: Path) -> None:
    """K = V: the top-K path gives the exact score and mask. K = 8: a different score in [0, log 2] that trains."""
    common = dict(token_selector="ict", temperature=0.8, stats_chunk_size=16)  # head blocks of 2 positions
    exact = _trainer(tiny_model_dir, tmp_path / "exact", w.stub_trainer_class(), **common)
    V = exact.model.get_output_embeddings().out_features
    assert V == 259
    full = _trainer(tiny_model_dir, tmp_path / "full", w.stub_trainer_class(), selection_topk=V, **common)
    small = _trainer(tiny_model_dir, tmp_path / "small", w.stub_trainer_class(), selection_topk=8, **common)
    batches = {}
    for name, trainer in (("exact", exact), ("full", full), ("small", small)):
        trainer.model.train()
        batches[name] = trainer._generate_and_score_completions(_generation_inputs(trainer))
        w.select_now(trainer, batches[name])
    batch = batches["exact"]
    assert torch.equal(batches["full"]["completion_ids"], batch["completion_ids"])  # same stub generations
    mask = _response_mask(batch)
    group_ids = torch.arange(mask.size(0)) // exact.num_generations

    stats_exact, js_exact = exact.stats_source(exact.model, *model_inputs(batch), mask, group_ids)
    stats_full, js_full = full.stats_source(full.model, *model_inputs(batch), mask, group_ids)
    stats_small, js_small = small.stats_source(small.model, *model_inputs(batch), mask, group_ids)
    ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
    attention = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
    P, T = batch["prompt_ids"].size(1), batch["completion_ids"].size(1)
    with torch.no_grad():
        logits = exact.model(input_ids=ids, attention_mask=attention).logits[:, P - 1:P + T - 1]
    ref_js = core_ref.group_js(logits, mask, group_ids, 0.8)
    torch.testing.assert_close(js_full.double(), ref_js, atol=1e-6, rtol=1e-4)
    torch.testing.assert_close(js_full, js_exact, atol=1e-6, rtol=1e-4)
    for name in ("entropy", "logprob"):  # the token statistics do not depend on the JS path
        assert torch.equal(getattr(stats_full, name), getattr(stats_exact, name))
        assert torch.equal(getattr(stats_small, name), getattr(stats_exact, name))
    assert torch.equal(batches["full"]["ictrl_selected"], batch["ictrl_selected"])
    expected = select("ict", SelectionInputs(mask=mask, ict_score=ref_js.float(), group_ids=group_ids),
                      ratio=0.1, scope="response")
    assert torch.equal(batches["full"]["ictrl_selected"], expected)

    # K = 8 of 259: an approximation, still a JS divergence, zero off the mask.
    assert float((js_small.double() - ref_js).abs().max()) > 1e-3
    assert bool((js_small >= 0).all()) and bool((js_small <= math.log(2) + 1e-6).all())
    assert bool((js_small[~mask] == 0).all()) and float(js_small[mask].max()) > 0
    n = mask.sum(1)
    assert torch.equal(batches["small"]["ictrl_selected"].sum(1), torch.tensor([math.ceil(0.1 * int(k)) for k in n]))

    trainer = _trainer(tiny_model_dir, tmp_path / "train", selection_topk=8)
    before = {k: v.detach().clone() for k, v in trainer.model.named_parameters()}
    trainer.train()
    steps = [h for h in trainer.state.log_history if "loss" in h]
    assert len(steps) == 2 and all(h["grad_norm"] > 0 for h in steps)
    assert all("ictrl/ict_score/selected" in h and 0.1 <= h["ictrl/selected_frac"] < 0.3 for h in steps)
    assert max((v.detach() - before[k]).abs().max().item() for k, v in trainer.model.named_parameters()) > 0



@pytest.mark.parametrize("overrides", [
    {"loss_type": "cispo", "epsilon_high": 4.0, "importance_sampling_level": "sequence"},
    {"loss_type": "sapo", "beta": 0.05, "kl_scope": "all_tokens", "use_bias_correction_kl": True},
    {"loss_type": "luspo", "importance_sampling_level": "sequence", "sparse_backward": True, "beta": 0.05},
])
def test_trl_loss_types_train_with_a_selector(tiny_model_dir: Path, tmp_path: Path, overrides: dict[str, Any]) -> None:
    trainer = _trainer(tiny_model_dir, tmp_path, w.stub_trainer_class(), token_selector="ict", **overrides)
    trainer.train()
    steps = [h for h in trainer.state.log_history if "loss" in h]
    assert len(steps) == 2 and all(math.isfinite(h["loss"]) for h in steps)
    assert 0.1 <= steps[-1]["ictrl/selected_frac"] < 0.3


def test_an_uncached_hub_id_offline_is_one_error_before_any_loading(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """TRL's loader would retry the hub for about a minute and end in chained tracebacks; the trainer names the
    model at once."""
    from ictrl.engine.trainer import ICTGRPOTrainer
    from ictrl.errors import ModelNotFoundError

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    args = ICTGRPOConfig(output_dir=str(tmp_path / "out"), use_cpu=True, bf16=False, report_to="none")
    with pytest.raises(ModelNotFoundError, match=r"^model: Qwen/Qwen2\.5-0\.5B: no local directory or hub-cache copy, "
                                                 r"and HF_HUB_OFFLINE is set$"):
        ICTGRPOTrainer(model="Qwen/Qwen2.5-0.5B", reward_funcs=[lambda completions, **_: [0.0] * len(completions)],
                       args=args, train_dataset=[{"prompt": "1+1="}])
