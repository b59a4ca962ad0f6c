"""The update-norm callback: the float64 distance the weights moved since the last logged step."""

from __future__ import annotations

import math

import torch

from ictrl.experiments.reports.update_norm import KEY, UpdateNorm


def test_update_norm_callback_is_the_float64_weight_distance() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
    model[1].bias.requires_grad_(False)  # frozen parameters are not counted
    cb = UpdateNorm()
    cb.on_train_begin(None, None, None, model=model)
    deltas = []
    for step in range(2):
        before = [q.detach().clone().double() for q in model.parameters()]
        with torch.no_grad():
            for q in model.parameters():
                q.add_(torch.randn_like(q) * (step + 1))
        deltas.append(sum(float(((q.detach().double() - b) ** 2).sum()) for q, b in zip(model.parameters(), before)
                          if q.requires_grad))
        cb.on_step_end(None, None, None, model=model)
        if step == 0:
            logs: dict = {}
            cb.on_log(None, None, None, logs=logs)
            assert math.isclose(logs[KEY], math.sqrt(deltas[0]), rel_tol=1e-12)
    logs = {}
    cb.on_log(None, None, None, logs=logs)
    assert math.isclose(logs[KEY], math.sqrt(deltas[1]), rel_tol=1e-12)
    empty: dict = {}
    cb.on_log(None, None, None, logs=empty)  # no step since the last log: nothing added
    assert KEY not in empty
