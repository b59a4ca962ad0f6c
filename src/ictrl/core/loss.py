"""The clipped policy-gradient loss restricted to selected tokens, and GRPO advantages (docs/method.md §1, §3, §5).

Per token, with ρ = exp(logprobs − old_logprobs) and d = ref_logprobs − logprobs:

    Ψ = min(ρ·Â, clip(ρ, 1 − eps_low, 1 + eps_high)·Â) − kl_coef·(exp(d) − d − 1),   loss token = −w·Ψ

with w = 1, or the sampler/trainer importance weight below. Only M = selected & mask carries the loss.
Normalisation modes (``norm``), L = −w·Ψ:

- ``per_response_selected`` (ICT's Sparse-GRPO): (1/B)·Σ_i [Σ_t M·L / Σ_t M]. A response with Σ_t M = 0 contributes
  0 but still counts in B.
- ``per_response_all`` (original GRPO): (1/B)·Σ_i [Σ_t M·L / Σ_t mask]. A response with Σ_t mask = 0 contributes 0.
- ``token_mean_selected`` (80/20 official code, STAPO): Σ M·L / Σ M.
- ``token_mean_all`` (TRL's ``top_entropy_quantile``): Σ M·L / Σ mask.
- ``dr_grpo`` (Dr.GRPO, Liu et al. 2025, and TRL's ``loss_type="dr_grpo"``): Σ M·L / (B · max_completion_length),
  a constant denominator, so neither response length nor the selected count rescales a token's gradient.

Global normalisers, for gradient accumulation and multi-process training: ``num_responses`` replaces B in the two
per-response modes and in ``dr_grpo`` (the per-response denominators Σ_t M / Σ_t mask are row-local and never change);
``num_tokens`` replaces Σ M in ``token_mean_selected`` and Σ mask in ``token_mean_all``. Passing the totals over
all micro-batches / processes makes the sum of the micro-batch losses equal the full-batch loss. An override is
ignored by the modes it does not apply to. A count of 0 is read as 1 (the numerator is then 0 too).

Sampler/trainer mismatch (TRL's ``vllm_importance_sampling_*`` options, the TIS/MIS corrections of TRL and verl):
when the rollouts come from another engine (vLLM) whose log-probs ``sampler_logprobs`` differ from the trainer's
``old_logprobs`` for the same policy, each token's loss is weighted by r = π_old/π_sampler = exp(old − sampler),
detached: ``token_truncate`` w = clamp(r, is_clip_min, is_clip_max) (TIS); ``token_mask`` w = r inside
[is_clip_min, is_clip_max], else 0 (MIS); ``sequence_*`` the same with one r per response, exp(Σ_t mask·(old −
sampler)) over all its response tokens (selected or not: the ratio belongs to the sampled sequence). The weight
multiplies the whole per-token term, KL included, as TRL does. A NaN sampler log-prob means "not scored" (vLLM's
None) and gives r = 1 for that token, as in TRL.

Non-finite input: ``logprobs``, ``old_logprobs``, ``advantages`` and ``ref_logprobs`` must be finite wherever they
are read (at M; ``old_logprobs`` and ``sampler_logprobs`` on the whole mask for the ``sequence_*`` weights), else a
ValueError names the (row, position). Masked positions may hold anything: they are replaced by 0 before any
arithmetic and inactive per-token losses are dropped with ``torch.where``, so ±inf/NaN padding never reaches the
loss or the gradient. The loss is never NaN: empty denominators give a finite 0 that keeps a grad_fn to
``logprobs`` (zero gradients).
"""

from __future__ import annotations

import torch
from torch import Tensor

from ictrl.core.checks import as_bool_mask, check_group_ids, require_finite

NORM_MODES = ("per_response_selected", "token_mean_selected", "token_mean_all", "per_response_all", "dr_grpo")
IS_MODES = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")


def _check_same_shape(name: str, value: Tensor | None, shape: torch.Size) -> None:
    if value is None:
        return
    if not isinstance(value, Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    if value.shape != shape:
        raise ValueError(f"{name} must have logprobs' shape {tuple(shape)}, got {tuple(value.shape)}")


def _check_count(name: str, value: int | float | Tensor | None) -> None:
    if value is None:
        return
    if isinstance(value, Tensor):
        if value.numel() != 1:
            raise ValueError(f"{name} must be a scalar, got shape {tuple(value.shape)}")
        value = float(value)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
        raise ValueError(f"{name} must be a number >= 0, got {value!r}")


def _check_number(name: str, value: object, optional: bool = False, positive: bool = False) -> None:
    if optional and value is None:
        return
    ok = not isinstance(value, bool) and isinstance(value, (int, float)) and (value > 0 if positive else value >= 0)
    if not ok:
        raise ValueError(f"{name} must be {'None or ' if optional else ''}a number {'>' if positive else '>='} 0, "
                         f"got {value!r}")


def _check_finite(checks: list[tuple[str, Tensor, Tensor]]) -> None:
    """require_finite over (name, values, where) with one host sync when everything is finite."""
    flags = [(~torch.isfinite(x) & w).any() for _, x, w in checks]
    if flags and bool(torch.stack(flags).any()):
        for name, x, w in checks:
            require_finite(name, x, w)


def _check_inputs_finite(logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, ref_logprobs: Tensor | None,
                         sampler_logprobs: Tensor | None, mask: Tensor, active: Tensor, seq_is: bool) -> None:
    """Every value read must be finite: at the active tokens, and on the whole mask where the sequence importance
    weight sums over it."""
    read = mask if seq_is else active
    checks = [("logprobs", logprobs.detach(), active), ("old_logprobs", old_logprobs.detach(), read),
              ("advantages", advantages.detach(), active if advantages.dim() == 2 else active.any(dim=1))]
    if ref_logprobs is not None:
        checks.append(("ref_logprobs", ref_logprobs.detach(), active))
    if sampler_logprobs is not None:  # NaN = not scored (r = 1); ±inf is no log-probability of a sampled token
        smp = sampler_logprobs.detach()
        checks.append(("sampler_logprobs", torch.where(torch.isnan(smp), 0.0, smp), read))
    _check_finite(checks)


def _denominator(override: int | float | Tensor | None, local: Tensor) -> Tensor:
    den = local if override is None else torch.as_tensor(override, dtype=local.dtype, device=local.device)
    return torch.where(den > 0, den, torch.ones_like(den))


def _masked_mean(values: Tensor, where: Tensor) -> Tensor:
    """Mean of ``values`` over ``where`` (0 when empty), detached."""
    n = where.sum()
    return (torch.where(where, values, 0.0).sum() / n.clamp(min=1)).detach()


def importance_weights(old_logprobs: Tensor, sampler_logprobs: Tensor, mask: Tensor, mode: str = "token_truncate",
                       clip_min: float | None = None, clip_max: float | None = 3.0) -> tuple[Tensor, Tensor]:
    """Sampler/trainer importance weights (module docstring), detached.

    Args:
        old_logprobs, sampler_logprobs: [B, T] log π_old (trainer) and log π_sampler of the sampled tokens; NaN in
            ``sampler_logprobs`` means not scored (r = 1).
        mask: [B, T] bool response mask (the sequence modes sum over it).
        mode: one of ``IS_MODES``; clip_min, clip_max: the bounds (None: unbounded on that side).

    Returns:
        (w, clipped): [B, T] weights (0 off the mask) and [B, T] bool, True where w differs from the raw ratio
        (truncated or masked out).
    """
    old, smp = old_logprobs.detach(), sampler_logprobs.detach().to(old_logprobs.dtype)
    scored = mask & ~torch.isnan(smp)
    diff = torch.where(scored, old - torch.where(scored, smp, 0.0), 0.0)
    if mode.startswith("sequence"):
        diff = diff.sum(dim=1, keepdim=True).expand_as(diff)
    raw = torch.exp(diff)
    lo = -torch.inf if clip_min is None else clip_min
    hi = torch.inf if clip_max is None else clip_max
    if mode.endswith("truncate"):
        w = raw if clip_min is None and clip_max is None else raw.clamp(min=clip_min, max=clip_max)
    else:
        w = torch.where((raw < lo) | (raw > hi), 0.0, raw)
    w = torch.where(mask, w, 0.0)
    return w, (w != raw) & mask


def _validate(logprobs: Tensor, advantages: Tensor, named: dict[str, Tensor | None], norm: str,
              numbers: dict[str, object]) -> None:
    if not isinstance(logprobs, Tensor) or logprobs.dim() != 2:
        raise ValueError(f"logprobs must be a [B, T] tensor, got {getattr(logprobs, 'shape', type(logprobs))}")
    shape = logprobs.shape
    for name, value in named.items():
        _check_same_shape(name, value, shape)
    if not isinstance(advantages, Tensor) or advantages.shape not in (torch.Size([shape[0]]), shape):
        raise ValueError(f"advantages must be [B] = ({shape[0]},) or [B, T] = {tuple(shape)}, "
                         f"got {tuple(getattr(advantages, 'shape', ()))}")
    if norm not in NORM_MODES:
        raise ValueError(f"norm must be one of {list(NORM_MODES)}, got {norm!r}")
    for name in ("eps_low", "eps_high", "kl_coef"):
        _check_number(name, numbers[name])
    _check_count("num_responses", numbers["num_responses"])
    _check_count("num_tokens", numbers["num_tokens"])
    length = numbers["max_completion_length"]
    if norm == "dr_grpo" and (isinstance(length, bool) or not isinstance(length, int) or length < 1):
        raise ValueError(f"max_completion_length must be an int >= 1 with norm='dr_grpo' (the constant "
                         f"denominator), got {length!r}")
    if numbers["is_mode"] not in IS_MODES:
        raise ValueError(f"is_mode must be one of {list(IS_MODES)}, got {numbers['is_mode']!r}")
    _check_number("is_clip_min", numbers["is_clip_min"], optional=True)
    _check_number("is_clip_max", numbers["is_clip_max"], optional=True, positive=True)
    lo, hi = numbers["is_clip_min"], numbers["is_clip_max"]
    if lo is not None and hi is not None and not lo < hi:
        raise ValueError(f"is_clip_min ({lo}) must be < is_clip_max ({hi})")


def policy_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    selected: Tensor | None = None,
    *,
    eps_low: float = 0.2,
    eps_high: float = 0.2,
    norm: str = "per_response_selected",
    ref_logprobs: Tensor | None = None,
    kl_coef: float = 0.0,
    entropy: Tensor | None = None,
    num_responses: int | float | Tensor | None = None,
    num_tokens: int | float | Tensor | None = None,
    max_completion_length: int | None = None,
    sampler_logprobs: Tensor | None = None,
    is_mode: str = "token_truncate",
    is_clip_min: float | None = None,
    is_clip_max: float | None = 3.0,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Clipped surrogate loss over the selected tokens.

    Args:
        logprobs: [B, T] log π_θ of the sampled tokens (carries the gradient).
        old_logprobs: [B, T] log π_old (the policy that sampled, as the trainer computes it).
        advantages: [B] per response, or [B, T] per token.
        mask: [B, T] response mask, bool or 0/1.
        selected: [B, T] tokens that carry gradient, bool or 0/1; None means all of ``mask``.
        eps_low, eps_high: clip range [1 − eps_low, 1 + eps_high]; both >= 0.
        norm: one of ``NORM_MODES`` (module docstring).
        ref_logprobs: [B, T] log π_ref for the k3 KL penalty; ``kl_coef`` >= 0 weights it.
        entropy: [B, T] optional, only for the ``mean_entropy_selected`` metric.
        num_responses, num_tokens: global normalisers (module docstring).
        max_completion_length: the constant of ``norm="dr_grpo"`` (required there, ignored otherwise).
        sampler_logprobs: [B, T] log-probs the rollout engine reported for the sampled tokens; None: no correction.
        is_mode, is_clip_min, is_clip_max: the importance weight (module docstring, :func:`importance_weights`).

    Returns:
        (loss, metrics): a 0-d loss and 0-d detached tensors ``clip_frac``, ``clip_frac_low``, ``clip_frac_high``
        (fractions of selected tokens where the clipped branch is the active minimum: ρ < 1 − eps_low with Â < 0,
        resp. ρ > 1 + eps_high with Â > 0), ``selected_frac`` (Σ M / Σ mask), ``mean_prob_selected`` (mean of
        exp(old_logprobs) over M), when given ``mean_entropy_selected`` and ``kl`` (mean k3 over M), and with
        ``sampler_logprobs`` ``is_ratio_mean`` (mean weight w over M) and ``is_clipped_frac`` (fraction of M where w
        was truncated or masked). Means over an empty M are 0. These are local to the batch passed in.
    """
    _validate(logprobs, advantages, {"old_logprobs": old_logprobs, "mask": mask, "selected": selected,
                                     "ref_logprobs": ref_logprobs, "entropy": entropy,
                                     "sampler_logprobs": sampler_logprobs}, norm,
              {"eps_low": eps_low, "eps_high": eps_high, "kl_coef": kl_coef, "num_responses": num_responses,
               "num_tokens": num_tokens, "max_completion_length": max_completion_length, "is_mode": is_mode,
               "is_clip_min": is_clip_min, "is_clip_max": is_clip_max})
    mask = as_bool_mask(mask, "mask")
    active = mask if selected is None else as_bool_mask(selected, "selected") & mask
    _check_inputs_finite(logprobs, old_logprobs, advantages, ref_logprobs, sampler_logprobs, mask, active,
                         sampler_logprobs is not None and is_mode.startswith("sequence"))

    psi, parts = _surrogate(logprobs, old_logprobs, advantages, mask, active, eps_low, eps_high, ref_logprobs,
                            kl_coef, sampler_logprobs, is_mode, is_clip_min, is_clip_max)
    per_token = torch.where(active, -psi, 0.0)
    loss, n_active, n_mask = _normalise(per_token, active, mask, norm, num_responses, num_tokens,
                                        max_completion_length)
    with torch.no_grad():
        ratio, adv, old = parts.pop("ratio"), parts.pop("adv"), parts.pop("old")
        low = (ratio < 1.0 - eps_low) & (adv < 0) & active
        high = (ratio > 1.0 + eps_high) & (adv > 0) & active
        metrics = {
            "clip_frac": _masked_mean((low | high).to(ratio.dtype), active),
            "clip_frac_low": _masked_mean(low.to(ratio.dtype), active),
            "clip_frac_high": _masked_mean(high.to(ratio.dtype), active),
            "selected_frac": (n_active.sum() / n_mask.sum().clamp(min=1)).detach(),
            "mean_prob_selected": _masked_mean(torch.exp(old), active),
            **{k: _masked_mean(v.to(ratio.dtype), active) for k, v in
               {"mean_entropy_selected": entropy, **parts}.items() if v is not None},
        }
    return loss, metrics


def _surrogate(logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, mask: Tensor, active: Tensor,
               eps_low: float, eps_high: float, ref_logprobs: Tensor | None, kl_coef: float,
               sampler_logprobs: Tensor | None, is_mode: str, is_clip_min: float | None, is_clip_max: float | None
               ) -> tuple[Tensor, dict[str, Tensor | None]]:
    """[B, T] Ψ (clipped surrogate − KL, times the importance weight), and the [B, T] pieces the metrics read:
    ratio, adv, old, kl, is_ratio_mean (the weight), is_clipped_frac (where it was clipped)."""
    shape = logprobs.shape
    # Zero the inactive positions first: padding may hold -inf, and 0·inf in backward would be NaN.
    lp = torch.where(active, logprobs, 0.0)
    old = torch.where(active, old_logprobs.detach(), 0.0)
    adv = advantages.detach().to(logprobs.dtype)
    adv = adv[:, None].expand(shape) if adv.dim() == 1 else adv
    adv = torch.where(active, adv, 0.0)

    ratio = torch.exp(lp - old)
    clipped = torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high)
    psi = torch.minimum(ratio * adv, clipped * adv)
    kl = None
    if ref_logprobs is not None:
        d = ref_logprobs.detach() - lp  # inactive garbage here is dropped by the caller's where
        kl = torch.exp(d) - d - 1.0
        if kl_coef:
            psi = psi - kl_coef * kl
    weight = is_clipped = None
    if sampler_logprobs is not None:
        weight, is_clipped = importance_weights(old_logprobs, sampler_logprobs, mask, is_mode, is_clip_min,
                                                is_clip_max)
        psi = psi * torch.where(active, weight, 0.0).to(psi.dtype)
    return psi, {"ratio": ratio, "adv": adv, "old": old, "kl": kl, "is_ratio_mean": weight,
                 "is_clipped_frac": is_clipped}


def _normalise(per_token: Tensor, active: Tensor, mask: Tensor, norm: str, num_responses: int | float | Tensor | None,
               num_tokens: int | float | Tensor | None, max_completion_length: int | None
               ) -> tuple[Tensor, Tensor, Tensor]:
    """The loss of [B, T] per-token terms under ``norm``; also returns the rows' Σ M and Σ mask [B]."""
    dtype, device = per_token.dtype, per_token.device
    n_active = active.sum(dim=1).to(dtype)
    n_mask = mask.sum(dim=1).to(dtype)
    responses = _denominator(num_responses, torch.tensor(float(per_token.size(0)), dtype=dtype, device=device))
    if norm in ("per_response_selected", "per_response_all"):
        row_den = n_active if norm == "per_response_selected" else n_mask
        loss = (per_token.sum(dim=1) / row_den.clamp(min=1)).sum() / responses
    elif norm == "dr_grpo":
        loss = per_token.sum() / (responses * float(max_completion_length))
    else:
        local = n_active.sum() if norm == "token_mean_selected" else n_mask.sum()
        loss = per_token.sum() / _denominator(num_tokens, local)
    return loss, n_active, n_mask


def grpo_advantages(rewards: Tensor, group_ids: Tensor, scale: str = "std", eps: float = 1e-4) -> Tensor:
    """Group-relative advantages Â_i = (r_i − mean_g r) / (std_g r + eps) (docs/method.md §1).

    Args:
        rewards: [B] float rewards.
        group_ids: [B] integer prompt labels; members of a group need not be adjacent.
        scale: ``"std"`` divides by the group's sample standard deviation (Bessel-corrected, as TRL and verl's
            ``torch.std``) plus ``eps``; ``"none"`` only centres (Dr.GRPO).
        eps: >= 0, added to the standard deviation.

    Returns:
        [B] advantages in ``rewards``' floating dtype (float32 for integer rewards). A group of one response gets 0.
        A NaN or ±inf reward raises ValueError naming its row and group (it would otherwise poison its group).
    """
    if not isinstance(rewards, Tensor) or rewards.dim() != 1:
        raise ValueError(f"rewards must be a [B] tensor, got {getattr(rewards, 'shape', type(rewards))}")
    check_group_ids(group_ids, rewards.shape[0])
    if scale not in ("std", "none"):
        raise ValueError(f"scale must be 'std' or 'none', got {scale!r}")
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not eps >= 0:
        raise ValueError(f"eps must be a number >= 0, got {eps!r}")
    r = rewards.detach()
    r = r if r.is_floating_point() else r.float()
    bad = ~torch.isfinite(r)
    if bool(bad.any()):
        i = int(bad.nonzero()[0])
        raise ValueError(f"rewards is not finite at row {i} (group {int(group_ids[i])}): {float(r[i])} "
                         f"({int(bad.sum())} non-finite rewards); a reward function returned NaN or inf")
    if r.numel() == 0:
        return r.clone()
    inverse = torch.unique(group_ids.to(r.device), return_inverse=True)[1]
    counts = torch.bincount(inverse).to(r.dtype)
    mean = torch.zeros_like(counts).index_add_(0, inverse, r) / counts
    centred = r - mean[inverse]
    if scale == "none":
        return centred
    sq = torch.zeros_like(counts).index_add_(0, inverse, centred * centred)
    std = torch.sqrt(sq / (counts - 1).clamp(min=1))
    den = std[inverse] + eps
    # eps = 0 with a constant-reward group gives 0/0: such a group carries no signal, so 0.
    return torch.where(den > 0, centred / torch.where(den > 0, den, 1.0), 0.0)
