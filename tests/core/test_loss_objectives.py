"""policy_loss's TRL loss types, GSPO, delta, KL scope and bias correction and the off-policy mask with a token
selection, against a float64 reference built token by token (docs/method.md §7)."""

from __future__ import annotations

import math

import pytest
import torch

from ictrl.core.loss import LossSpec, aggregate
from loss_call import policy_loss_kw

L_MAX = 16


def batch(seed: int, B: int = 7, T: int = 9, spread: float = 0.5):
    g = torch.Generator().manual_seed(seed)
    old = torch.log(torch.rand(B, T, generator=g, dtype=torch.float64) * 0.9 + 0.05)
    lp = (old + spread * torch.randn(B, T, generator=g, dtype=torch.float64)).requires_grad_()
    mask = torch.rand(B, T, generator=g) < 0.8
    mask[1] = False  # an all-masked response
    mask[2, :] = False
    mask[2, 0] = True  # a single active token
    sel = torch.rand(B, T, generator=g) < 0.4
    sel[3] = False  # a response with nothing selected
    adv = torch.randn(B, generator=g, dtype=torch.float64)
    ref = old + 0.3 * torch.randn(B, T, generator=g, dtype=torch.float64)
    behaviour = old + 0.2 + 0.2 * torch.randn(B, T, generator=g, dtype=torch.float64)  # the sampler drifted
    return lp, old, adv, mask, sel, ref, behaviour


def naive(lp, old, adv, mask, sel, obj: LossSpec, norm: str, ref=None, beta=0.0, behaviour=None, eps=(0.2, 0.28)):
    """The loss as a float64 expression over scalars, response by response (autograd gives the reference grad)."""
    B, T = lp.shape
    pol_rows, kl_rows = [], []
    for b in range(B):
        M = [t for t in range(T) if mask[b, t] and sel[b, t]]
        K = M if obj.kl_scope == "selected" else [t for t in range(T) if mask[b, t]]
        a = float(adv[b])
        if obj.level == "sequence":
            seq = sum(lp[b, t] - float(old[b, t]) for t in M) / max(len(M), 1) if M else lp.sum() * 0.0
            ratio = {t: torch.exp(seq) for t in range(T)}
        else:
            ratio = {t: torch.exp(lp[b, t] - float(old[b, t])) for t in range(T)}
        keep = 1.0
        if obj.off_policy_threshold is not None:
            active = [t for t in range(T) if mask[b, t]]
            gap = sum(float(behaviour[b, t]) - float(lp[b, t].detach()) for t in active) / max(len(active), 1)
            keep = 1.0 if (a >= 0 or gap <= obj.off_policy_threshold) else 0.0
        terms = []
        for t in M:
            r = ratio[t]
            if obj.loss_type == "cispo":
                p = -min(float(r.detach()), eps[1]) * a * lp[b, t]
            elif obj.loss_type == "sapo":
                tau = obj.sapo_temperature_pos if a > 0 else obj.sapo_temperature_neg
                p = -torch.sigmoid(tau * (r - 1)) * 4 / tau * a
            else:
                r1 = r if obj.delta is None else torch.clamp(r, max=obj.delta)
                p = -torch.minimum(r1 * a, torch.clamp(r, 1 - eps[0], 1 + eps[1]) * a)
            terms.append(p * keep)
        kls = []
        for t in K:
            d = float(ref[b, t]) - lp[b, t]
            k3 = torch.exp(d) - d - 1
            kls.append(k3 * ratio[t] if obj.bias_correction_kl else k3)
        pol_rows.append((terms, len(M), int(mask[b].sum())))
        kl_rows.append((kls, len(K), int(mask[b].sum())))

    def agg(rows):
        zero = lp.sum() * 0.0
        total = sum((sum(x, zero) for x, _, _ in rows), zero)
        if norm == "dr_grpo":
            return total / (B * L_MAX)
        if norm == "sequence_sum":
            return total / B
        if norm.startswith("per_response"):
            return sum((sum(x, zero) / max(n if norm == "per_response_selected" else m, 1) for x, n, m in rows),
                       zero) / B
        return total / max(sum(n if norm == "token_mean_selected" else m for _, n, m in rows), 1)

    loss = agg(pol_rows)
    return loss + beta * agg(kl_rows) if ref is not None and beta else loss


CASES = [
    (dict(loss_type="grpo", level="sequence"), "per_response_selected"),
    (dict(loss_type="dapo", level="sequence", delta=1.3), "token_mean_selected"),
    (dict(loss_type="cispo"), "token_mean_all"),
    (dict(loss_type="cispo", level="sequence"), "per_response_selected"),
    (dict(loss_type="sapo"), "per_response_all"),
    (dict(loss_type="luspo", level="sequence"), "sequence_sum"),
    (dict(delta=1.2), "dr_grpo"),
    (dict(bias_correction_kl=True), "per_response_selected"),
    (dict(bias_correction_kl=True, kl_scope="all_tokens"), "token_mean_selected"),
    (dict(kl_scope="all_tokens"), "per_response_selected"),
    (dict(level="sequence", bias_correction_kl=True, kl_scope="all_tokens"), "token_mean_all"),
    (dict(off_policy_threshold=0.0), "token_mean_selected"),
]


@pytest.mark.parametrize(("obj", "norm"), CASES)
def test_objective_with_a_selection_vs_float64_reference(obj: dict, norm: str) -> None:
    lp, old, adv, mask, sel, ref, behaviour = batch(11)
    eps_high = 1.5 if obj.get("loss_type") == "cispo" else 0.28
    kw = dict(max_completion_length=L_MAX) if norm == "dr_grpo" else {}
    loss, _ = policy_loss_kw(lp, old, adv, mask, sel, eps_low=0.2, eps_high=eps_high, norm=norm, ref_logprobs=ref,
                          kl_coef=0.1, **obj, behaviour_logprobs=behaviour, **kw)
    expected = naive(lp, old, adv, mask, sel, LossSpec(**obj), norm, ref, 0.1, behaviour, eps=(0.2, eps_high))
    assert loss.item() == pytest.approx(expected.item(), rel=1e-10, abs=1e-14)
    (grad,) = torch.autograd.grad(loss, lp)
    (expected_grad,) = torch.autograd.grad(expected, lp)
    torch.testing.assert_close(grad, expected_grad, rtol=1e-9, atol=1e-13)
    assert float(grad.abs().sum()) > 0
    # the option acts: the plain clipped token-level loss differs
    plain, _ = policy_loss_kw(lp, old, adv, mask, sel, eps_low=0.2, eps_high=eps_high, norm=norm, ref_logprobs=ref,
                           kl_coef=0.1, **kw)
    assert plain.item() != pytest.approx(loss.item(), rel=1e-9)


@pytest.mark.parametrize(("obj", "norm"), CASES)
def test_padding_never_reaches_loss_or_gradient(obj: dict, norm: str) -> None:
    lp, old, adv, mask, sel, ref, behaviour = batch(15)
    kw = dict(max_completion_length=L_MAX) if norm == "dr_grpo" else {}
    args = dict(norm=norm, ref_logprobs=ref, kl_coef=0.1, **obj, behaviour_logprobs=behaviour, **kw)
    clean, _ = policy_loss_kw(lp, old, adv, mask, sel, **args)
    padded = lp.detach().clone()
    padded[~mask] = -math.inf
    padded.requires_grad_()
    old_p, ref_p, beh_p = old.clone(), ref.clone(), behaviour.clone()
    old_p[~mask], ref_p[~mask], beh_p[~mask] = math.nan, math.inf, -math.inf
    loss, _ = policy_loss_kw(padded, old_p, adv, mask, sel, **{**args, "ref_logprobs": ref_p,
                                                            "behaviour_logprobs": beh_p})
    assert loss.item() == pytest.approx(clean.item(), rel=1e-12)
    (grad,) = torch.autograd.grad(loss, padded)
    assert bool(torch.isfinite(grad).all()) and float(grad[~mask].abs().sum()) == 0.0


def test_sequence_ratio_spans_the_selected_tokens_only() -> None:
    """GSPO over a selection: changing log-probs at unselected tokens changes neither loss nor ratio."""
    lp, old, adv, mask, sel, _, _ = batch(12)
    base, _ = policy_loss_kw(lp, old, adv, mask, sel, level="sequence")
    moved = lp.detach().clone()
    moved[~sel] += 5.0
    again, _ = policy_loss_kw(moved, old, adv, mask, sel, level="sequence")
    assert again.item() == pytest.approx(base.item(), rel=1e-12)


def test_kl_scope_all_tokens_needs_no_selected_token() -> None:
    """A response with nothing selected still carries its KL term over every token under kl_scope='all_tokens'."""
    lp, old, adv, mask, sel, ref, _ = batch(13)
    sel = torch.zeros_like(sel)
    loss, m = policy_loss_kw(lp, old, adv, mask, sel, ref_logprobs=ref, kl_coef=0.1,
                          kl_scope="all_tokens")
    d = ref - lp.detach()
    k3 = torch.where(mask, torch.exp(d) - d - 1, 0.0)
    rows = k3.sum(1) / mask.sum(1).clamp(min=1)  # per_response_selected with K = mask: per-response mean
    assert loss.item() == pytest.approx(0.1 * rows.sum().item() / lp.size(0), rel=1e-12)
    none, _ = policy_loss_kw(lp, old, adv, mask, sel, ref_logprobs=ref, kl_coef=0.1)
    assert none.item() == 0.0


def test_vespo_without_a_selection_vs_float64_reference() -> None:
    lp, old, adv, mask, _, _, _ = batch(14, spread=0.05)
    loss, _ = policy_loss_kw(lp, old, adv, mask, None, norm="token_mean_all", loss_type="vespo")
    total, n = lp.sum() * 0.0, int(mask.sum())
    for b in range(lp.size(0)):
        toks = [t for t in range(lp.size(1)) if mask[b, t]]
        log_w = min(max(sum(float(lp[b, t].detach()) - float(old[b, t]) for t in toks), math.log(1e-8)), 20.0)
        a = float(adv[b])
        k, lam = (2.0, 3.0) if a >= 0 else (3.0, 2.0)
        phi = math.exp(lam + k * log_w - lam * math.exp(log_w))
        total = total + sum((-phi * a * lp[b, t] for t in toks), lp.sum() * 0.0)
    expected = total / n
    assert loss.item() == pytest.approx(expected.item(), rel=1e-10)
    torch.testing.assert_close(torch.autograd.grad(loss, lp)[0], torch.autograd.grad(expected, lp)[0],
                               rtol=1e-9, atol=1e-13)


def test_aggregate_drops_what_it_does_not_cover() -> None:
    per_token = torch.tensor([[1.0, math.inf, 3.0], [math.nan, 2.0, 0.0]], dtype=torch.float64)
    where = torch.tensor([[True, False, True], [False, True, False]])
    mask = torch.tensor([[True, True, True], [True, True, False]])
    assert aggregate(per_token, where, mask, "token_mean_all").item() == pytest.approx(6.0 / 5)
    assert aggregate(per_token, where, mask, "per_response_selected").item() == pytest.approx((2.0 + 2.0) / 2)
    assert aggregate(per_token, where, mask, "sequence_sum", num_responses=4).item() == pytest.approx(6.0 / 4)


def test_loss_types_are_trl_s_with_trl_s_normalisers() -> None:
    from ictrl.core.loss import LOSS_TYPES, clipped_surrogate

    trl = {"grpo": "per_response_all", "sapo": "per_response_all", "bnpo": "token_mean_all",
           "dapo": "token_mean_all", "cispo": "token_mean_all", "vespo": "token_mean_all", "dr_grpo": "dr_grpo",
           "luspo": "sequence_sum"}
    assert {name: kind.trl_norm for name, kind in LOSS_TYPES.items()} == trl
    assert {n for n, k in LOSS_TYPES.items() if k.term is clipped_surrogate} == {"grpo", "bnpo", "dr_grpo", "dapo",
                                                                                 "luspo"}
    assert {n for n, k in LOSS_TYPES.items() if k.buffer_mean} == {"dapo", "cispo", "vespo"}
    assert {n for n, k in LOSS_TYPES.items() if k.whole_response} == {"vespo"}


def test_a_registered_loss_type_is_one_function_usable_by_name() -> None:
    """A new loss type is one function of (Tokens, LossSpec): registered, LossSpec accepts it and policy_loss runs it
    through the same importance weight and aggregation as TRL's."""
    from ictrl.core.loss import LOSS_TYPES, LossSpec, Tokens, register_loss_type

    @register_loss_type("test_reinforce", "token_mean_selected")
    def reinforce(x: Tokens, spec: LossSpec) -> torch.Tensor:
        return -x.advantages * x.logprobs

    try:
        with pytest.raises(ValueError, match="already registered"):
            register_loss_type("test_reinforce", "token_mean_all")
        lp, old, adv, mask, sel, _, _ = batch(16)
        loss, _ = policy_loss_kw(lp, old, adv, mask, sel, loss_type="test_reinforce", norm="token_mean_selected")
        M = mask & sel
        expected = (-adv[:, None] * lp)[M].sum() / M.sum()
        assert loss.item() == pytest.approx(expected.item(), rel=1e-12)
    finally:
        LOSS_TYPES.pop("test_reinforce", None)
    with pytest.raises(ValueError, match="trl_norm"):
        register_loss_type("test_bad_norm", "mean")
    assert "test_bad_norm" not in LOSS_TYPES


def test_spec_errors_name_the_field_they_check() -> None:
    from ictrl.core.checks import OptionError

    for kwargs, field in [({"loss_type": "ppo"}, "loss_type"), ({"level": "response"}, "level"),
                          ({"kl_scope": "tokens"}, "kl_scope"), ({"delta": 0.0}, "delta"),
                          ({"sapo_temperature_pos": -1.0}, "sapo_temperature_pos"),
                          ({"off_policy_threshold": -1.0}, "off_policy_threshold"), ({"eps_high": "0.2"}, "eps_high")]:
        with pytest.raises(OptionError) as err:
            LossSpec(**kwargs)
        assert err.value.field == field and str(err.value) == f"{field} {err.value.reason}"
