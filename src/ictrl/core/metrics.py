"""The step's diagnostics: the selection's metrics and TRL's loss metrics, read from the device in one transfer
(docs/architecture.md, "Module notes")."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from ictrl.core.checks import MASK, check_tensor

if TYPE_CHECKING:
    from ictrl.core.loss import LossSpec
    from ictrl.core.stats import TokenStats

_FIELDS = {"h1": "entropy", "h2": "renyi2", "purity": "purity", "prob": "prob"}


Metric = tuple[str, Tensor, Tensor]  # a name, its 0-d value, and the 0-d size of the set it is a mean over


def step_metrics(stats: TokenStats, mask: Tensor, selected: Tensor) -> dict[str, float]:
    """Summarise the selection of one step (module docstring), read from the device in one transfer.

    Args:
        stats: ``TokenStats`` whose fields ``entropy``, ``renyi2``, ``purity``, ``prob`` are [B, T].
        mask: [B, T] response mask, bool or 0/1.
        selected: [B, T] selected tokens, bool or 0/1 (intersected with ``mask``).
    """
    return read_metrics(step_metric_values(stats, mask, selected))


def step_metric_values(stats: TokenStats, mask: Tensor, selected: Tensor) -> list[Metric]:
    """:func:`step_metrics` as device values, each with the size of its set, for :func:`read_metrics`."""
    mask = check_tensor("mask", mask, ("B", "T"), MASK)
    selected = check_tensor("selected", selected, mask.shape, MASK, of="mask's ")
    fields = {key: check_tensor(f"stats.{attr}", getattr(stats, attr, None), mask.shape, of="mask's ").detach().double()
              for key, attr in _FIELDS.items()}
    chosen = selected & mask
    n_all, n_sel = mask.sum().double(), chosen.sum().double()
    one = n_all.new_ones(())
    out: list[Metric] = [("tokens/all", n_all, one), ("tokens/selected", n_sel, one),
                         ("selected_frac", torch.where(n_all > 0, n_sel / n_all, 0.0), one)]
    for where, n, suffix in ((mask, n_all, "all"), (chosen, n_sel, "selected")):
        out += [(f"{key}/{suffix}", value[where].mean(), n) for key, value in fields.items()]
    threshold = fields["h1"][mask].median()
    out += [("pi_minus_beta/selected", (fields["prob"] - fields["purity"])[chosen].mean(), n_sel),
            ("selected/high_entropy_frac", (fields["h1"][chosen] > threshold).double().mean(), n_sel)]
    return out


def read_metrics(values: list[Metric]) -> dict[str, float]:
    """The metrics on the host in one transfer; a mean over an empty set is left out."""
    if not values:
        return {}
    read = torch.stack([torch.stack([v.double(), n.double()]) for _, v, n in values]).tolist()
    return {name: value for (name, _, _), (value, n) in zip(values, read) if n}


# TRL 1.16's loss types whose clipped ratios GRPOTrainer._compute_loss logs as clip_ratio/*
_CLIPPED = ("grpo", "bnpo", "dr_grpo", "dapo", "luspo")


@torch.no_grad()
def trl_loss_metrics(logps: Tensor, old: Tensor, advantages: Tensor, mask: Tensor, spec: LossSpec,
                     ref: Tensor | None = None, entropy: Tensor | None = None
                     ) -> tuple[dict[str, tuple[Tensor, Tensor]], dict[str, Tensor]]:
    """The metrics TRL 1.16's ``GRPOTrainer._compute_loss`` logs for one micro-batch, computed as TRL computes
    them over the response ``mask``: (local sum, local count) of each global masked mean (``kl``, ``entropy``,
    ``clip_ratio/*_mean``, ``cispo_clip_ratio``), and the [B] per-response means whose global minimum / maximum
    it logs (``clip_ratio/low_min``, ``clip_ratio/high_max``). ``ref``: log π_ref (None: no KL term);
    ``entropy``: None where the loss's forward gave none (``sparse_backward``)."""
    m = mask.to(logps.dtype)
    log_ratio = per_token = logps.detach() - old.detach()
    if spec.level == "sequence":
        log_ratio = ((log_ratio * m).sum(-1) / m.sum(-1).clamp(min=1.0)).unsqueeze(-1)
    coef = torch.exp(log_ratio)
    adv = (advantages.unsqueeze(1) if advantages.dim() == 1 else advantages).to(coef.dtype)

    def masked(x: Tensor) -> tuple[Tensor, Tensor]:
        if x.shape[1] == 1:  # importance_sampling_level "sequence": one value per response
            return x.sum(), x.new_tensor(float(x.shape[0]))
        return (x * m).sum(), m.sum()

    def per_response(x: Tensor) -> Tensor:
        return x.squeeze(1) if x.shape[1] == 1 else (x * m).sum(-1) / m.sum(-1)

    means: dict[str, tuple[Tensor, Tensor]] = {}
    extremes: dict[str, Tensor] = {}
    if ref is not None:
        d = ref.detach() - logps.detach()
        kl = torch.exp(d) - d - 1
        means["kl"] = masked(kl * coef if spec.bias_correction_kl else kl)
    if entropy is not None:
        means["entropy"] = masked(entropy.detach())
    if spec.loss_type in _CLIPPED:
        low = ((coef < 1 - spec.eps_low) & (adv < 0)).to(coef.dtype)
        high = ((coef > 1 + spec.eps_high) & (adv > 0)).to(coef.dtype)
        means["clip_ratio/low_mean"], means["clip_ratio/high_mean"] = masked(low), masked(high)
        means["clip_ratio/region_mean"] = masked(torch.maximum(low, high))
        extremes["clip_ratio/low_min"], extremes["clip_ratio/high_max"] = per_response(low), per_response(high)
    elif spec.loss_type == "cispo":
        means["cispo_clip_ratio"] = masked(((coef > spec.eps_high) & (adv > 0)).to(coef.dtype))
    elif spec.loss_type == "vespo":  # TRL's gamma weight of each response (without a vLLM importance ratio)
        log_w = (per_token.clamp(-20.0, 20.0) * m).sum(-1, keepdim=True).clamp(math.log(1e-8), 20.0)
        nonneg = adv >= 0
        k = torch.where(nonneg, adv.new_tensor(spec.vespo_k_pos), adv.new_tensor(spec.vespo_k_neg))
        lam = torch.where(nonneg, adv.new_tensor(spec.vespo_lambda_pos), adv.new_tensor(spec.vespo_lambda_neg))
        lam = lam.clamp(min=1e-4)
        phi = torch.exp(lam + k * log_w - lam * torch.exp(log_w)).nan_to_num(nan=0.0, posinf=0.0, neginf=0.0)
        means["vespo/phi_seq_mean"] = masked(phi)
    return means, extremes


def nan_extreme(x: Tensor, lowest: bool) -> Tensor:
    """TRL's ``nanmin`` / ``nanmax`` of a 1-D tensor (NaN when every value is), without a host read."""
    nan = torch.isnan(x)
    fill = torch.where(nan, float("inf") if lowest else float("-inf"), x)
    value = fill.min() if lowest else fill.max()
    return torch.where(nan.all(), float("nan"), value)
