"""The size of each optimizer step, ``||θ_after − θ_before||₂``, logged as ``ictrl/update_norm``.

The matched-update rows of the tuned study (``studies/``) scale a sparse method's learning rate so that this norm
matches GRPO's, and the report shows the measured norms side by side. Measured on the weights themselves (not
the gradient), so the optimizer's own scaling (Adam's) is inside the number.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from transformers import TrainerCallback

KEY = "ictrl/update_norm"


def flat_params(model: torch.nn.Module) -> torch.Tensor:
    """Every trainable parameter, flattened and concatenated in float64 on the CPU: [P]."""
    return torch.cat([p.detach().reshape(-1).to("cpu", torch.float64)
                      for p in model.parameters() if p.requires_grad])


class UpdateNorm(TrainerCallback):
    """Puts the L2 norm of the last optimizer step's weight change into the next log row.

    A snapshot is taken at the start of training and after every optimizer step; the step's norm is the
    distance between consecutive snapshots (float64), so it does not depend on when callbacks fire inside
    gradient accumulation. With several logged steps between logs the row gets the root mean square.
    Single process only (a sharded model's parameters are partial on each rank).
    """

    def __init__(self) -> None:
        self._before: torch.Tensor | None = None
        self._squares: list[float] = []

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        self._before = flat_params(model)

    def on_step_end(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        after = flat_params(model)
        if self._before is not None:
            self._squares.append(float(torch.sum((after - self._before) ** 2)))
        self._before = after

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None,
               **kwargs: Any) -> None:
        if logs is None or not self._squares:
            return
        logs[KEY] = math.sqrt(math.fsum(self._squares) / len(self._squares))
        self._squares = []
