"""``policy_loss`` called with its options as keywords, as the loss tests read best: every keyword is a field of
``LossSpec`` (the run's options) or of ``LossExtras`` (the batch's optional tensors and
counts); a bad option raises when the spec is built, as in a run."""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from torch import Tensor

from ictrl.core.loss import LossExtras, LossSpec, policy_loss

SPEC_FIELDS = frozenset(f.name for f in fields(LossSpec))


def policy_loss_kw(logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, mask: Tensor,
                   selected: Tensor | None = None, **options: Any) -> tuple[Tensor, dict[str, Tensor]]:
    spec = LossSpec(**{k: v for k, v in options.items() if k in SPEC_FIELDS})
    extras = LossExtras(**{k: v for k, v in options.items() if k not in SPEC_FIELDS})
    return policy_loss(logprobs, old_logprobs, advantages, mask, selected, spec, extras)
