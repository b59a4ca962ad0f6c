"""The clipped policy-gradient loss restricted to selected tokens, and GRPO advantages (method.md §1, §3, §5).

Per token, with ρ = exp(logprobs − old_logprobs) and d = ref_logprobs − logprobs:

    Ψ = min(ρ·Â, clip(ρ, 1 − eps_low, 1 + eps_high)·Â) − kl_coef·(exp(d) − d − 1),   loss token = −Ψ

Only M = selected & mask carries the loss. Normalisation modes (``norm``), L = −Ψ:

- ``per_response_selected`` (ICT's Sparse-GRPO): (1/B)·Σ_i [Σ_t M·L / Σ_t M]. A response with Σ_t M = 0 contributes
  0 but still counts in B.
- ``per_response_all`` (original GRPO): (1/B)·Σ_i [Σ_t M·L / Σ_t mask]. A response with Σ_t mask = 0 contributes 0.
- ``token_mean_selected`` (80/20 official code, STAPO): Σ M·L / Σ M.
- ``token_mean_all`` (TRL's ``top_entropy_quantile``): Σ M·L / Σ mask.

Global normalisers, for gradient accumulation and multi-process training: ``num_responses`` replaces B in the two
per-response modes (the per-response denominators Σ_t M / Σ_t mask are row-local and never change);
``num_tokens`` replaces Σ M in ``token_mean_selected`` and Σ mask in ``token_mean_all``. Passing the totals over
all micro-batches / processes makes the sum of the micro-batch losses equal the full-batch loss. An override is
ignored by the modes it does not apply to. A count of 0 is read as 1 (the numerator is then 0 too).

The loss is never NaN: empty denominators give a finite 0 that keeps a grad_fn to ``logprobs`` (zero gradients).
Inactive positions of ``logprobs``/``old_logprobs`` are replaced by 0 before any arithmetic and inactive per-token
losses are dropped with ``torch.where``, so ±inf/NaN padding never reaches the loss or the gradient.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ictrl.checks import as_bool_mask

NORM_MODES = ("per_response_selected", "token_mean_selected", "token_mean_all", "per_response_all")


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


def _denominator(override: int | float | Tensor | None, local: Tensor) -> Tensor:
    den = local if override is None else torch.as_tensor(override, dtype=local.dtype, device=local.device)
    return torch.where(den > 0, den, torch.ones_like(den))


def _masked_mean(values: Tensor, where: Tensor) -> Tensor:
    """Mean of ``values`` over ``where`` (0 when empty), detached."""
    n = where.sum()
    return (torch.where(where, values, 0.0).sum() / n.clamp(min=1)).detach()


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
) -> tuple[Tensor, dict[str, Tensor]]:
    """Clipped surrogate loss over the selected tokens.

    Args:
        logprobs: [B, T] log π_θ of the sampled tokens (carries the gradient).
        old_logprobs: [B, T] log π_old (the sampling policy).
        advantages: [B] per response, or [B, T] per token.
        mask: [B, T] response mask, bool or 0/1.
        selected: [B, T] tokens that carry gradient, bool or 0/1; None means all of ``mask``.
        eps_low, eps_high: clip range [1 − eps_low, 1 + eps_high]; both >= 0.
        norm: one of ``NORM_MODES`` (module docstring).
        ref_logprobs: [B, T] log π_ref for the k3 KL penalty; ``kl_coef`` >= 0 weights it.
        entropy: [B, T] optional, only for the ``mean_entropy_selected`` metric.
        num_responses, num_tokens: global normalisers (module docstring).

    Returns:
        (loss, metrics): a 0-d loss and 0-d detached tensors ``clip_frac``, ``clip_frac_low``, ``clip_frac_high``
        (fractions of selected tokens where the clipped branch is the active minimum: ρ < 1 − eps_low with Â < 0,
        resp. ρ > 1 + eps_high with Â > 0), ``selected_frac`` (Σ M / Σ mask), ``mean_prob_selected`` (mean of
        exp(old_logprobs) over M), and when given ``mean_entropy_selected`` and ``kl`` (mean k3 over M). Means over
        an empty M are 0. These are local to the batch passed in.
    """
    if not isinstance(logprobs, Tensor) or logprobs.dim() != 2:
        raise ValueError(f"logprobs must be a [B, T] tensor, got {getattr(logprobs, 'shape', type(logprobs))}")
    shape = logprobs.shape
    B = shape[0]
    for name, value in (("old_logprobs", old_logprobs), ("mask", mask), ("selected", selected),
                        ("ref_logprobs", ref_logprobs), ("entropy", entropy)):
        _check_same_shape(name, value, shape)
    if not isinstance(advantages, Tensor) or advantages.shape not in (torch.Size([B]), shape):
        raise ValueError(f"advantages must be [B] = ({B},) or [B, T] = {tuple(shape)}, "
                         f"got {tuple(getattr(advantages, 'shape', ()))}")
    mask = as_bool_mask(mask, "mask")
    active = mask if selected is None else as_bool_mask(selected, "selected") & mask
    if norm not in NORM_MODES:
        raise ValueError(f"norm must be one of {list(NORM_MODES)}, got {norm!r}")
    for name, value in (("eps_low", eps_low), ("eps_high", eps_high), ("kl_coef", kl_coef)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
            raise ValueError(f"{name} must be a number >= 0, got {value!r}")
    _check_count("num_responses", num_responses)
    _check_count("num_tokens", num_tokens)

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
        d = ref_logprobs.detach() - lp  # inactive garbage here is dropped by the where below
        kl = torch.exp(d) - d - 1.0
        if kl_coef:
            psi = psi - kl_coef * kl
    per_token = torch.where(active, -psi, 0.0)

    n_active = active.sum(dim=1).to(logprobs.dtype)
    n_mask = mask.sum(dim=1).to(logprobs.dtype)
    if norm in ("per_response_selected", "per_response_all"):
        row_den = n_active if norm == "per_response_selected" else n_mask
        per_response = per_token.sum(dim=1) / row_den.clamp(min=1)
        loss = per_response.sum() / _denominator(num_responses, torch.tensor(float(B), dtype=logprobs.dtype,
                                                                             device=logprobs.device))
    else:
        local = n_active.sum() if norm == "token_mean_selected" else n_mask.sum()
        loss = per_token.sum() / _denominator(num_tokens, local)

    with torch.no_grad():
        low = (ratio < 1.0 - eps_low) & (adv < 0) & active
        high = (ratio > 1.0 + eps_high) & (adv > 0) & active
        metrics = {
            "clip_frac": _masked_mean((low | high).to(ratio.dtype), active),
            "clip_frac_low": _masked_mean(low.to(ratio.dtype), active),
            "clip_frac_high": _masked_mean(high.to(ratio.dtype), active),
            "selected_frac": (n_active.sum() / n_mask.sum().clamp(min=1)).detach(),
            "mean_prob_selected": _masked_mean(torch.exp(old), active),
        }
        if entropy is not None:
            metrics["mean_entropy_selected"] = _masked_mean(entropy.to(ratio.dtype), active)
        if kl is not None:
            metrics["kl"] = _masked_mean(kl, active)
    return loss, metrics


def grpo_advantages(rewards: Tensor, group_ids: Tensor, scale: str = "std", eps: float = 1e-4) -> Tensor:
    """Group-relative advantages Â_i = (r_i − mean_g r) / (std_g r + eps) (method.md §1).

    Args:
        rewards: [B] float rewards.
        group_ids: [B] integer prompt labels; members of a group need not be adjacent.
        scale: ``"std"`` divides by the group's sample standard deviation (Bessel-corrected, as TRL and verl's
            ``torch.std``) plus ``eps``; ``"none"`` only centres (Dr.GRPO).
        eps: >= 0, added to the standard deviation.

    Returns:
        [B] advantages in ``rewards``' floating dtype (float32 for integer rewards). A group of one response gets 0.
    """
    if not isinstance(rewards, Tensor) or rewards.dim() != 1:
        raise ValueError(f"rewards must be a [B] tensor, got {getattr(rewards, 'shape', type(rewards))}")
    if not isinstance(group_ids, Tensor) or group_ids.shape != rewards.shape:
        raise ValueError(f"group_ids must be [B] = {tuple(rewards.shape)}, got {getattr(group_ids, 'shape', None)}")
    if group_ids.is_floating_point() or group_ids.dtype == torch.bool:
        raise ValueError(f"group_ids must be an integer tensor, got {group_ids.dtype}")
    if scale not in ("std", "none"):
        raise ValueError(f"scale must be 'std' or 'none', got {scale!r}")
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not eps >= 0:
        raise ValueError(f"eps must be a number >= 0, got {eps!r}")
    r = rewards.detach()
    r = r if r.is_floating_point() else r.float()
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
