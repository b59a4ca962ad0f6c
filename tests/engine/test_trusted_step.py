"""The training step takes the tensors it built as they are: it calls the core's unchecked bodies, whose public
faces check a user's arguments where they enter; ``ICTRL_DEBUG_CHECKS=1`` makes the run call the checked faces.
The choice is an explicit value of the run (``StatsSource.check``), not an ambient context."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest
import torch

import ictrl

from test_trainer import _trainer

SRC = Path(ictrl.__file__).resolve().parent  # the package under test


@pytest.mark.parametrize("debug", [False, True])
def test_the_step_skips_argument_checks_unless_debugging(debug: bool, tiny_model_dir: Path, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    import ictrl.core.loss as loss
    import ictrl.core.stats_checks as stats_checks
    import ictrl.engine.stats_source as stats_source
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
    monkeypatch.setattr(stats_source, "token_stats_unchecked", recording("body", stats_source.token_stats_unchecked))
    if debug:
        monkeypatch.setenv(DEBUG_ENV, "1")
    else:
        monkeypatch.delenv(DEBUG_ENV, raising=False)
    trainer = _trainer(tiny_model_dir, tmp_path, token_selector="ict", max_steps=1)
    assert trainer.stats_source.check is debug  # chosen once, for the run
    trainer.train()
    assert trainer.state.global_step == 1
    assert ("loss" in calls) == debug and ("stats" in calls) == debug
    assert ("body" in calls) != debug  # the step's statistics: the unchecked body unless debugging


def test_the_public_faces_reject_what_the_bodies_take_as_built() -> None:
    from ictrl.core.logprobs import selected_token_logprobs, selected_token_logprobs_unchecked
    from ictrl.core.stats import group_js_divergence_topk, group_js_divergence_topk_unchecked

    hidden, head = torch.zeros(2, 3, 4), torch.zeros(5, 4)
    tokens, two = torch.zeros(2, 3, dtype=torch.long), torch.tensor([[0, 2, 0], [1, 0, 0]])
    with pytest.raises(ValueError, match="selected must be bool or hold only 0/1"):
        selected_token_logprobs(hidden, head, tokens, two)
    assert selected_token_logprobs_unchecked(hidden, head, tokens, two).shape == (2, 3)
    lp, ids, groups = torch.zeros(2, 3, 1), torch.zeros(2, 3, 1, dtype=torch.long), torch.zeros(2, dtype=torch.long)
    with pytest.raises(ValueError, match="mask must be bool or hold only 0/1"):
        group_js_divergence_topk(lp, ids, two, groups)
    assert group_js_divergence_topk_unchecked(lp, ids, two, groups).shape == (2, 3)


@pytest.mark.parametrize("package", ["core", "engine"])
def test_no_context_variable_switches_the_core_or_the_engine(package: str) -> None:
    """Whether a check runs, or what TRL's fused head computes, is an argument of the call, never a ContextVar."""
    found = []
    for path in sorted((SRC / package).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [node.attr] if isinstance(node, ast.Attribute) else [node.id] if isinstance(node, ast.Name) else \
                [node.module] + [a.name for a in node.names] if isinstance(node, ast.ImportFrom) else \
                [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if {"ContextVar", "contextvars"} & set(names):
                found.append(f"{path.relative_to(SRC)}:{node.lineno}")
    assert not found, found
