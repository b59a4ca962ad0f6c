"""The training step takes the tensors it built as they are (``ictrl.core.checks.trusted_inputs``): the core's
argument checks run where a user's values enter, not on every step; ``ICTRL_DEBUG_CHECKS=1`` runs them there too."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from test_trainer import _trainer


@pytest.mark.parametrize("debug", [False, True])
def test_the_step_skips_argument_checks_unless_debugging(debug: bool, tiny_model_dir: Path, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    import ictrl.core.loss as loss
    import ictrl.core.stats_checks as stats_checks
    from ictrl.core.checks import DEBUG_ENV

    calls: list[str] = []

    def recording(name: str, real: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            calls.append(name)
            return real(*args, **kwargs)
        return call

    monkeypatch.setattr(loss, "_check_batch", recording("loss", loss._check_batch))
    real_check = stats_checks.check_temperature_chunk
    monkeypatch.setattr(stats_checks, "check_temperature_chunk", recording("stats", real_check))
    if debug:
        monkeypatch.setenv(DEBUG_ENV, "1")
    else:
        monkeypatch.delenv(DEBUG_ENV, raising=False)
    trainer = _trainer(tiny_model_dir, tmp_path, token_selector="ict", max_steps=1)
    trainer.train()
    assert trainer.state.global_step == 1
    assert ("loss" in calls) == debug and ("stats" in calls) == debug
