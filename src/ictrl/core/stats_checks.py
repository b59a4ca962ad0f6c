"""Argument checks of :mod:`ictrl.core.stats`: shapes, dtypes, token ranges and finite distributions.

Each raises ``ValueError`` naming the argument (and, for values, the first offending (row, position)). With a
``group_size`` (the trainer's layout) the value checks run on the device (``require_on_device``: at once on CPU,
deferred on a GPU), so the training step makes no host read for them.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ictrl.core.checks import (FLOAT, INT, MASK, check_number, check_tensor, require_finite, require_on_device,
                               to_bool_mask)


def validate(
    logits: Tensor,
    mask: Tensor,
    tokens: Tensor | None,
    group_ids: Tensor | None,
    temperature: float,
    chunk_size: int | None,
    group_size: int | None = None,
) -> tuple[Tensor, Tensor | None, Tensor | None]:
    """Check arguments; return (bool mask, tokens, group_ids) on the logits' device (:func:`convert`). With
    ``group_size`` the token range is checked on the device (:func:`require_on_device`: no host read; on a GPU it
    is deferred)."""
    check_tensor("logits", logits, ("B", "T", "V"), FLOAT)
    B, T, V = logits.shape
    active = check_tensor("mask", mask, (B, T), MASK).to(logits.device)
    if group_ids is not None:
        check_tensor("group_ids", group_ids, (B,), INT)
    check_temperature_chunk(temperature, chunk_size)
    if V < 1:
        raise ValueError("logits must have a non-empty vocabulary dimension")
    if group_size is not None and (B % check_number("group_size", group_size, 1, integer=True) or group_ids is None):
        raise ValueError(f"group_size={group_size} must divide B = {B} and comes with group_ids")
    if tokens is not None:
        # Masked positions may hold padding (e.g. -100); only active ones must index the vocabulary.
        tok = check_tensor("tokens", tokens, (B, T), INT).to(logits.device)
        says = f"tokens at masked-in positions must lie in [0, {V})"
        in_range = (tok >= 0) & (tok < V) | ~active
        if group_size is not None:
            require_on_device(in_range.all(), says)
        elif not bool(in_range.all()):
            raise ValueError(f"{says}, got range [{int(tok[active].min())}, {int(tok[active].max())}]")
    return convert(logits, mask, tokens, group_ids, group_size)


def convert(logits: Tensor, mask: Tensor, tokens: Tensor | None, group_ids: Tensor | None,
            group_size: int | None = None) -> tuple[Tensor, Tensor | None, Tensor | None]:
    """The unchecked conversions of a statistics call: (bool mask, tokens, group_ids) on the logits' device. With
    ``group_size`` an out-of-range token reads as 0: on a GPU its device check is deferred, and an id out of range
    must not reach a gather (a device-side assert)."""
    device, V = logits.device, logits.shape[-1]
    mask = to_bool_mask(mask).to(device)
    group_ids = None if group_ids is None else group_ids.to(device)
    if tokens is None:
        return mask, None, group_ids
    tokens = tokens.to(device)
    if group_size is not None:
        tokens = torch.where((tokens >= 0) & (tokens < V), tokens, 0)
    return mask, tokens, group_ids


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
