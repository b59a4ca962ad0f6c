"""The step's metrics reach the host in batched reads: one ``tolist`` per selection (at generation) and one per loss
micro-batch, and no per-metric ``float(tensor)`` / ``.item()`` in ictrl's step."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import torch

import mp_worker as w
from test_trainer import _trainer

_OURS = ("ictrl/engine/", "ictrl/core/metrics.py")


def _caller_is_ours() -> bool:
    frame = sys._getframe(2)
    return any(part in frame.f_code.co_filename.replace("\\", "/") for part in _OURS)


@pytest.mark.parametrize("selector", ["ict", "all"])
def test_one_batched_read_per_metric_group(tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                           selector: str) -> None:
    trainer = _trainer(tiny_model_dir, tmp_path, w.stub_trainer_class(), token_selector=selector, max_steps=1,
                       temperature=0.8)
    reads: dict[str, int] = {"tolist": 0, "scalar": 0}
    originals = {name: getattr(torch.Tensor, name) for name in ("tolist", "item", "__float__")}

    def counting(name: str, key: str) -> Any:
        def read(self: torch.Tensor, *args: Any) -> Any:
            if _caller_is_ours():
                reads[key] += 1
            return originals[name](self, *args)
        return read

    monkeypatch.setattr(torch.Tensor, "tolist", counting("tolist", "tolist"))
    monkeypatch.setattr(torch.Tensor, "item", counting("item", "scalar"))
    monkeypatch.setattr(torch.Tensor, "__float__", counting("__float__", "scalar"))
    trainer.train()
    logs = [h for h in trainer.state.log_history if "loss" in h]
    assert logs and "ictrl/clip_frac" in logs[0] and "clip_ratio/low_mean" in logs[0] and "ictrl/h1/all" in logs[0]
    assert reads["scalar"] == 0, reads
    # one selection (its metrics read once) and one loss micro-batch (its metrics read once)
    assert reads["tolist"] == 2, reads
