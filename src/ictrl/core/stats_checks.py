"""Argument checks of :mod:`ictrl.core.stats`: shapes, dtypes, token ranges and finite distributions.

Each raises ``ValueError`` naming the argument (and, for values, the first offending (row, position)). With a
``group_size`` (the trainer's layout) the value checks run on the device (``require_on_device``: at once on CPU,
deferred on a GPU), so the training step makes no host read for them.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ictrl.core.checks import as_bool_mask, check_group_ids, checking, require_finite, require_on_device

def check_int(name: str, t: Tensor) -> None:
    if t.dtype == torch.bool or t.dtype.is_floating_point or t.dtype.is_complex:
        raise ValueError(f"{name} must be an integer tensor, got dtype {t.dtype}")


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
    value checks run on the device (:func:`require_on_device`: no host read; on a GPU they are deferred, and
    out-of-range tokens are returned as 0 so nothing downstream indexes past V). Inside
    :func:`ictrl.core.checks.trusted_inputs` (the trainer's step) nothing is checked: only the conversions."""
    if not checking():
        device, V = logits.device, logits.shape[-1]
        if tokens is not None and group_size is not None:  # padding must not reach a gather either way
            tokens = torch.where((tokens >= 0) & (tokens < V), tokens, 0)
        return (as_bool_mask(mask).to(device), tokens.to(device) if tokens is not None else None,
                group_ids.to(device) if group_ids is not None else None)
    if not isinstance(logits, Tensor) or logits.dim() != 3:
        shape = tuple(logits.shape) if isinstance(logits, Tensor) else type(logits).__name__
        raise ValueError(f"logits must be a 3-D tensor [B, T, V], got {shape}")
    if not logits.dtype.is_floating_point:
        raise ValueError(f"logits must be floating point, got dtype {logits.dtype}")
    B, T, V = logits.shape
    if V < 1:
        raise ValueError("logits must have a non-empty vocabulary dimension")
    mask = check_mask(mask, (B, T), logits.device)
    if tokens is not None:
        if not isinstance(tokens, Tensor) or tuple(tokens.shape) != (B, T):
            got = tuple(tokens.shape) if isinstance(tokens, Tensor) else type(tokens).__name__
            raise ValueError(f"tokens must have shape {(B, T)} (logits[:2]), got {got}")
        check_int("tokens", tokens)
        tokens = tokens.to(logits.device)
        # Masked positions may hold padding (e.g. -100); only active ones must index the vocabulary.
        if group_size is not None:
            in_range = (tokens >= 0) & (tokens < V)
            require_on_device((in_range | ~mask).all(), f"tokens at masked-in positions must lie in [0, {V})")
            # On a GPU that check is deferred: an id out of range must not reach a gather (a device-side assert).
            tokens = torch.where(in_range, tokens, 0)
        active = tokens[mask] if group_size is None else tokens[:0]
        if active.numel() and (int(active.min()) < 0 or int(active.max()) >= V):
            raise ValueError(f"tokens at masked-in positions must lie in [0, {V}), got range "
                             f"[{int(active.min())}, {int(active.max())}]")
    if group_ids is not None:
        group_ids = check_group_ids(group_ids, B).to(logits.device)
    if group_size is not None:
        if group_ids is None:
            raise ValueError("group_size needs group_ids")
        if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 1 or B % group_size:
            raise ValueError(f"group_size must be an int >= 1 dividing B = {B}, got {group_size!r}")
    check_temperature_chunk(temperature, chunk_size)
    return mask, tokens, group_ids


def check_mask(mask: Tensor, shape: tuple[int, int], device: torch.device) -> Tensor:
    if not isinstance(mask, Tensor) or tuple(mask.shape) != shape:
        got = tuple(mask.shape) if isinstance(mask, Tensor) else type(mask).__name__
        raise ValueError(f"mask must have shape {shape} (logits[:2]), got {got}")
    return as_bool_mask(mask).to(device)


def check_temperature_chunk(temperature: float, chunk_size: int | None) -> None:
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not math.isfinite(temperature) \
            or temperature <= 0:
        raise ValueError(f"temperature must be a finite number > 0, got {temperature!r}")
    if chunk_size is not None and (isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size <= 0):
        raise ValueError(f"chunk_size must be a positive int or None, got {chunk_size!r}")


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
