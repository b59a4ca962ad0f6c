"""The policy-gradient loss over the selected tokens: the loss types, the importance weight, the KL term and
one ``aggregate`` (docs/method.md §3, §5, §7; docs/architecture.md, "Module notes")."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch
from torch import Tensor

from ictrl.core.checks import OptionError, as_bool_mask, check_number, check_tensor, require_finite, to_bool_mask

NORM_MODES = ("per_response_selected", "token_mean_selected", "token_mean_all", "per_response_all", "dr_grpo",
              "sequence_sum")
IS_MODES = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")
LEVELS = ("token", "sequence")
KL_SCOPES = ("selected", "all_tokens")
_VESPO_LOG_MIN = math.log(1e-8)
# the numbers LossSpec holds to a range, each with its rule (check_number's keywords): their one check
RANGED: dict[str, dict[str, bool]] = {
    "eps_low": {}, "eps_high": {}, "kl_coef": {}, "delta": {"above": True, "optional": True},
    "sapo_temperature_pos": {"above": True}, "sapo_temperature_neg": {"above": True},
    "off_policy_threshold": {"optional": True}, "is_clip_min": {"optional": True},
    "is_clip_max": {"above": True, "optional": True}}


# ------------------------------------------------------------------------------------------ the run's options


@dataclass(frozen=True)
class LossSpec:
    """The run's loss options. This constructor is the one check of every value: a bad one raises an
    :class:`OptionError` naming the field (``ICTGRPOConfig``, which builds the spec in its validation, names its own
    field instead), so the loss of every micro-batch reads them as they are. The defaults are TRL's, except the
    clip range: GRPO's symmetric 0.2/0.2, TRL's ``epsilon`` with no ``epsilon_high`` (DAPO's 0.28 is asked for)."""

    # the policy term P
    loss_type: str = "grpo"                     # a key of LOSS_TYPES: its per-token term (``norm`` aggregates it)
    level: str = "token"                        # "token", or "sequence" (GSPO: one ratio per response)
    eps_low: float = 0.2                        # the clip range [1 − eps_low, 1 + eps_high]; cispo: eps_high caps ρ
    eps_high: float = 0.2
    delta: float | None = None                  # the cap of the unclipped ratio (two-sided clipping); None: none
    sapo_temperature_pos: float = 1.0           # sapo's and vespo's constants
    sapo_temperature_neg: float = 1.05
    vespo_k_pos: float = 2.0
    vespo_lambda_pos: float = 3.0
    vespo_k_neg: float = 3.0
    vespo_lambda_neg: float = 2.0
    off_policy_threshold: float | None = None   # the off-policy sequence mask's threshold; None: no mask
    # the importance weight w (importance_weights), applied only when the batch brings sampler_logprobs
    is_mode: str = "token_truncate"
    is_clip_min: float | None = None
    is_clip_max: float | None = 3.0
    # the KL term
    kl_coef: float = 0.0
    kl_scope: str = "selected"                  # K = M ("selected") or the mask ("all_tokens")
    bias_correction_kl: bool = False            # KL times ρ
    # the aggregation
    norm: str = "per_response_selected"         # one of NORM_MODES (aggregate)
    max_completion_length: int | None = None    # dr_grpo's constant (required there, ignored otherwise)

    def __post_init__(self) -> None:
        for name, choices in (("norm", NORM_MODES), ("loss_type", tuple(LOSS_TYPES)), ("level", LEVELS),
                              ("kl_scope", KL_SCOPES), ("is_mode", IS_MODES)):
            if getattr(self, name) not in choices:
                raise OptionError(name, f"must be one of {list(choices)}, got {getattr(self, name)!r}")
        for name, rule in RANGED.items():
            check_number(name, getattr(self, name), **rule)
        lo, hi = self.is_clip_min, self.is_clip_max
        if lo is not None and hi is not None and not lo < hi:
            raise OptionError("is_clip_min", f"must be < the upper bound is_clip_max ({hi}), got {lo}")
        if self.norm == "dr_grpo":  # the constant denominator
            check_number("max_completion_length", self.max_completion_length, 1, integer=True)


@dataclass(frozen=True)
class LossExtras:
    """The optional per-batch inputs of :func:`policy_loss`: [B, T] tensors shaped as ``logprobs`` and the
    global normalisers (module docstring).

    ``ref_logprobs``: log π_ref for the k3 KL penalty (None: no KL term); ``entropy``: only for the
    ``mean_entropy_selected`` metric; ``sampler_logprobs``: the log-probs the rollout engine reported for the
    sampled tokens (None: no importance weight); ``behaviour_logprobs``: the sampler's log-probs for the off-policy
    mask (None: ``old_logprobs``); ``num_responses``, ``num_tokens``, ``num_mask_tokens``: numbers >= 0 or 0-d
    tensors (a tensor's value is not read here: reading it would wait for the device every step).
    """

    ref_logprobs: Tensor | None = None
    entropy: Tensor | None = None
    sampler_logprobs: Tensor | None = None
    behaviour_logprobs: Tensor | None = None
    num_responses: int | float | Tensor | None = None
    num_tokens: int | float | Tensor | None = None
    num_mask_tokens: int | float | Tensor | None = None


@dataclass(frozen=True)
class Tokens:
    """One batch's [B, T] per-token tensors, as every loss type reads them. Every position no term reads holds 0:
    padding may hold ±inf or NaN, and 0·inf in backward would be NaN."""

    logprobs: Tensor           # log π_θ of the sampled tokens (carries the gradient)
    old_logprobs: Tensor       # log π_old (detached)
    log_ratio: Tensor          # ℓ = log π_θ − log π_old, per token
    ratio: Tensor              # ρ = exp(ℓ), or under level="sequence" the response's exp(Σ_t M ℓ / Σ_t M)
    advantages: Tensor         # Â, one per token (detached)
    mask: Tensor               # the bool response mask
    is_weight: Tensor | None   # w, the sampler/trainer importance weight (None: the batch brought no sampler)


# -------------------------------------------------------------------------------------------- the loss types


@dataclass(frozen=True)
class LossType:
    """A registered loss type: its per-token policy term P and how TRL aggregates it.

    ``trl_norm``: the normaliser TRL aggregates it with (``ICTGRPOConfig`` uses it under ``token_selector='all'``).
    ``buffer_mean``: TRL's token count is the generation buffer's, averaged over its optimizer steps.
    ``whole_response``: P weights each response by a function of its whole-sequence ratio times w, so it reads
    every mask token, takes w inside that weight rather than as a factor, and cannot be restricted to a selection.
    """

    term: Callable[[Tokens, LossSpec], Tensor]
    trl_norm: str
    buffer_mean: bool = False
    whole_response: bool = False


LOSS_TYPES: dict[str, LossType] = {}


def register_loss_type(name: str, trl_norm: str, *, buffer_mean: bool = False, whole_response: bool = False
                       ) -> Callable[[Callable[[Tokens, LossSpec], Tensor]], Callable[[Tokens, LossSpec], Tensor]]:
    """Decorator registering ``term(x: Tokens, spec: LossSpec) -> [B, T]`` as loss type ``name`` (usable as
    ``loss_type`` by :class:`LossSpec` and ``ICTGRPOConfig``); several names may share one term."""
    if name in LOSS_TYPES:
        raise ValueError(f"loss type {name!r} is already registered")
    if trl_norm not in NORM_MODES:
        raise ValueError(f"loss type {name!r}: trl_norm must be one of {list(NORM_MODES)}, got {trl_norm!r}")

    def decorator(term: Callable[[Tokens, LossSpec], Tensor]) -> Callable[[Tokens, LossSpec], Tensor]:
        LOSS_TYPES[name] = LossType(term, trl_norm, buffer_mean, whole_response)
        return term

    return decorator


# TRL's five clipped loss types share one per-token term and differ only in how TRL aggregates it (bnpo's token
# mean is local to TRL's micro-batch: the trainer passes that count as ``num_tokens``).
@register_loss_type("luspo", "sequence_sum")
@register_loss_type("dapo", "token_mean_all", buffer_mean=True)
@register_loss_type("dr_grpo", "dr_grpo")
@register_loss_type("bnpo", "token_mean_all")
@register_loss_type("grpo", "per_response_all")  # decorators apply bottom-up: grpo is registered first
def clipped_surrogate(x: Tokens, spec: LossSpec) -> Tensor:
    """PPO's clipped surrogate, −min(ρ̃·Â, clip(ρ, 1 − eps_low, 1 + eps_high)·Â)."""
    # ρ̃ = min(ρ, delta): two-sided clipping also caps the unclipped branch when Â < 0
    unclipped = x.ratio if spec.delta is None else torch.clamp(x.ratio, max=spec.delta)
    clipped = torch.clamp(x.ratio, 1.0 - spec.eps_low, 1.0 + spec.eps_high)
    # the pessimistic bound: no gain from moving ρ outside the trust region
    return -torch.minimum(unclipped * x.advantages, clipped * x.advantages)


@register_loss_type("cispo", "token_mean_all", buffer_mean=True)
def cispo(x: Tokens, spec: LossSpec) -> Tensor:
    """CISPO: −sg(min(ρ, eps_high))·Â·log π_θ, a REINFORCE term whose clipped ratio only weights it, so every token
    keeps its gradient."""
    return -torch.clamp(x.ratio, max=spec.eps_high).detach() * x.advantages * x.logprobs


@register_loss_type("sapo", "per_response_all")
def sapo(x: Tokens, spec: LossSpec) -> Tensor:
    """SAPO: −(4/τ)·σ(τ(ρ − 1))·Â, a smooth gate in place of the hard clip (slope 1 at ρ = 1), τ = τ_pos if Â > 0
    else τ_neg."""
    tau = torch.where(x.advantages > 0, x.ratio.new_tensor(spec.sapo_temperature_pos),
                      x.ratio.new_tensor(spec.sapo_temperature_neg))
    return -torch.sigmoid(tau * (x.ratio - 1.0)) * 4.0 / tau * x.advantages


@register_loss_type("vespo", "token_mean_all", buffer_mean=True, whole_response=True)
def vespo(x: Tokens, spec: LossSpec) -> Tensor:
    """VESPO: −sg(φ(W))·Â·log π_θ with W the response's whole-sequence ratio (every mask token) times its sampler
    weights, φ(W) = exp(λ + k log W − λW), k and λ by the sign of Â."""
    return -_vespo_phi(x, spec) * x.advantages * x.logprobs


@torch.no_grad()
def _vespo_phi(x: Tokens, spec: LossSpec) -> Tensor:
    """VESPO's detached gamma weight φ(W), log W clamped to [log 1e-8, 20] as TRL does; [B, T]."""
    seq = torch.where(x.mask, x.log_ratio.clamp(-20.0, 20.0), 0.0).sum(dim=1, keepdim=True)
    if x.is_weight is not None:
        log_w = torch.log(x.is_weight.to(x.log_ratio.dtype)).clamp(_VESPO_LOG_MIN, 20.0)
        seq = seq + torch.where(x.mask, log_w, 0.0).sum(dim=1, keepdim=True)
    log_w_seq = seq.clamp(_VESPO_LOG_MIN, 20.0)
    nonneg = x.advantages >= 0
    k = torch.where(nonneg, x.log_ratio.new_tensor(spec.vespo_k_pos), x.log_ratio.new_tensor(spec.vespo_k_neg))
    lam = torch.where(nonneg, x.log_ratio.new_tensor(spec.vespo_lambda_pos),
                      x.log_ratio.new_tensor(spec.vespo_lambda_neg)).clamp(min=1e-4)
    phi = torch.exp(lam + k * log_w_seq - lam * torch.exp(log_w_seq))
    return phi.nan_to_num(nan=0.0, posinf=0.0, neginf=0.0)


# --------------------------------------------------------------------------------- the weight and the aggregation


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


def aggregate(loss_mat: Tensor, where: Tensor, mask: Tensor, norm: str, *,
              num_responses: int | float | Tensor | None = None, num_tokens: int | float | Tensor | None = None,
              max_completion_length: int | None = None) -> Tensor:
    """The 0-d loss of a [B, T] per-token term over the bool [B, T] tokens ``where`` (within ``mask``) under
    ``norm`` (module docstring; overrides: global normalisers). Entries outside ``where`` are dropped."""
    dtype, device = loss_mat.dtype, loss_mat.device
    loss_mat = torch.where(where, loss_mat, 0.0)
    responses = _denominator(num_responses, torch.tensor(float(loss_mat.size(0)), dtype=dtype, device=device))
    if norm in ("per_response_selected", "per_response_all"):
        row_den = (where if norm == "per_response_selected" else mask).sum(dim=1).to(dtype)
        return (loss_mat.sum(dim=1) / row_den.clamp(min=1)).sum() / responses
    if norm == "dr_grpo":
        return loss_mat.sum() / (responses * float(max_completion_length))  # type: ignore[arg-type]
    if norm == "sequence_sum":
        return loss_mat.sum() / responses
    local = (where if norm == "token_mean_selected" else mask).sum().to(dtype)
    return loss_mat.sum() / _denominator(num_tokens, local)


# ------------------------------------------------------------------------------------------------ the loss


_NO_EXTRAS = LossExtras()
_DEFAULT_SPEC = LossSpec()


@dataclass(frozen=True)
class _Cover:
    """The bool [B, T] tokens each part of the loss covers."""

    mask: Tensor    # the response mask
    active: Tensor  # M = selected & mask, the policy term's
    kl: Tensor      # K, the KL term's: M, or the mask itself under kl_scope="all_tokens"
    read: Tensor    # where log-probs are read: M ∪ K, or the whole mask for vespo and the off-policy mask


def policy_loss(logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, mask: Tensor,
                selected: Tensor | None = None, spec: LossSpec = _DEFAULT_SPEC,
                extras: LossExtras = _NO_EXTRAS) -> tuple[Tensor, dict[str, Tensor]]:
    """The loss over the selected tokens (module docstring).

    Args:
        logprobs: [B, T] log π_θ of the sampled tokens (carries the gradient).
        old_logprobs: [B, T] log π_old (the policy that sampled, as the trainer computes it).
        advantages: [B] per response, or [B, T] per token.
        mask: [B, T] response mask, bool or 0/1.
        selected: [B, T] tokens that carry gradient, bool or 0/1; None means all of ``mask``.
        spec: the run's loss options (:class:`LossSpec`, checked when it was built).
        extras: the batch's optional tensors and global normalisers (:class:`LossExtras`).

    Returns:
        (loss, metrics): a 0-d loss and 0-d detached local metrics ``clip_frac`` / ``_low`` / ``_high`` (fractions
        of M where the clipped branch is the minimum: ρ < 1 − eps_low with Â < 0, resp. ρ > 1 + eps_high with
        Â > 0), ``selected_frac`` (Σ M / Σ mask), ``mean_prob_selected`` (mean exp(old_logprobs) over M), and when
        given ``mean_entropy_selected``, ``kl`` (mean k3 over M), ``is_ratio_mean`` and ``is_clipped_frac`` (mean
        weight w over M, fraction of M where w was truncated or masked). Means over an empty M are 0.
    """
    _check_batch(logprobs, old_logprobs, advantages, mask, selected, extras)
    return policy_loss_unchecked(logprobs, old_logprobs, advantages, as_bool_mask(mask, "mask"),
                                 None if selected is None else as_bool_mask(selected, "selected"), spec, extras)


def policy_loss_unchecked(logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, mask: Tensor,
                          selected: Tensor | None = None, spec: LossSpec = _DEFAULT_SPEC,
                          extras: LossExtras = _NO_EXTRAS) -> tuple[Tensor, dict[str, Tensor]]:
    """:func:`policy_loss` on tensors the caller built (the trainer's step): shapes and 0/1 masks taken as they
    are; the checks that find a diverged model (non-finite log-probs where they are read) still run."""
    kind, ref_logprobs, sampler_logprobs = LOSS_TYPES[spec.loss_type], extras.ref_logprobs, extras.sampler_logprobs
    behaviour = _behaviour_logprobs(old_logprobs, spec, extras)
    mask = to_bool_mask(mask)
    active = mask if selected is None else to_bool_mask(selected) & mask
    kl_where = mask if spec.kl_scope == "all_tokens" and ref_logprobs is not None else active
    read = mask if kind.whole_response or behaviour is not None else active | kl_where
    cover = _Cover(mask, active, kl_where, read)
    _check_inputs_finite(logprobs, old_logprobs, advantages, cover, spec, extras)

    weight, is_clipped = (None, None) if sampler_logprobs is None else importance_weights(
        old_logprobs, sampler_logprobs, mask, spec.is_mode, spec.is_clip_min, spec.is_clip_max)
    x = _tokens(logprobs, old_logprobs, advantages, weight, cover, spec)
    # P, the loss type's per-token term, times w (a whole-response term folds w into its own weight)
    policy = kind.term(x, spec)
    if weight is not None and not kind.whole_response:
        policy = policy * torch.where(active, weight, 0.0).to(policy.dtype)
    if behaviour is not None:  # the off-policy sequence mask
        policy = policy * _on_policy_enough(x, behaviour, spec).to(policy.dtype)
    counts = dict(num_responses=extras.num_responses, max_completion_length=spec.max_completion_length)
    loss = aggregate(policy, active, mask, spec.norm, num_tokens=extras.num_tokens, **counts)
    kl = None if ref_logprobs is None else _kl_term(x, ref_logprobs, kl_where, spec)
    if kl is not None and spec.kl_coef:
        kl_tokens = extras.num_mask_tokens if kl_where is mask and spec.norm == "token_mean_selected" \
            else extras.num_tokens
        loss = loss + spec.kl_coef * aggregate(kl, kl_where, mask, spec.norm, num_tokens=kl_tokens, **counts)
    parts = {"mean_entropy_selected": extras.entropy, "kl": kl, "is_ratio_mean": weight,
             "is_clipped_frac": is_clipped}
    return loss, _metrics(x, active, spec, parts)


def _tokens(logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, weight: Tensor | None, cover: _Cover,
            spec: LossSpec) -> Tokens:
    """The :class:`Tokens` of one batch: every position not read is zeroed first."""
    shape = logprobs.shape
    lp = torch.where(cover.read, logprobs, 0.0)
    old = torch.where(cover.read, old_logprobs.detach(), 0.0)
    adv = advantages.detach().to(logprobs.dtype)
    adv = torch.where(cover.read, adv[:, None].expand(shape) if adv.dim() == 1 else adv, 0.0)
    log_ratio = lp - old
    if spec.level == "sequence":  # GSPO: the mean log-ratio over the response's selected tokens
        n = cover.active.sum(dim=1, keepdim=True).to(lp.dtype)
        log_ratio_seq = torch.where(cover.active, log_ratio, 0.0).sum(dim=1, keepdim=True) / n.clamp(min=1)
        ratio = torch.exp(log_ratio_seq).expand(shape)
    else:
        ratio = torch.exp(log_ratio)
    return Tokens(lp, old, log_ratio, ratio, adv, cover.mask, weight)


def _behaviour_logprobs(old_logprobs: Tensor, spec: LossSpec, extras: LossExtras) -> Tensor | None:
    """The log-probs the off-policy mask compares with π_θ (the sampler's, else π_old); None without the mask."""
    if spec.off_policy_threshold is None:
        return None
    return old_logprobs if extras.behaviour_logprobs is None else extras.behaviour_logprobs


def _on_policy_enough(x: Tokens, behaviour: Tensor, spec: LossSpec) -> Tensor:
    """[B, T] bool: False for a response with Â < 0 whose mean (behaviour − log π_θ) over its mask exceeds
    ``off_policy_threshold`` (it drifted too far from the policy that sampled it to push down)."""
    lp = x.logprobs.detach()
    gap = torch.nan_to_num(torch.where(x.mask, behaviour.detach().to(lp.dtype), 0.0) - lp, nan=0.0)
    mean_gap = gap.sum(dim=1, keepdim=True) / x.mask.sum(dim=1, keepdim=True).clamp(min=1)
    return (x.advantages >= 0) | (mean_gap <= spec.off_policy_threshold)  # type: ignore[operator]


def _kl_term(x: Tokens, ref_logprobs: Tensor, where: Tensor, spec: LossSpec) -> Tensor:
    """[B, T] k3 = exp(d) − d − 1 with d = log π_ref − log π_θ: an unbiased, never negative estimate of
    KL(π_θ ‖ π_ref) per token, times ρ with ``bias_correction_kl``."""
    d = torch.where(where, ref_logprobs.detach(), 0.0) - torch.where(where, x.logprobs, 0.0)
    kl = torch.exp(d) - d - 1.0
    return kl * x.ratio if spec.bias_correction_kl else kl


@torch.no_grad()
def _metrics(x: Tokens, active: Tensor, spec: LossSpec, parts: dict[str, Tensor | None]) -> dict[str, Tensor]:
    """The 0-d detached metrics of :func:`policy_loss` (its docstring)."""
    ratio, adv = x.ratio, x.advantages
    low = (ratio < 1.0 - spec.eps_low) & (adv < 0) & active
    high = (ratio > 1.0 + spec.eps_high) & (adv > 0) & active
    return {
        "clip_frac": _masked_mean((low | high).to(ratio.dtype), active),
        "clip_frac_low": _masked_mean(low.to(ratio.dtype), active),
        "clip_frac_high": _masked_mean(high.to(ratio.dtype), active),
        "selected_frac": (active.sum() / x.mask.sum().clamp(min=1)).to(ratio.dtype),
        "mean_prob_selected": _masked_mean(torch.exp(x.old_logprobs), active),
        **{k: _masked_mean(v.to(ratio.dtype), active) for k, v in parts.items() if v is not None},
    }


# ------------------------------------------------------------------------------------------------ checks


def _check_batch(logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, mask: Tensor, selected: Tensor | None,
                 extras: LossExtras) -> None:
    B, T = check_tensor("logprobs", logprobs, ("B", "T")).shape
    named = dict(old_logprobs=old_logprobs, mask=mask, selected=selected, ref_logprobs=extras.ref_logprobs,
                 entropy=extras.entropy, sampler_logprobs=extras.sampler_logprobs,
                 behaviour_logprobs=extras.behaviour_logprobs)
    for name, value in named.items():
        if value is not None:
            check_tensor(name, value, (B, T), of="logprobs' ")
    check_tensor("advantages", advantages, (B,) if isinstance(advantages, Tensor) and advantages.dim() == 1 else (B, T))
    for name in ("num_responses", "num_tokens", "num_mask_tokens"):
        value = getattr(extras, name)
        if isinstance(value, Tensor):
            bad = value.numel() != 1
        else:
            bad = value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                         or not value >= 0)
        if bad:
            raise ValueError(f"{name} must be a number >= 0 or a 1-element tensor, got {value!r}")


def _check_inputs_finite(logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, cover: _Cover, spec: LossSpec,
                         extras: LossExtras) -> None:
    """Every value read must be finite: log-probs where a term reads them, and on the whole mask where the
    sequence importance weight sums over it. NaN sampler/behaviour log-probs mean "not scored". One host sync
    when everything is finite."""
    sampler = extras.sampler_logprobs
    read = cover.read
    old_read = cover.mask if sampler is not None and spec.is_mode.startswith("sequence") else read
    checks = [("logprobs", logprobs.detach(), read), ("old_logprobs", old_logprobs.detach(), old_read),
              ("advantages", advantages.detach(), read if advantages.dim() == 2 else read.any(dim=1))]
    if extras.ref_logprobs is not None:
        checks.append(("ref_logprobs", extras.ref_logprobs.detach(), cover.kl))
    # the importance weight reads the sampler where π_old is read; the off-policy mask the whole response
    behaviour = _behaviour_logprobs(old_logprobs, spec, extras)
    for name, x, where in (("sampler_logprobs", sampler, old_read), ("behaviour_logprobs", behaviour, cover.mask)):
        if x is not None:  # NaN = not scored; ±inf is no log-probability of a sampled token
            x = x.detach()
            checks.append((name, torch.where(torch.isnan(x), 0.0, x), where))
    flags = [(~torch.isfinite(x) & w).any() for _, x, w in checks]
    if bool(torch.stack(flags).any()):
        for name, x, where in checks:
            require_finite(name, x, where)


def _denominator(override: int | float | Tensor | None, local: Tensor) -> Tensor:
    den = local if override is None else torch.as_tensor(override, dtype=local.dtype, device=local.device)
    return torch.where(den > 0, den, torch.ones_like(den))


def _masked_mean(values: Tensor, where: Tensor) -> Tensor:
    """Mean of ``values`` over ``where`` (0 when empty), detached."""
    n = where.sum()
    return (torch.where(where, values, 0.0).sum() / n.clamp(min=1)).detach()
