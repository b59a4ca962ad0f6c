"""Argument checks of :mod:`ictrl.core.stats`: shapes, dtypes, token ranges and finite distributions.

Each raises ``ValueError`` naming the argument (and, for values, the first offending (row, position)). With a
``group_size`` (the trainer's layout) the value checks run on the device (``require_on_device``: at once on CPU,
deferred on a GPU), so the training step makes no host read for them.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ictrl.core.checks import FLOAT, INT, MASK, check_number, check_tensor, checking, require_finite, require_on_device


def validate(
    logits: Tensor,
    mask: Tensor,
    tokens: Tensor | None,
    group_ids: Tensor | None,
    temperature: float,
    chunk_size: int | None,
    group_size: int | None = None,
) -> tuple[Tensor, Tensor | None, Tensor | None]:
    """Check arguments; return (bool mask, tokens, group_ids) on the logits' device. With ``group_size`` the
    token range is checked on the device (:func:`require_on_device`: no host read; on a GPU it is deferred) and
    out-of-range tokens are returned as 0, so nothing downstream indexes past V. Inside
    :func:`ictrl.core.checks.trusted_inputs` (the trainer's step) nothing is checked: only the conversions."""
    check_tensor("logits", logits, ("B", "T", "V"), FLOAT)
    (B, T, V), device = logits.shape, logits.device
    mask = check_tensor("mask", mask, (B, T), MASK).to(device)
    if group_ids is not None:
        group_ids = check_tensor("group_ids", group_ids, (B,), INT).to(device)
    if checking():
        check_temperature_chunk(temperature, chunk_size)
        if V < 1:
            raise ValueError("logits must have a non-empty vocabulary dimension")
        if group_size is not None and (B % check_number("group_size", group_size, 1, integer=True) or
                                       group_ids is None):
            raise ValueError(f"group_size={group_size} must divide B = {B} and comes with group_ids")
    if tokens is None:
        return mask, None, group_ids
    tokens = check_tensor("tokens", tokens, (B, T), INT).to(device)
    # Masked positions may hold padding (e.g. -100); only active ones must index the vocabulary.
    says = f"tokens at masked-in positions must lie in [0, {V})"
    if group_size is None:
        if checking() and not bool(((tokens >= 0) & (tokens < V) | ~mask).all()):
            active = tokens[mask]
            raise ValueError(f"{says}, got range [{int(active.min())}, {int(active.max())}]")
        return mask, tokens, group_ids
    in_range = (tokens >= 0) & (tokens < V)
    if checking():
        require_on_device((in_range | ~mask).all(), says)
    # On a GPU the device check is deferred: an id out of range must not reach a gather (a device-side assert).
    return mask, torch.where(in_range, tokens, 0), group_ids


def check_temperature_chunk(temperature: float, chunk_size: int | None) -> None:
    check_number("temperature", temperature, above=True)
    check_number("chunk_size", chunk_size, 1, integer=True, optional=True)


def require_finite_rows(flat: Tensor, mask: Tensor, purity: Tensor, temperature: float) -> None:
    """Raise naming the first active (row, position) whose distribution is undefined.

    Sum p^2 (purity [B*T]) is NaN exactly when a row holds a NaN or +inf logit (inf - inf), is all -inf, or
    overflows once divided by the temperature, so checking it costs [B*T] and no pass over the logits. A NaN row
    would otherwise make its whole group's mean, and so every member's ICT score at that position, NaN.
    flat: [B*T, V] logits; mask: [B, T] bool.
    """
    bad = mask.reshape(-1) & ~torch.isfinite(purity)
    if not bool(bad.any()):
        return
    rows = bad.nonzero().squeeze(1)
    shown = torch.zeros_like(purity)
    shown[rows] = math.nan
    # The message shows the first offending row's max logit / temperature: NaN, +inf, or -inf for an all -inf row.
    first = (flat[int(rows[0])].float() / temperature).amax()
    if not bool(torch.isfinite(first)):
        shown[rows[0]] = first
    require_finite("logits (a NaN or +inf logit, or all -inf; shown: the row's max / temperature)",
                   shown.view(mask.shape), mask)
