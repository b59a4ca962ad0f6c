"""Argument checks shared by the pure core (the bottom of the package: imports only torch).

Every check raises ``ValueError`` naming the argument, and for values the (row, position) of the first offender,
so a bad tensor is found where it enters rather than as a NaN three functions later.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

DEBUG_ENV = "ICTRL_DEBUG_CHECKS"  # "1": the trainer's step calls the checked faces on its own tensors too


def debug_checks() -> bool:
    """Whether ``ICTRL_DEBUG_CHECKS`` asks the trainer's step to check the tensors it built (read once per run)."""
    return os.environ.get(DEBUG_ENV, "").strip().lower() in ("1", "true", "yes", "on")


class OptionError(ValueError):
    """A bad option (or number argument) value, raised where the option is defined: ``field`` names it there and
    ``reason`` says what it must be (``str`` is ``f"{field} {reason}"``). A caller that reads the option under
    another name (``ICTGRPOConfig``'s ``epsilon_high`` for ``LossSpec.eps_high``) says ``f"{its name} {reason}"``
    instead, without checking it again."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field} {reason}")
        self.field = field
        self.reason = reason


def check_number(name: str, value: Any, low: float = 0, high: float | None = None, *, above: bool = False,
                 integer: bool = False, optional: bool = False) -> Any:
    """The one check of a number option or argument ``name``: an int below 2**63 (``integer``) or a finite number,
    never a bool, >= ``low`` (> with ``above``) and <= ``high``, or None where ``optional``; returns it (a float
    unless ``integer``). Raises :class:`OptionError` naming ``name``."""
    if optional and value is None:
        return None
    if (isinstance(value, bool) or not isinstance(value, int if integer else (int, float))
            or isinstance(value, float) and not math.isfinite(value) or isinstance(value, int) and value >= 1 << 63
            or not (value > low if above else value >= low) or high is not None and value > high):
        what = ("None or " if optional else "") + ("an int" if integer else "a finite number" if high is None
                                                   else "a number")
        bound = f"in {'(' if above else '['}{low}, {high}]" if high is not None else f"{'>' if above else '>='} {low}"
        raise OptionError(name, f"must be {what} {bound}{' and < 2**63' if integer else ''}, got {value!r}")
    return value if integer else float(value)


def to_bool_mask(mask: Tensor) -> Tensor:
    """``mask`` as a bool tensor, unchecked: the conversion the internal bodies make of a mask the step built."""
    return mask if mask.dtype == torch.bool else mask != 0


def as_bool_mask(mask: Tensor, name: str = "mask") -> Tensor:
    """Return the tensor ``mask`` as a bool tensor; it must be bool or hold only 0 and 1 (read on the host). Its
    callers have checked that it is a tensor (:func:`check_tensor`)."""
    if mask.dtype == torch.bool:
        return mask
    if mask.is_complex() or not bool(((mask == 0) | (mask == 1)).all()):
        raise ValueError(f"{name} must be bool or hold only 0/1 values")
    return mask != 0


FLOAT, INT, MASK = "floating point", "an integer tensor", "bool or 0/1"  # the kinds check_tensor holds a tensor to


def check_tensor(name: str, value: Any, shape: Sequence[int | str], kind: str | None = None, of: str = "") -> Tensor:
    """The one check of a public core function's tensor argument ``name``: a ``torch.Tensor`` of ``shape`` (a size,
    or a letter for a free one: ``("B", "T", "V")``) holding ``kind`` (FLOAT, INT, or MASK, returned as bool);
    returns it. ``of`` says whose shape it must share ("logprobs' "). Raises ValueError naming the argument."""
    if not isinstance(value, Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    if value.dim() != len(shape):
        raise ValueError(f"{name} must be a {len(shape)}-D tensor [{', '.join(map(str, shape))}], got shape "
                         f"{tuple(value.shape)}")
    if any(isinstance(want, int) and want != got for want, got in zip(shape, value.shape)):
        raise ValueError(f"{name} must have {of}shape {tuple(shape)}, got {tuple(value.shape)}")
    if kind == MASK:
        return as_bool_mask(value, name)
    dtype = value.dtype
    ok = dtype.is_floating_point if kind == FLOAT else not (dtype == torch.bool or dtype.is_floating_point or
                                                            dtype.is_complex)
    if kind is not None and not ok:
        raise ValueError(f"{name} must be {kind}, got dtype {value.dtype}")
    return value


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
    labels = (("row", "position", "vocab id")[: len(index)] if len(index) <= 3
              else [f"dim{d}" for d in range(len(index))])
    at = ", ".join(f"{label} {i}" for label, i in zip(labels, index))
    count = int(bad.sum())
    raise ValueError(f"{name} is not finite at ({at}): {float(x[index])} ({count} non-finite active "
                     f"entr{'y' if count == 1 else 'ies'})")


# (message -> running AND of its 0-d bool flags) of the checks require_on_device deferred on a GPU, until
# raise_failed_device_checks reads them.
_DEFERRED: dict[str, Tensor] = {}


def defers_on(device: torch.device) -> bool:
    """Whether :func:`require_on_device` defers its check on ``device`` (raised later, outside the caller)."""
    return device.type == "cuda"


def require_on_device(ok: Tensor, message: str) -> None:
    """Raise ValueError(message) unless the 0-d bool ``ok`` holds, without a host-device sync.

    On CPU the check is immediate (``torch._assert_async`` raises at once; turned into ValueError here). On a GPU
    it is deferred: ``ok`` is folded into a running flag per message on the device (one tiny kernel, no sync),
    and :func:`raise_failed_device_checks` raises it later, where the caller already syncs. A device-side assert
    is never fired: it would poison the CUDA context, so no later call (a checkpoint, an error message) could run.
    For the training step's hot path; user-facing calls keep their host checks with a precise message.
    """
    if defers_on(ok.device):
        prev = _DEFERRED.get(message)
        _DEFERRED[message] = ok.reshape(()) if prev is None else prev & ok.reshape(())
        return
    try:
        torch._assert_async(ok, message)
    except RuntimeError as err:
        raise ValueError(message) from err


def raise_failed_device_checks() -> None:
    """Raise ValueError naming the first check that :func:`require_on_device` deferred on a GPU and that failed
    since the last call; clear them all. One device-to-host copy of the flags (a sync), none if nothing is
    pending: call it where the caller already waits for the device (the rollout's host lists)."""
    if not _DEFERRED:
        return
    messages = list(_DEFERRED)
    first = _DEFERRED[messages[0]]
    flags = torch.stack([_DEFERRED[m].to(first.device) for m in messages]).tolist()
    _DEFERRED.clear()
    for message, ok in zip(messages, flags):
        if not ok:
            raise ValueError(f"{message} (a device-side check of an earlier training step)")


def first_bad_token_id(rows: Sequence[Sequence[int]] | Tensor, limit: int) -> tuple[int, int, int] | None:
    """(row, column, id) of the first token id outside [0, limit) in ``rows`` (host lists of ids, ragged, or a
    tensor read row by row), or None. The common case, every id in range, costs one min and one max per row."""
    for r, ids in enumerate(rows):
        if isinstance(ids, Tensor):
            ids = ids.tolist()
        if len(ids) and (min(ids) < 0 or max(ids) >= limit):
            c = next(c for c, t in enumerate(ids) if not 0 <= t < limit)
            return r, c, int(ids[c])
    return None


def check_vocab_sizes(model_rows: int, tokenizer_size: int) -> None:
    """The tokenizer's ids [0, tokenizer_size) must all have a row in the model's embedding and LM head
    (``model_rows``); raise ValueError naming the first id without one and both sizes."""
    if tokenizer_size > model_rows:
        raise ValueError(f"token id {model_rows} (and up to {tokenizer_size - 1}) of the tokenizer has no row in the "
                         f"model: tokenizer vocabulary {tokenizer_size}, model embedding rows {model_rows}; resize "
                         "the model's embeddings to len(tokenizer) or use the model's own tokenizer")


def check_token_ids(rows: Sequence[Sequence[int]] | Tensor, what: str, model_rows: int, tokenizer_size: int) -> None:
    """Every id in ``rows`` (``what``: "prompt", "completion") must index the model's ``model_rows`` embedding
    rows; raise ValueError naming the first that does not, its (row, column) and both vocabulary sizes."""
    bad = first_bad_token_id(rows, model_rows)
    if bad is not None:
        r, c, tok = bad
        raise ValueError(f"{what} token id {tok} at (row {r}, column {c}) is outside the model's vocabulary: "
                         f"model embedding rows {model_rows}, tokenizer vocabulary {tokenizer_size}")
