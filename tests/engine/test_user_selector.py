"""A selection rule on any token statistic, from the user's own module (tests/conftest.py ``h2rule``): the trainer
computes what its ``needs`` name on every statistics path, H2 from TRL's fused head where it gives log Σp² and from
the sweep where it does not, never the group JS score it does not read, and the H2 the rule sees is the float64
definition's (ictrl.core.reference)."""

from __future__ import annotations

import dataclasses
import importlib
from pathlib import Path
from typing import Any

import pytest
import torch

import mp_worker as w
from ictrl.core.reference import softmax64
from ictrl.core.selection import SelectorError, get_selector, needed_stats, register_selector, top_fraction
from ictrl.engine import stats_source
from ictrl.engine.stats_source import STATS_PATHS

NO_SUM_SQ = frozenset({"entropy", "logprob", "prob"})  # a fused head that gives no log Σp²

CASES = [
    # path, one pass, config overrides, the fused head's statistics (None: TRL's), the sweep runs
    ("separate", False, {}, None, True),
    ("training_forward", True, {}, None, False),  # H2 from TRL's fused head in the loss's forward
    ("training_forward", True, {}, NO_SUM_SQ, True),  # the sweep over the hidden states the fused head kept
    ("training_forward", True, {"sparse_backward": True}, None, True),  # the backbone, then the sweep
]


def _train(model_dir: Path, out: Path, selector: str, one_pass: bool, fused: frozenset[str] | None,
           monkeypatch: pytest.MonkeyPatch, **overrides: Any) -> tuple[Any, list[dict[str, Any]]]:
    """One optimizer step with ``selector``; returns the trainer and every statistics sweep's arguments."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    sweeps: list[dict[str, Any]] = []
    real = stats_source.token_stats_unchecked  # the body the step calls on its own tensors

    def recording(*args: Any, **kwargs: Any) -> Any:
        sweeps.append(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(stats_source, "token_stats_unchecked", recording)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float64)
    trainer = w.stub_trainer_class(one_pass)(
        model=model, reward_funcs=w.digit_reward, train_dataset=w.make_dataset(), processing_class=tokenizer,
        args=w.make_config(out, token_selector=selector, temperature=0.8, max_steps=1, beta=0.0, **overrides))
    if fused is not None:
        trainer.stats_source = dataclasses.replace(trainer.stats_source, fused_stats=fused)
    trainer.train()
    return trainer, sweeps


def _reference_h2(model_dir: Path, batch: dict[str, Any], temperature: float) -> torch.Tensor:
    """[B, T] float64 H2 = -log Σp² of the initial policy at the completion positions (0 off the mask)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float64)
    ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], 1)
    am = torch.cat([batch["prompt_mask"], batch["completion_mask"]], 1)
    T = batch["completion_ids"].size(1)
    with torch.no_grad():
        p = softmax64(model(input_ids=ids, attention_mask=am).logits[:, -T - 1:-1], temperature)
    return torch.where(batch["completion_mask"].bool(), -torch.log((p * p).sum(-1)), 0.0)


@pytest.mark.parametrize(("path", "one_pass", "overrides", "fused", "swept"), CASES,
                         ids=[f"{c[0]}-{'-'.join(c[2]) or 'default'}{'-no-sum-sq' if c[3] else ''}" for c in CASES])
def test_a_users_h2_rule_gets_the_reference_h2_and_nothing_else(tiny_model_dir: Path, h2rule: Path,
                                                                monkeypatch: pytest.MonkeyPatch, path: str,
                                                                one_pass: bool, overrides: dict[str, Any],
                                                                fused: frozenset[str] | None, swept: bool) -> None:
    trainer, sweeps = _train(tiny_model_dir, h2rule / "out", "h2rule:top_h2", one_pass, fused, monkeypatch,
                             **overrides)
    user = importlib.import_module("h2rule")
    assert trainer.stats_source.needs == {"renyi2"} and get_selector("h2rule:top_h2").name == "top_h2"
    logged = [h["ictrl/stats_path"] for h in trainer.state.log_history if "ictrl/stats_path" in h]
    assert logged == [STATS_PATHS[path]]
    # where the statistics came from: the sweep, or TRL's fused head alone; never the group JS sweep
    assert bool(sweeps) == swept and all(kwargs["group_ids"] is None for kwargs in sweeps)
    assert len(user.SEEN) == 1
    seen, batch = user.SEEN[0], trainer.recorded[0]
    # what it did not declare was never computed, and reading it is an error naming the needs entry, not None
    assert all(seen.__dict__[f] is None for f in ("ict_score", "entropy", "prob")) and seen.renyi2 is not None
    with pytest.raises(SelectorError, match=r"h2rule.py:top_h2 reads inputs.entropy .* needs=\(\.\.\., 'entropy'\)"):
        seen.entropy
    mask = batch["completion_mask"].bool()
    assert torch.equal(seen.mask, mask)
    torch.testing.assert_close(seen.renyi2.double(), _reference_h2(tiny_model_dir, batch, 0.8), rtol=1e-5,
                               atol=1e-6)
    # the rule's own selection carries the loss: ceil(0.1 n) tokens of each response
    step_metrics = [h for h in trainer.state.log_history if "ictrl/tokens/selected" in h]
    counts = [-(-n // 10) for n in mask.sum(1).tolist()]
    assert step_metrics[0]["ictrl/tokens/selected"] == sum(counts)


def test_a_rule_on_prob_alone_never_computes_the_ict_score(tiny_model_dir: Path, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[Any] = []

    @register_selector("test_low_prob", needs=("prob",))
    def low_prob(inputs: Any, *, ratio: float = 0.25) -> torch.Tensor:
        seen.append(inputs)
        return top_fraction(-inputs.prob, inputs, ratio)

    assert needed_stats(get_selector("test_low_prob")) == {"prob"}
    assert needed_stats(get_selector("ict")) == {"ict_score"} and needed_stats(get_selector("ict"), True) == set()
    for one_pass in (False, True):  # the separate pass and the loss's forward
        seen.clear()
        trainer, sweeps = _train(tiny_model_dir, tmp_path / str(one_pass), "test_low_prob", one_pass, NO_SUM_SQ,
                                 monkeypatch)
        assert len(seen) == 1 and seen[0].prob is not None
        assert all(seen[0].__dict__[f] is None for f in ("ict_score", "entropy", "renyi2", "purity", "logprob"))
        assert all(kwargs["group_ids"] is None for kwargs in sweeps)
        assert not any("ictrl/ict_score/all" in h for h in trainer.state.log_history)
