"""Argument checks shared by the pure core (the bottom of the package: imports only torch).

Every check raises ``ValueError`` naming the argument, and for values the (row, position) of the first offender,
so a bad tensor is found where it enters rather than as a NaN three functions later.
"""

from __future__ import annotations

import torch
from torch import Tensor


class OptionError(ValueError):
    """A bad option value, raised where the option is defined: ``field`` names it there and ``reason`` says what it
    must be (``str`` is ``f"{field} {reason}"``). A caller that reads the option under another name (``ICTGRPOConfig``'s
    ``epsilon_high`` for ``LossSpec.eps_high``) says ``f"{its name} {reason}"`` instead, without checking it again."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field} {reason}")
        self.field = field
        self.reason = reason


def as_bool_mask(mask: Tensor, name: str = "mask") -> Tensor:
    """Return ``mask`` as a bool tensor; it must be bool or hold only 0 and 1."""
    if not isinstance(mask, Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(mask).__name__}")
    if mask.dtype == torch.bool:
        return mask
    if mask.is_complex() or not bool(((mask == 0) | (mask == 1)).all()):
        raise ValueError(f"{name} must be bool or hold only 0/1 values")
    return mask != 0


def check_group_ids(group_ids: object, B: int) -> Tensor:
    """``group_ids`` must be a [B] integer tensor (one prompt label per response); returns it."""
    if not isinstance(group_ids, Tensor) or tuple(group_ids.shape) != (B,):
        got = tuple(group_ids.shape) if isinstance(group_ids, Tensor) else type(group_ids).__name__
        raise ValueError(f"group_ids must be a [B] = ({B},) tensor, got {got}")
    if group_ids.dtype == torch.bool or group_ids.is_floating_point() or group_ids.is_complex():
        raise ValueError(f"group_ids must be an integer tensor, got dtype {group_ids.dtype}")
    return group_ids


def require_finite(name: str, x: Tensor, where: Tensor | None = None) -> None:
    """Raise if ``x`` holds NaN or ±inf where it matters.

    ``x`` is [B], [B, T] or [B, T, V]; ``where`` (bool, broadcastable over x's leading dims, e.g. the [B, T]
    response mask) marks the entries that are read: masked-out entries may hold anything (padding).
    The message names the first offending index as (row, position[, vocab id]) and its value.
    """
    bad = ~torch.isfinite(x)
    if where is not None:
        w = where.bool()
        while w.dim() < bad.dim():
            w = w.unsqueeze(-1)
        bad = bad & w
    if not bool(bad.any()):
        return
    index = tuple(int(i) for i in bad.nonzero()[0])
    labels = ("row", "position", "vocab id")[: len(index)] if len(index) <= 3 else [f"dim{d}" for d in range(len(index))]
    at = ", ".join(f"{label} {i}" for label, i in zip(labels, index))
    count = int(bad.sum())
    raise ValueError(f"{name} is not finite at ({at}): {float(x[index])} ({count} non-finite active "
                     f"entr{'y' if count == 1 else 'ies'})")


def require_on_device(ok: Tensor, message: str) -> None:
    """Raise ValueError(message) unless the 0-d bool ``ok`` holds, without reading it on the host.

    ``torch._assert_async`` checks on the tensor's device: on CPU it raises at once (turned into ValueError here);
    on a GPU the stream fails later with ``message`` (a device-side assert), so the check costs no host-device
    sync. For the training step's hot path; user-facing calls keep their host checks with a precise message.
    """
    try:
        torch._assert_async(ok, message)
    except RuntimeError as err:
        raise ValueError(message) from err
