"""policy_loss against hand-computed numbers and plain-Python float64 references."""

from __future__ import annotations

import math

import pytest
import torch

from ictrl.core.loss import IS_MODES, NORM_MODES, importance_weights
from loss_call import policy_loss_kw

L_MAX = 16  # dr_grpo's constant max_completion_length in these tests


def nkw(norm: str) -> dict:
    """The extra keyword a mode needs: dr_grpo's constant."""
    return {"max_completion_length": L_MAX} if norm == "dr_grpo" else {}


def hand_example() -> dict[str, torch.Tensor]:
    """Three responses, T = 3. Ratios ρ = exp(logprobs - old_logprobs) are chosen directly."""
    ratio = torch.tensor([[1.0, 1.1, 0.5], [1.3, 1.0, 0.9], [1.0, 1.0, 1.0]], dtype=torch.float64)
    old = torch.log(torch.tensor([[0.5, 0.4, 0.3], [0.2, 0.6, 0.1], [0.9, 0.8, 0.7]], dtype=torch.float64))
    mask = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 1, 0]], dtype=torch.bool)
    selected = torch.tensor([[1, 0, 1], [0, 1, 1], [0, 0, 0]], dtype=torch.bool)  # row 1 pos 2 is masked out
    return {
        "logprobs": (old + torch.log(ratio)).requires_grad_(),
        "old_logprobs": old,
        "advantages": torch.tensor([1.0, -2.0, 1.0], dtype=torch.float64),
        "mask": mask,
        "selected": selected,
    }


# Per-token loss L = -min(ρA, clip(ρ, 0.8, 1.2)A):
#   row 0, A = 1:  ρ = 1 -> -1;  ρ = 1.1 -> -1.1;  ρ = 0.5 -> -min(0.5, 0.8) = -0.5
#   row 1, A = -2: ρ = 1.3 -> -min(-2.6, -2.4) = 2.6;  ρ = 1 -> 2;  (pos 2 masked)
#   row 2, A = 1:  nothing selected
# M = selected & mask: row 0 {0, 2}: sum -1.5; row 1 {1}: sum 2.0; row 2: {} -> sum 0.  ΣM = 3, Σmask = 7.
HAND_EXPECTED = {
    # ((-1.5)/2 + 2.0/1 + 0) / 3 = (-0.75 + 2.0) / 3
    "per_response_selected": 1.25 / 3,
    # (-1.5 + 2.0) / 3
    "token_mean_selected": 0.5 / 3,
    # (-1.5 + 2.0) / 7
    "token_mean_all": 0.5 / 7,
    # ((-1.5)/3 + 2.0/2 + 0/2) / 3 = (-0.5 + 1.0) / 3
    "per_response_all": 0.5 / 3,
    # (-1.5 + 2.0) / (B · L_MAX) = 0.5 / 48
    "dr_grpo": 0.5 / (3 * L_MAX),
    # (-1.5 + 2.0 + 0) / 3: each response's sum, then the mean over responses (TRL's luspo)
    "sequence_sum": 0.5 / 3,
}


@pytest.mark.parametrize("norm", NORM_MODES)
def test_hand_computed_modes(norm: str) -> None:
    loss, metrics = policy_loss_kw(**hand_example(), norm=norm, **nkw(norm))
    assert loss.item() == pytest.approx(HAND_EXPECTED[norm], abs=1e-12)
    # No selected token is clipped: row 0 pos 2 has ρ = 0.5 < 0.8 but A > 0, so the unclipped branch is the min
    # (row 1 pos 0, ρ = 1.3 with A < 0, is not selected and unclipped as well).
    assert metrics["clip_frac"].item() == 0.0
    assert metrics["selected_frac"].item() == pytest.approx(3 / 7)
    # mean π_old over M: (0.5 + 0.3 + 0.6) / 3
    assert metrics["mean_prob_selected"].item() == pytest.approx(1.4 / 3)
    assert all(v.dim() == 0 and not v.requires_grad for v in metrics.values())


def naive_terms(lp, old, adv, mask, sel, eps_low, eps_high, ref=None, kl_coef=0.0):
    """Per-token -Ψ, clip flags and k3 with math.* in float64, only over M."""
    B, T = lp.shape
    lp = lp.detach()
    out = {}
    for b in range(B):
        for t in range(T):
            if not (mask[b, t] and sel[b, t]):
                continue
            a = float(adv[b])
            rho = math.exp(float(lp[b, t]) - float(old[b, t]))
            clipped = min(max(rho, 1 - eps_low), 1 + eps_high)
            psi = min(rho * a, clipped * a)
            k3 = None
            if ref is not None:
                d = float(ref[b, t]) - float(lp[b, t])
                k3 = math.exp(d) - d - 1
                psi -= kl_coef * k3
            out[(b, t)] = (-psi, rho < 1 - eps_low and a < 0, rho > 1 + eps_high and a > 0, k3)
    return out


def naive_loss(terms, mask, norm, B):
    if norm == "dr_grpo":
        return sum(v[0] for v in terms.values()) / (B * L_MAX)
    if norm == "sequence_sum":
        return sum(v[0] for v in terms.values()) / B
    if norm == "token_mean_selected":
        return sum(v[0] for v in terms.values()) / max(len(terms), 1)
    if norm == "token_mean_all":
        return sum(v[0] for v in terms.values()) / max(int(mask.sum()), 1)
    total = 0.0
    for b in range(B):
        row = [v[0] for (bb, _), v in terms.items() if bb == b]
        den = len(row) if norm == "per_response_selected" else int(mask[b].sum())
        total += sum(row) / den if den else 0.0
    return total / B


def random_batch(seed: int, B: int = 6, T: int = 9, spread: float = 0.4):
    g = torch.Generator().manual_seed(seed)
    old = torch.log(torch.rand(B, T, generator=g, dtype=torch.float64) * 0.9 + 0.05)
    lp = (old + spread * torch.randn(B, T, generator=g, dtype=torch.float64)).requires_grad_()
    mask = torch.rand(B, T, generator=g) < 0.8
    mask[1] = False  # an all-masked response
    sel = torch.rand(B, T, generator=g) < 0.4
    adv = torch.randn(B, generator=g, dtype=torch.float64)
    ref = old + 0.3 * torch.randn(B, T, generator=g, dtype=torch.float64)
    return lp, old, adv, mask, sel, ref


@pytest.mark.parametrize("norm", NORM_MODES)
def test_clipping_both_sides_and_kl_vs_reference(norm: str) -> None:
    lp, old, adv, mask, sel, ref = random_batch(0, B=10, T=12, spread=0.6)
    terms = naive_terms(lp, old, adv, mask, sel, 0.2, 0.28, ref, kl_coef=0.1)
    assert any(v[1] for v in terms.values()) and any(v[2] for v in terms.values())  # both sides clip here
    loss, m = policy_loss_kw(lp, old, adv, mask, sel, eps_low=0.2, eps_high=0.28, norm=norm,
                          ref_logprobs=ref, kl_coef=0.1, entropy=-old, **nkw(norm))
    assert loss.item() == pytest.approx(naive_loss(terms, mask, norm, 10), rel=1e-10, abs=1e-12)
    n = len(terms)
    assert m["clip_frac_low"].item() == pytest.approx(sum(v[1] for v in terms.values()) / n)
    assert m["clip_frac_high"].item() == pytest.approx(sum(v[2] for v in terms.values()) / n)
    assert m["clip_frac"].item() == pytest.approx(sum(v[1] or v[2] for v in terms.values()) / n)
    assert m["kl"].item() == pytest.approx(sum(v[3] for v in terms.values()) / n, rel=1e-10)
    assert m["mean_entropy_selected"].item() == pytest.approx(sum(-float(old[k]) for k in terms) / n, rel=1e-10)
    assert m["selected_frac"].item() == pytest.approx(n / int(mask.sum()))


def test_token_advantages_equal_broadcast_response_advantages() -> None:
    lp, old, adv, mask, sel, _ = random_batch(1)
    a, _ = policy_loss_kw(lp, old, adv, mask, sel)
    b, _ = policy_loss_kw(lp, old, adv[:, None].expand(-1, lp.shape[1]).clone(), mask, sel)
    assert a.item() == pytest.approx(b.item(), rel=1e-14)


@pytest.mark.parametrize("norm", NORM_MODES)
def test_gradient_only_through_selected_tokens(norm: str) -> None:
    lp, old, adv, mask, sel, _ = random_batch(2, spread=0.1)
    with torch.no_grad():  # padding garbage must not leak NaN into the loss or the gradient
        lp[~mask] = math.nan
        lp[1, :3] = -math.inf  # row 1 is all-masked
    ref = torch.where(mask, old, math.nan)
    loss, _ = policy_loss_kw(lp, old, adv, mask, sel, norm=norm, ref_logprobs=ref, kl_coef=0.1, **nkw(norm))
    assert torch.isfinite(loss)
    loss.backward()
    grad = lp.grad
    M = mask & sel
    assert torch.isfinite(grad).all()
    assert bool((grad[~M] == 0).all())
    ratio = torch.exp(lp.detach() - old)
    unclipped = ((ratio <= 1.2) | (adv[:, None] < 0)) & ((ratio >= 0.8) | (adv[:, None] > 0))
    live = M & unclipped & (adv[:, None] != 0)
    assert int(live.sum()) > 5
    assert bool((grad[live] != 0).all())


def test_zero_advantage_at_ratio_one_gives_zero_loss() -> None:
    lp = torch.log(torch.full((2, 4), 0.3, dtype=torch.float64)).requires_grad_()
    for norm in NORM_MODES:
        loss, m = policy_loss_kw(lp, lp.detach().clone(), torch.zeros(2, dtype=torch.float64),
                              torch.ones(2, 4, dtype=torch.bool), norm=norm, ref_logprobs=lp.detach().clone(),
                              **nkw(norm))
        assert loss.item() == 0.0 and m["kl"].item() == 0.0


@pytest.mark.parametrize("norm", NORM_MODES)
@pytest.mark.parametrize("empty", ["selection", "mask"])
def test_empty_selection_is_finite_zero_with_zero_grads(norm: str, empty: str) -> None:
    lp, old, adv, mask, sel, ref = random_batch(3)
    sel = torch.zeros_like(sel)
    if empty == "mask":
        mask = torch.zeros_like(mask)
    loss, m = policy_loss_kw(lp, old, adv, mask, sel, norm=norm, ref_logprobs=ref, kl_coef=0.1, **nkw(norm),
                          sampler_logprobs=ref, is_mode="sequence_truncate")
    assert loss.item() == 0.0 and loss.grad_fn is not None
    loss.backward()
    assert torch.equal(lp.grad, torch.zeros_like(lp))
    assert all(torch.isfinite(v) and v.item() == 0.0 for v in m.values())


@pytest.mark.parametrize("norm", NORM_MODES)
def test_global_normalisers_make_split_batches_exact(norm: str) -> None:
    lp, old, adv, mask, sel, ref = random_batch(4, B=8)
    full, _ = policy_loss_kw(lp, old, adv, mask, sel, norm=norm, ref_logprobs=ref, kl_coef=0.05, **nkw(norm))
    (full_grad,) = torch.autograd.grad(full, lp)
    M = mask & sel
    n_tok = int(M.sum()) if norm == "token_mean_selected" else int(mask.sum())
    total = 0.0
    for half in (slice(0, 3), slice(3, 8)):  # uneven halves: local denominators would differ
        part, _ = policy_loss_kw(lp[half], old[half], adv[half], mask[half], sel[half], norm=norm,
                              ref_logprobs=ref[half], kl_coef=0.05, num_responses=8, num_tokens=n_tok, **nkw(norm))
        total = total + part
    (split_grad,) = torch.autograd.grad(total, lp)
    assert total.item() == pytest.approx(full.item(), rel=1e-12)
    assert torch.allclose(split_grad, full_grad, rtol=1e-12, atol=1e-15)
    # without the overrides the halves do not add up to the full loss
    local = sum(policy_loss_kw(lp[h], old[h], adv[h], mask[h], sel[h], norm=norm, ref_logprobs=ref[h],
                            kl_coef=0.05, **nkw(norm))[0].item() for h in (slice(0, 3), slice(3, 8)))
    assert local != pytest.approx(full.item(), rel=1e-6)


def test_bad_inputs_name_the_argument() -> None:
    lp, old, adv, mask, sel, ref = random_batch(5)
    cases = [
        ({"old_logprobs": old[:, :-1]}, "old_logprobs"),
        ({"mask": mask[:-1]}, "mask"),
        ({"mask": mask.long() * 2}, "mask"),
        ({"selected": torch.full(sel.shape, 0.5)}, "selected"),
        ({"advantages": adv[:-1]}, "advantages"),
        ({"norm": "sequence_mean"}, "norm"),
        ({"eps_low": -0.1}, "eps_low"),
        ({"eps_high": -0.1}, "eps_high"),
        ({"kl_coef": -1.0}, "kl_coef"),
        ({"ref_logprobs": ref[:, :2]}, "ref_logprobs"),
        ({"entropy": ref[:2]}, "entropy"),
        ({"num_responses": -1}, "num_responses"),
        ({"num_tokens": torch.tensor([1.0, 2.0])}, "num_tokens"),
        ({"norm": "dr_grpo"}, "max_completion_length"),
        ({"norm": "dr_grpo", "max_completion_length": 0}, "max_completion_length"),
        ({"sampler_logprobs": ref[:, :2]}, "sampler_logprobs"),
        ({"is_mode": "token_clip"}, "is_mode"),
        ({"is_clip_max": 0.0}, "is_clip_max"),
        ({"is_clip_min": -1.0}, "is_clip_min"),
        ({"is_clip_min": 2.0, "is_clip_max": 2.0}, "is_clip_min"),
    ]
    base = {"logprobs": lp, "old_logprobs": old, "advantages": adv, "mask": mask, "selected": sel}
    for override, name in cases:
        with pytest.raises(ValueError, match=name):
            policy_loss_kw(**{**base, **override})
    with pytest.raises(ValueError, match="logprobs"):
        policy_loss_kw(lp[0], old[0], adv, mask[0])


def test_zero_one_masks_accepted() -> None:
    lp, old, adv, mask, sel, _ = random_batch(6)
    a, _ = policy_loss_kw(lp, old, adv, mask, sel)
    b, _ = policy_loss_kw(lp, old, adv, mask.long(), sel.float())
    assert a.item() == b.item()


# ------------------------------------------------------------------------------------ Dr.GRPO normaliser


def test_dr_grpo_denominator_is_constant() -> None:
    """Σ M·L / (B · L_MAX): independent of padding, of the selected count and of response lengths."""
    lp, old, adv, mask, sel, _ = random_batch(7)
    loss, _ = policy_loss_kw(lp, old, adv, mask, sel, norm="dr_grpo", max_completion_length=L_MAX)
    pad = lambda x, v: torch.cat([x, torch.full((x.size(0), 5), v, dtype=x.dtype)], dim=1)  # noqa: E731
    padded, _ = policy_loss_kw(pad(lp.detach(), math.nan), pad(old, -math.inf), adv, pad(mask, False), pad(sel, True),
                            norm="dr_grpo", max_completion_length=L_MAX)
    assert padded.item() == pytest.approx(loss.item(), rel=1e-14)
    terms = naive_terms(lp, old, adv, mask, sel, 0.2, 0.2)
    assert loss.item() == pytest.approx(sum(v[0] for v in terms.values()) / (lp.size(0) * L_MAX), rel=1e-12)
    # a token's gradient does not depend on how many others were selected (token_mean_selected's does)
    one = sel & mask
    keep = one.nonzero()[0]
    fewer = torch.zeros_like(sel)
    fewer[keep[0], keep[1]] = True
    grads = []
    for s_ in (one, fewer):
        for norm in ("dr_grpo", "token_mean_selected"):
            (g,) = torch.autograd.grad(policy_loss_kw(lp, old, adv, mask, s_, norm=norm, **nkw(norm))[0], lp)
            grads.append(g[keep[0], keep[1]].item())
    assert grads[0] == pytest.approx(grads[2], rel=1e-12) and grads[1] != pytest.approx(grads[3], rel=1e-3)


# ------------------------------------------------------------------------- sampler/trainer importance weights


def naive_is_weights(old, smp, mask, mode, lo, hi):
    """{(b, t): (w, clipped)} with math.* in float64 over the mask; NaN sampler log-prob -> r = 1."""
    B, T = old.shape
    out = {}
    for b in range(B):
        diffs = {t: (0.0 if math.isnan(float(smp[b, t])) else float(old[b, t]) - float(smp[b, t]))
                 for t in range(T) if mask[b, t]}
        for t, d in diffs.items():
            r = math.exp(sum(diffs.values()) if mode.startswith("sequence") else d)
            lo_, hi_ = (-math.inf if lo is None else lo), (math.inf if hi is None else hi)
            if mode.endswith("truncate"):
                w = min(max(r, lo_), hi_)
            else:
                w = r if lo_ <= r <= hi_ else 0.0
            out[(b, t)] = (w, w != r)
    return out


def reference_loss(lp, old, adv, mask, sel, w, norm, ref=None, kl_coef=0.0, eps_low=0.2, eps_high=0.28):
    """The weighted loss as a float64 torch expression built token by token (autograd gives the reference grad)."""
    B, T = lp.shape
    rows = []
    for b in range(B):
        terms = []
        for t in range(T):
            if not (mask[b, t] and sel[b, t]):
                continue
            a = float(adv[b])
            rho = torch.exp(lp[b, t] - float(old[b, t]))
            psi = torch.minimum(rho * a, rho.clamp(1 - eps_low, 1 + eps_high) * a)
            term = -psi * w[(b, t)][0]  # the weight multiplies the policy term only, as TRL
            if ref is not None:
                d = float(ref[b, t]) - lp[b, t]
                term = term + kl_coef * (torch.exp(d) - d - 1)
            terms.append(term)
        rows.append((sum(terms) if terms else lp.sum() * 0.0, len(terms), int(mask[b].sum())))
    if norm == "dr_grpo":
        return sum(r[0] for r in rows) / (B * L_MAX)
    if norm == "sequence_sum":
        return sum(r[0] for r in rows) / B
    if norm.startswith("per_response"):
        return sum(r[0] / max(r[1] if norm == "per_response_selected" else r[2], 1) for r in rows) / B
    den = sum(r[1] for r in rows) if norm == "token_mean_selected" else int(mask.sum())
    return sum(r[0] for r in rows) / max(den, 1)


@pytest.mark.parametrize("norm", NORM_MODES)
@pytest.mark.parametrize("mode", IS_MODES)
def test_importance_weighted_loss_and_grad_vs_float64_reference(norm: str, mode: str) -> None:
    lp, old, adv, mask, sel, ref = random_batch(8, B=8, T=10, spread=0.5)
    g = torch.Generator().manual_seed(9)
    # the sampler's log-probs differ from the trainer's: per-token noise big enough to cross both bounds
    token = mode.startswith("token")
    smp = old + (0.9 if token else 0.1) * torch.randn(old.shape, generator=g, dtype=torch.float64)
    smp[0, 2] = math.nan  # not scored by the sampler: r = 1
    smp[~mask] = -math.inf  # padding may hold anything
    lo, hi = ((0.5, 2.0) if mode.endswith("mask") else (0.8, 1.5)) if token else (0.75, 1.35)
    loss, m = policy_loss_kw(lp, old, adv, mask, sel, eps_low=0.2, eps_high=0.28, norm=norm, ref_logprobs=ref,
                          kl_coef=0.1, sampler_logprobs=smp, is_mode=mode, is_clip_min=lo, is_clip_max=hi,
                          **nkw(norm))
    w = naive_is_weights(old, smp, mask, mode, lo, hi)
    expected = reference_loss(lp, old, adv, mask, sel, w, norm, ref, kl_coef=0.1)
    assert loss.item() == pytest.approx(expected.item(), rel=1e-10, abs=1e-14)
    (grad,) = torch.autograd.grad(loss, lp)
    (expected_grad,) = torch.autograd.grad(expected, lp)
    torch.testing.assert_close(grad, expected_grad, rtol=1e-10, atol=1e-14)
    M = [k for k in w if sel[k]]
    clipped = sum(w[k][1] for k in M)
    assert 0 < clipped < len(M)  # the bounds bite on some selected tokens, not all
    assert m["is_clipped_frac"].item() == pytest.approx(clipped / len(M), rel=1e-12)
    assert m["is_ratio_mean"].item() == pytest.approx(sum(w[k][0] for k in M) / len(M), rel=1e-12)
    # the weight changes the loss: without the sampler log-probs it differs
    plain, _ = policy_loss_kw(lp, old, adv, mask, sel, eps_low=0.2, eps_high=0.28, norm=norm, ref_logprobs=ref,
                           kl_coef=0.1, **nkw(norm))
    assert plain.item() != pytest.approx(loss.item(), rel=1e-6)


def test_importance_weights_are_one_when_sampler_matches() -> None:
    lp, old, adv, mask, sel, _ = random_batch(10)
    for mode in IS_MODES:
        a, m = policy_loss_kw(lp, old, adv, mask, sel, sampler_logprobs=old.clone(), is_mode=mode)
        b, _ = policy_loss_kw(lp, old, adv, mask, sel)
        assert a.item() == b.item() and m["is_ratio_mean"].item() == 1.0 and m["is_clipped_frac"].item() == 0.0
    w, clipped = importance_weights(old, old + 10.0, mask, "token_truncate", None, None)  # no bounds: plain IS
    assert torch.allclose(w[mask], torch.full_like(w[mask], math.exp(-10.0))) and not clipped.any()


@pytest.mark.parametrize("norm", NORM_MODES)
def test_importance_weights_with_split_batches_are_exact(norm: str) -> None:
    lp, old, adv, mask, sel, ref = random_batch(11, B=8)
    smp = old + 0.3 * torch.randn(old.shape, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    kw = dict(norm=norm, sampler_logprobs=smp, is_mode="sequence_truncate", is_clip_max=1.3, **nkw(norm))
    full, _ = policy_loss_kw(lp, old, adv, mask, sel, **kw)
    n_tok = int((mask & sel).sum()) if norm == "token_mean_selected" else int(mask.sum())
    total = sum(policy_loss_kw(lp[h], old[h], adv[h], mask[h], sel[h], num_responses=8, num_tokens=n_tok,
                            **{**kw, "sampler_logprobs": smp[h]})[0] for h in (slice(0, 3), slice(3, 8)))
    assert total.item() == pytest.approx(full.item(), rel=1e-12)


# ----------------------------------------------------------------------------------- non-finite inputs


@pytest.mark.parametrize("field", ["logprobs", "old_logprobs", "advantages", "token_advantages", "ref_logprobs"])
@pytest.mark.parametrize("value", [-math.inf, math.nan, math.inf])
def test_non_finite_at_an_active_token_names_row_and_position(field: str, value: float) -> None:
    """A -inf old log-prob gave a finite loss and a NaN gradient, a NaN advantage a NaN loss."""
    lp, old, adv, mask, sel, ref = random_batch(12)
    args = {"logprobs": lp.detach().clone(), "old_logprobs": old.clone(), "advantages": adv.clone(),
            "ref_logprobs": ref.clone()}
    if field == "token_advantages":
        args["advantages"] = adv[:, None].expand(mask.shape).clone()
    active = (mask & sel).nonzero()
    b, t = (int(i) for i in active[len(active) // 2])
    # garbage off the active set is fine
    off = ((~(mask & sel)) & (torch.arange(mask.size(0))[:, None] != 1)).nonzero()[0]
    key = "advantages" if field == "token_advantages" else field
    if args[key].dim() == 2:
        args[key][off[0], off[1]] = value
    policy_loss_kw(mask=mask, selected=sel, kl_coef=0.1, **args)
    if args[key].dim() == 2:
        args[key][b, t] = value
    else:
        args[key][b] = value
    where = f"row {b}, position {t}" if args[key].dim() == 2 else f"row {b}"
    with pytest.raises(ValueError, match=rf"{key} is not finite at \({where}\)"):
        policy_loss_kw(mask=mask, selected=sel, kl_coef=0.1, **args)


def test_non_finite_sampler_logprob_raises_nan_means_unscored() -> None:
    lp, old, adv, mask, sel, _ = random_batch(13)
    b, t = (int(i) for i in (mask & sel).nonzero()[0])
    smp = old.clone()
    smp[b, t] = math.nan
    loss, m = policy_loss_kw(lp, old, adv, mask, sel, sampler_logprobs=smp)
    assert torch.isfinite(loss) and m["is_ratio_mean"].item() == 1.0
    smp[b, t] = -math.inf
    with pytest.raises(ValueError, match=rf"sampler_logprobs is not finite at \(row {b}, position {t}\)"):
        policy_loss_kw(lp, old, adv, mask, sel, sampler_logprobs=smp)
    # sequence modes read the whole mask: an unselected response token counts too
    u = (mask & ~sel).nonzero()[0]
    smp = old.clone()
    smp[u[0], u[1]] = math.inf
    policy_loss_kw(lp, old, adv, mask, sel, sampler_logprobs=smp, is_mode="token_truncate")
    with pytest.raises(ValueError, match="sampler_logprobs is not finite"):
        policy_loss_kw(lp, old, adv, mask, sel, sampler_logprobs=smp, is_mode="sequence_mask")
