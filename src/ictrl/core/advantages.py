"""GRPO's group-relative advantages (docs/method.md §1), the input of :func:`ictrl.core.loss.policy_loss`: TRL
computes them in its trainer; this is the same arithmetic as a function of rewards and prompt labels."""

from __future__ import annotations

import torch
from torch import Tensor

from ictrl.core.checks import check_group_ids


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
