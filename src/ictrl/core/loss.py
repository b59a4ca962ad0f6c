"""The policy-gradient loss restricted to selected tokens, and GRPO advantages (docs/method.md §1, §3, §5, §7).

Per token, with M = selected & mask, log-ratio ℓ = logprobs − old_logprobs and ρ = exp(ℓ) (``level="token"``) or
ρ_i = exp(Σ_t M ℓ / Σ_t M), one ratio per response over its selected tokens (``level="sequence"``, GSPO), the loss
is ``aggregate(w·P, M) + β·aggregate(KL, K)``:

- P, the per-token policy term of TRL's ``loss_type`` (:data:`LOSS_TYPES`): the clipped surrogate
  −min(ρ̃·Â, clip(ρ, 1 − eps_low, 1 + eps_high)·Â) with ρ̃ = min(ρ, delta) when ``delta`` is set (grpo, bnpo,
  dr_grpo, dapo, luspo); cispo −sg(min(ρ, eps_high))·Â·logprobs; sapo −(4/τ)·σ(τ(ρ − 1))·Â with τ = τ_pos if Â > 0
  else τ_neg; vespo −sg(φ(W))·Â·logprobs with W the response's whole-sequence ratio (every mask token) and
  φ(W) = exp(λ + k log W − λW). An off-policy sequence mask (DeepSeek-V3.2, TRL's ``off_policy_mask_threshold``)
  multiplies P by 0 for a response with Â < 0 whose mean of (behaviour − logprobs) over its mask exceeds the
  threshold.
- w, the sampler/trainer importance weight (TRL's ``vllm_importance_sampling_*``, TIS/MIS): when the rollouts come
  from another engine whose log-probs ``sampler_logprobs`` differ from the trainer's ``old_logprobs``, r =
  exp(old − sampler), detached: ``token_truncate`` w = clamp(r, is_clip_min, is_clip_max); ``token_mask`` w = r
  inside the bounds, else 0; ``sequence_*`` the same with one r per response, exp(Σ_t mask·(old − sampler)) over
  all its tokens. w multiplies the policy term only, never the KL term (as TRL). vespo folds w into W instead. A NaN
  sampler log-prob means "not scored" (vLLM's None) and gives r = 1.
- KL, the k3 estimator exp(d) − d − 1 with d = ref_logprobs − logprobs, times ρ when ``bias_correction_kl`` (TRL's
  ``use_bias_correction_kl``), over K = M (``kl_scope="selected"``) or K = mask (``"all_tokens"``).

:func:`aggregate` is the one normaliser of every term (``norm``, L a [B, T] term over the tokens W it covers):

- ``per_response_selected`` (ICT's Sparse-GRPO): (1/B)·Σ_i [Σ_t W·L / Σ_t W]; a response with Σ_t W = 0
  contributes 0 but still counts in B.
- ``per_response_all`` (original GRPO, TRL's grpo and sapo): (1/B)·Σ_i [Σ_t W·L / Σ_t mask].
- ``token_mean_selected`` (80/20 official code, STAPO): Σ W·L / Σ W.
- ``token_mean_all`` (TRL's dapo, bnpo, cispo, vespo and ``top_entropy_quantile``): Σ W·L / Σ mask.
- ``dr_grpo`` (Dr.GRPO, TRL's dr_grpo): Σ W·L / (B · max_completion_length).
- ``sequence_sum`` (TRL's luspo): (1/B)·Σ_i Σ_t W·L.

Global normalisers, for gradient accumulation and multi-process training: ``num_responses`` replaces B;
``num_tokens`` replaces the policy term's Σ W (``token_mean_selected``) or Σ mask (``token_mean_all``), and
``num_mask_tokens`` the KL term's Σ mask when K = mask under ``token_mean_selected``. Passing the totals over all
micro-batches / processes makes the sum of the micro-batch losses equal the full-batch loss. An override is ignored
by the modes it does not apply to. A count of 0 is read as 1 (the numerator is then 0 too).

Non-finite input: ``logprobs``, ``old_logprobs``, ``advantages`` and ``ref_logprobs`` must be finite wherever they
are read (at M, or on the mask where a term covers it), else a ValueError names the (row, position). Masked
positions may hold anything: they are replaced by 0 before any arithmetic and inactive per-token terms are dropped
with ``torch.where``, so ±inf/NaN padding never reaches the loss or the gradient. The loss is never NaN: empty
denominators give a finite 0 that keeps a grad_fn to ``logprobs`` (zero gradients).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from ictrl.core.checks import as_bool_mask, check_group_ids, require_finite

NORM_MODES = ("per_response_selected", "token_mean_selected", "token_mean_all", "per_response_all", "dr_grpo",
              "sequence_sum")
IS_MODES = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")
# TRL 1.16's loss types, each with the normaliser TRL aggregates it with (bnpo's token mean is local to TRL's
# micro-batch: the trainer passes that count as ``num_tokens``).
TRL_NORMALISER = {"grpo": "per_response_all", "sapo": "per_response_all", "bnpo": "token_mean_all",
                  "dapo": "token_mean_all", "cispo": "token_mean_all", "vespo": "token_mean_all",
                  "dr_grpo": "dr_grpo", "luspo": "sequence_sum"}
LOSS_TYPES = tuple(TRL_NORMALISER)
# TRL's token means whose count is the generation batch's, averaged over its optimizer steps
TRL_BUFFER_MEAN = ("dapo", "cispo", "vespo")
CLIPPED_LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo", "luspo")
KL_SCOPES = ("selected", "all_tokens")
_VESPO_LOG_MIN = math.log(1e-8)


@dataclass(frozen=True)
class Objective:
    """The per-token policy term and KL options (module docstring); the defaults are the plain clipped surrogate.

    ``loss_type``: one of :data:`LOSS_TYPES` (only its per-token term: the normaliser is ``norm``); ``level``:
    ``"token"`` or ``"sequence"`` (GSPO: one ratio per response over its selected tokens); ``delta``: the cap of
    the unclipped ratio (two-sided clipping), None for none; ``sapo_temperature_*``, ``vespo_*``: those loss types'
    constants (TRL's defaults); ``bias_correction_kl``: KL times ρ; ``kl_scope``: ``"selected"`` or ``"all_tokens"``;
    ``off_policy_threshold``: the off-policy sequence mask's threshold, None for no mask.
    """

    loss_type: str = "grpo"
    level: str = "token"
    delta: float | None = None
    sapo_temperature_pos: float = 1.0
    sapo_temperature_neg: float = 1.05
    vespo_k_pos: float = 2.0
    vespo_lambda_pos: float = 3.0
    vespo_k_neg: float = 3.0
    vespo_lambda_neg: float = 2.0
    bias_correction_kl: bool = False
    kl_scope: str = "selected"
    off_policy_threshold: float | None = None

    def check(self) -> None:
        if self.loss_type not in LOSS_TYPES:
            raise ValueError(f"loss_type must be one of {list(LOSS_TYPES)}, got {self.loss_type!r}")
        if self.level not in ("token", "sequence"):
            raise ValueError(f"importance_sampling_level must be 'token' or 'sequence', got {self.level!r}")
        if self.kl_scope not in KL_SCOPES:
            raise ValueError(f"kl_scope must be one of {list(KL_SCOPES)}, got {self.kl_scope!r}")
        _check_number("delta", self.delta, optional=True, positive=True)
        for name in ("sapo_temperature_pos", "sapo_temperature_neg"):
            _check_number(name, getattr(self, name), positive=True)
        _check_number("off_policy_mask_threshold", self.off_policy_threshold, optional=True)


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
        return
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


def _denominator(override: int | float | Tensor | None, local: Tensor) -> Tensor:
    den = local if override is None else torch.as_tensor(override, dtype=local.dtype, device=local.device)
    return torch.where(den > 0, den, torch.ones_like(den))


def _masked_mean(values: Tensor, where: Tensor) -> Tensor:
    """Mean of ``values`` over ``where`` (0 when empty), detached."""
    n = where.sum()
    return (torch.where(where, values, 0.0).sum() / n.clamp(min=1)).detach()


def aggregate(per_token: Tensor, where: Tensor, mask: Tensor, norm: str,
              num_responses: int | float | Tensor | None = None, num_tokens: int | float | Tensor | None = None,
              max_completion_length: int | None = None) -> Tensor:
    """The 0-d loss of a [B, T] per-token term over the bool [B, T] tokens ``where`` (within ``mask``) under
    ``norm`` (module docstring; overrides: global normalisers). Entries outside ``where`` are dropped."""
    dtype, device = per_token.dtype, per_token.device
    per_token = torch.where(where, per_token, 0.0)
    responses = _denominator(num_responses, torch.tensor(float(per_token.size(0)), dtype=dtype, device=device))
    if norm in ("per_response_selected", "per_response_all"):
        row_den = (where if norm == "per_response_selected" else mask).sum(dim=1).to(dtype)
        return (per_token.sum(dim=1) / row_den.clamp(min=1)).sum() / responses
    if norm == "dr_grpo":
        return per_token.sum() / (responses * float(max_completion_length))  # type: ignore[arg-type]
    if norm == "sequence_sum":
        return per_token.sum() / responses
    local = (where if norm == "token_mean_selected" else mask).sum().to(dtype)
    return per_token.sum() / _denominator(num_tokens, local)


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


@dataclass(frozen=True)
class LossSpec:
    """The run's loss options, checked once when built (a bad value raises ValueError naming it), so the loss of
    every micro-batch reads them as they are.

    ``norm``: one of :data:`NORM_MODES` (:func:`aggregate`); ``eps_low``, ``eps_high``: the clip range
    [1 − eps_low, 1 + eps_high], >= 0 (cispo: eps_high caps the ratio). The default is GRPO's symmetric 0.2/0.2, as
    TRL's ``epsilon`` with no ``epsilon_high``; DAPO's clip-higher (0.28) is asked for explicitly.
    ``kl_coef``: >= 0, the weight of the k3 KL term; ``max_completion_length``: the constant of
    ``norm="dr_grpo"`` (required there, ignored otherwise); ``is_mode``, ``is_clip_min``, ``is_clip_max``: the
    sampler/trainer importance weight (:func:`importance_weights`, applied only when the batch brings
    ``sampler_logprobs``); ``objective``: the policy term and KL options (:class:`Objective`).
    """

    norm: str = "per_response_selected"
    eps_low: float = 0.2
    eps_high: float = 0.2
    kl_coef: float = 0.0
    max_completion_length: int | None = None
    is_mode: str = "token_truncate"
    is_clip_min: float | None = None
    is_clip_max: float | None = 3.0
    objective: Objective = Objective()

    def __post_init__(self) -> None:
        if self.norm not in NORM_MODES:
            raise ValueError(f"norm must be one of {list(NORM_MODES)}, got {self.norm!r}")
        self.objective.check()
        for name in ("eps_low", "eps_high", "kl_coef"):
            _check_number(name, getattr(self, name))
        length = self.max_completion_length
        if self.norm == "dr_grpo" and (isinstance(length, bool) or not isinstance(length, int) or length < 1):
            raise ValueError(f"max_completion_length must be an int >= 1 with norm='dr_grpo' (the constant "
                             f"denominator), got {length!r}")
        if self.is_mode not in IS_MODES:
            raise ValueError(f"is_mode must be one of {list(IS_MODES)}, got {self.is_mode!r}")
        _check_number("is_clip_min", self.is_clip_min, optional=True)
        _check_number("is_clip_max", self.is_clip_max, optional=True, positive=True)
        lo, hi = self.is_clip_min, self.is_clip_max
        if lo is not None and hi is not None and not lo < hi:
            raise ValueError(f"is_clip_min ({lo}) must be < is_clip_max ({hi})")


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


_NO_EXTRAS = LossExtras()
_DEFAULT_SPEC = LossSpec()


def _check_batch(logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, mask: Tensor, selected: Tensor | None,
                 extras: LossExtras) -> None:
    if not isinstance(logprobs, Tensor) or logprobs.dim() != 2:
        raise ValueError(f"logprobs must be a [B, T] tensor, got {getattr(logprobs, 'shape', type(logprobs))}")
    shape = logprobs.shape
    named = dict(old_logprobs=old_logprobs, mask=mask, selected=selected, ref_logprobs=extras.ref_logprobs,
                 entropy=extras.entropy, sampler_logprobs=extras.sampler_logprobs,
                 behaviour_logprobs=extras.behaviour_logprobs)
    for name, value in named.items():
        _check_same_shape(name, value, shape)
    if not isinstance(advantages, Tensor) or advantages.shape not in (torch.Size([shape[0]]), shape):
        raise ValueError(f"advantages must be [B] = ({shape[0]},) or [B, T] = {tuple(shape)}, "
                         f"got {tuple(getattr(advantages, 'shape', ()))}")
    for name in ("num_responses", "num_tokens", "num_mask_tokens"):
        _check_count(name, getattr(extras, name))


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
    obj, ref_logprobs, sampler_logprobs = spec.objective, extras.ref_logprobs, extras.sampler_logprobs
    mask = as_bool_mask(mask, "mask")
    active = mask if selected is None else as_bool_mask(selected, "selected") & mask
    kl_where = mask if obj.kl_scope == "all_tokens" and ref_logprobs is not None else active
    # vespo's sequence ratio and the off-policy mask read the whole response; the KL term its scope
    whole = obj.loss_type == "vespo" or obj.off_policy_threshold is not None
    read = mask if whole else active | kl_where
    seq_is = sampler_logprobs is not None and spec.is_mode.startswith("sequence")
    behaviour = None if obj.off_policy_threshold is None else (
        old_logprobs if extras.behaviour_logprobs is None else extras.behaviour_logprobs)
    _check_inputs_finite(logprobs, old_logprobs, advantages, ref_logprobs, sampler_logprobs, behaviour, mask, read,
                         kl_where, seq_is)

    weight, is_clipped = (None, None) if sampler_logprobs is None else importance_weights(
        old_logprobs, sampler_logprobs, mask, spec.is_mode, spec.is_clip_min, spec.is_clip_max)
    terms = _terms(logprobs, old_logprobs, advantages, ref_logprobs, behaviour, weight, mask, active, read, kl_where,
                   spec)
    norm, length, responses = spec.norm, spec.max_completion_length, extras.num_responses
    loss = aggregate(terms["policy"], active, mask, norm, responses, extras.num_tokens, length)
    if (kl := terms["kl"]) is not None and spec.kl_coef:
        kl_tokens = extras.num_mask_tokens if kl_where is mask and norm == "token_mean_selected" \
            else extras.num_tokens
        loss = loss + spec.kl_coef * aggregate(kl, kl_where, mask, norm, responses, kl_tokens, length)
    parts = {"mean_entropy_selected": extras.entropy, "kl": kl, "is_ratio_mean": weight,
             "is_clipped_frac": is_clipped}
    return loss, _metrics(terms, active, mask, spec.eps_low, spec.eps_high, parts)


@torch.no_grad()
def _metrics(terms: dict[str, Tensor | None], active: Tensor, mask: Tensor, eps_low: float, eps_high: float,
             parts: dict[str, Tensor | None]) -> dict[str, Tensor]:
    """The 0-d detached metrics of :func:`policy_loss` (its docstring)."""
    ratio, adv, old = terms["ratio"], terms["adv"], terms["old"]
    assert ratio is not None and adv is not None and old is not None
    low = (ratio < 1.0 - eps_low) & (adv < 0) & active
    high = (ratio > 1.0 + eps_high) & (adv > 0) & active
    return {
        "clip_frac": _masked_mean((low | high).to(ratio.dtype), active),
        "clip_frac_low": _masked_mean(low.to(ratio.dtype), active),
        "clip_frac_high": _masked_mean(high.to(ratio.dtype), active),
        "selected_frac": (active.sum() / mask.sum().clamp(min=1)).to(ratio.dtype),
        "mean_prob_selected": _masked_mean(torch.exp(old), active),
        **{k: _masked_mean(v.to(ratio.dtype), active) for k, v in parts.items() if v is not None},
    }


def _check_inputs_finite(logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, ref_logprobs: Tensor | None,
                         sampler_logprobs: Tensor | None, behaviour: Tensor | None, mask: Tensor, read: Tensor,
                         kl_where: Tensor, seq_is: bool) -> None:
    """Every value read must be finite: log-probs where a term reads them, and on the whole mask where the
    sequence importance weight sums over it. NaN sampler/behaviour log-probs mean "not scored"."""
    old_read = mask if seq_is else read
    checks = [("logprobs", logprobs.detach(), read), ("old_logprobs", old_logprobs.detach(), old_read),
              ("advantages", advantages.detach(), read if advantages.dim() == 2 else read.any(dim=1))]
    if ref_logprobs is not None:
        checks.append(("ref_logprobs", ref_logprobs.detach(), kl_where))
    # the importance weight reads the sampler where π_old is read; the off-policy mask the whole response
    for name, x, where in (("sampler_logprobs", sampler_logprobs, old_read), ("behaviour_logprobs", behaviour, mask)):
        if x is not None:  # NaN = not scored; ±inf is no log-probability of a sampled token
            x = x.detach()
            checks.append((name, torch.where(torch.isnan(x), 0.0, x), where))
    _check_finite(checks)


def _terms(logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, ref_logprobs: Tensor | None,
           behaviour: Tensor | None, weight: Tensor | None, mask: Tensor, active: Tensor, read: Tensor,
           kl_where: Tensor, spec: LossSpec) -> dict[str, Tensor | None]:
    """[B, T] terms: ``policy`` (w·P, times the off-policy mask), ``kl`` (None without ``ref_logprobs``), and for
    the metrics ``ratio`` (ρ, per token or the response's), ``adv`` and ``old``."""
    shape, obj = logprobs.shape, spec.objective
    # Zero every position not read first: padding may hold -inf, and 0·inf in backward would be NaN.
    lp = torch.where(read, logprobs, 0.0)
    old = torch.where(read, old_logprobs.detach(), 0.0)
    adv = advantages.detach().to(logprobs.dtype)
    adv = torch.where(read, adv[:, None].expand(shape) if adv.dim() == 1 else adv, 0.0)
    log_ratio = lp - old
    if obj.level == "sequence":  # GSPO: the mean log-ratio over the response's selected tokens
        n = active.sum(dim=1, keepdim=True).to(lp.dtype)
        log_ratio_seq = torch.where(active, log_ratio, 0.0).sum(dim=1, keepdim=True) / n.clamp(min=1)
        ratio = torch.exp(log_ratio_seq).expand(shape)
    else:
        ratio = torch.exp(log_ratio)
    policy = _policy_term(obj, lp, log_ratio, ratio, adv, mask, spec.eps_low, spec.eps_high, weight)
    if weight is not None and obj.loss_type != "vespo":
        policy = policy * torch.where(active, weight, 0.0).to(policy.dtype)
    if behaviour is not None:  # the off-policy sequence mask
        gap = torch.nan_to_num(torch.where(mask, behaviour.detach().to(lp.dtype), 0.0) - lp.detach(), nan=0.0)
        mean_gap = gap.sum(dim=1, keepdim=True) / mask.sum(dim=1, keepdim=True).clamp(min=1)
        policy = policy * ((adv >= 0) | (mean_gap <= obj.off_policy_threshold)).to(policy.dtype)
    kl = None
    if ref_logprobs is not None:
        d = torch.where(kl_where, ref_logprobs.detach(), 0.0) - torch.where(kl_where, lp, 0.0)
        kl = torch.exp(d) - d - 1.0
        if obj.bias_correction_kl:
            kl = kl * ratio
    return {"policy": policy, "kl": kl, "ratio": ratio, "adv": adv, "old": old}


def _policy_term(obj: Objective, lp: Tensor, log_ratio: Tensor, ratio: Tensor, adv: Tensor, mask: Tensor,
                 eps_low: float, eps_high: float, weight: Tensor | None) -> Tensor:
    """[B, T] per-token policy term P of ``obj.loss_type`` (module docstring), before the importance weight."""
    if obj.loss_type == "cispo":
        return -torch.clamp(ratio, max=eps_high).detach() * adv * lp
    if obj.loss_type == "sapo":
        tau = torch.where(adv > 0, ratio.new_tensor(obj.sapo_temperature_pos),
                          ratio.new_tensor(obj.sapo_temperature_neg))
        return -torch.sigmoid(tau * (ratio - 1.0)) * 4.0 / tau * adv
    if obj.loss_type == "vespo":
        return -_vespo_phi(obj, log_ratio, adv, mask, weight) * adv * lp
    unclipped = ratio if obj.delta is None else torch.clamp(ratio, max=obj.delta)
    clipped = torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high)
    return -torch.minimum(unclipped * adv, clipped * adv)


@torch.no_grad()
def _vespo_phi(obj: Objective, log_ratio: Tensor, adv: Tensor, mask: Tensor, weight: Tensor | None) -> Tensor:
    """VESPO's detached gamma weight φ(W) = exp(λ + k log W − λW), W the whole response's ratio (times the sampler
    weights), log W clamped to [log 1e-8, 20] as TRL does; [B, T]."""
    seq = torch.where(mask, log_ratio.clamp(-20.0, 20.0), 0.0).sum(dim=1, keepdim=True)
    if weight is not None:
        log_w = torch.log(weight.to(log_ratio.dtype)).clamp(_VESPO_LOG_MIN, 20.0)
        seq = seq + torch.where(mask, log_w, 0.0).sum(dim=1, keepdim=True)
    log_w_seq = seq.clamp(_VESPO_LOG_MIN, 20.0)
    nonneg = adv >= 0
    k = torch.where(nonneg, log_ratio.new_tensor(obj.vespo_k_pos), log_ratio.new_tensor(obj.vespo_k_neg))
    lam = torch.where(nonneg, log_ratio.new_tensor(obj.vespo_lambda_pos),
                      log_ratio.new_tensor(obj.vespo_lambda_neg)).clamp(min=1e-4)
    phi = torch.exp(lam + k * log_w_seq - lam * torch.exp(log_w_seq))
    return phi.nan_to_num(nan=0.0, posinf=0.0, neginf=0.0)


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
