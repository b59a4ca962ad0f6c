"""ICT written plainly, in float64: the group JS score, top-k per unit, and the Sparse-GRPO loss.

This is the place to read the method in one sitting. The fast forms the trainer runs are
:func:`ictrl.core.stats.group_js_divergence` (streamed over vocabulary chunks, compiled or Triton),
:func:`ictrl.core.selection.select` (vectorised ranking with exact ceil counts) and
:func:`ictrl.core.loss.policy_loss` (every normaliser, KL, importance weights). The tests check each fast form
against the function here of the same name, so this file is the definition and the others are its optimisations.

Layout, as everywhere in ``ictrl.core``: ``logits[b, t]`` ``[B, T, V]`` is the distribution that produced response
token ``t`` of response ``b``; ``mask`` ``[B, T]`` marks real response tokens; ``group_ids`` ``[B]`` labels the
prompt each response answers (members of a group need not be adjacent).
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import TypeVar

import torch
from torch import Tensor

CountT = TypeVar("CountT", int, Tensor)


def softmax64(logits: Tensor, temperature: float = 1.0) -> Tensor:
    """[B, T, V] float64 probabilities of ``logits / temperature``."""
    return torch.softmax(logits.double() / temperature, dim=-1)


def kl64(p: Tensor, q: Tensor) -> float:
    """KL(p ‖ q) in nats for two [V] distributions, with 0·log 0 = 0."""
    nz = p > 0
    return float((p[nz] * (p[nz].log() - q[nz].log())).sum())


def group_js(logits: Tensor, mask: Tensor, group_ids: Tensor, temperature: float = 1.0) -> Tensor:
    """[B, T] float64 ICT score u[b, t] = JS(p_bt ‖ q_gt), q_gt the mean of p_jt over the group's active members j.

    Position t is shared across the group (the responses are aligned by index, not by content). A position with
    fewer than two active members has nothing to diverge from and scores 0, as do masked positions.
    """
    return group_js_of_probs(softmax64(logits, temperature), mask, group_ids)


def group_js_of_probs(p: Tensor, mask: Tensor, group_ids: Tensor) -> Tensor:
    """:func:`group_js` from [B, T, V] probabilities already formed (e.g. a top-K distribution made dense)."""
    p = p.double()
    B, T, _ = p.shape
    u = torch.zeros(B, T, dtype=torch.float64)
    for b in range(B):
        for t in range(T):
            if not mask[b, t]:
                continue
            members = [j for j in range(B) if int(group_ids[j]) == int(group_ids[b]) and bool(mask[j, t])]
            if len(members) < 2:
                continue
            q = p[members, t].mean(dim=0)
            m = 0.5 * (p[b, t] + q)
            u[b, t] = 0.5 * kl64(p[b, t], m) + 0.5 * kl64(q, m)
    return u


def ceil_count(ratio: str | float, n: CountT) -> CountT:
    """ceil(ratio · n) exactly, on the decimal ratio (0.1 · 30 is 3, not 4): how many tokens a unit of n keeps.

    ``n`` is an int or an integer tensor of counts (the fast selection counts every unit at once); integer
    arithmetic on the ratio's exact fraction p/q, so no float product overshoots an integer (0.07 · 100 in binary
    floats is 7.000000000000001).
    """
    frac = Fraction(str(ratio))
    return -((-n * frac.numerator) // frac.denominator)


def top_k_per_unit(score: Tensor, mask: Tensor, unit_of_row: list[int], ratio: float) -> Tensor:
    """[B, T] bool: in each unit (rows sharing a label), the ceil(ratio · n) active positions of highest score.

    Ties go to the earlier position in row-major order, so the selection is deterministic. ICT's default unit is
    the response (``unit_of_row = range(B)``); ``scope: group`` and ``scope: batch`` pool rows.
    """
    B, T = mask.shape
    units: dict[int, list[tuple[float, int]]] = {}
    for b in range(B):
        for t in range(T):
            if mask[b, t]:
                units.setdefault(unit_of_row[b], []).append((-float(score[b, t]), b * T + t))
    out = torch.zeros(B * T, dtype=torch.bool)
    for members in units.values():
        for _, flat in sorted(members)[: ceil_count(ratio, len(members))]:
            out[flat] = True
    return out.view(B, T)


def sparse_grpo_loss(logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, mask: Tensor, selected: Tensor,
                     eps_low: float = 0.2, eps_high: float = 0.2) -> float:
    """The Sparse-GRPO objective (to minimise) over ``selected`` ⊆ ``mask``, both [B, T]; advantages [B].

    Each response averages the clipped surrogate −min(ρA, clip(ρ, 1−ε_low, 1+ε_high)A) over its selected tokens
    (the method's ``per_response_selected`` normaliser: a response's weight does not depend on how many of its
    tokens were kept), and the responses are averaged over the batch B. A response with no selected token adds 0.
    """
    B, T = mask.shape
    total = 0.0
    for b in range(B):
        terms = []
        for t in range(T):
            if not (mask[b, t] and selected[b, t]):
                continue
            a = float(advantages[b])
            rho = math.exp(float(logprobs[b, t]) - float(old_logprobs[b, t]))
            terms.append(-min(rho * a, min(max(rho, 1 - eps_low), 1 + eps_high) * a))
        total += sum(terms) / len(terms) if terms else 0.0
    return total / B
