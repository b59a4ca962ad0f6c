"""Helpers the trainer tests share: the tiny model loaded in float32, a trainer over it, its prompts, the statistics
passes it makes recorded, a float64 reference forward, and a trainer whose rollouts come from TRL's own
``VLLMGeneration`` over the fake vLLM engine of tests/fixtures/fake_vllm.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

import mp_worker as w
from fixtures import fake_vllm
from ictrl.engine.trainer import ICTGRPOTrainer


def _load(model_dir: Path) -> tuple[Any, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    tokenizer.padding_side = "left"
    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32), tokenizer


def _trainer(model_dir: Path, tmp_path: Path, **overrides: Any) -> ICTGRPOTrainer:
    model, tokenizer = _load(model_dir)
    return ICTGRPOTrainer(model=model, reward_funcs=w.digit_reward, args=w.make_config(tmp_path, **overrides),
                          train_dataset=w.make_dataset(), processing_class=tokenizer)


def _inputs(trainer: Any, n_prompts: int = 2) -> list[dict[str, str]]:
    return [{"prompt": p} for p in w.PROMPTS[:n_prompts] for _ in range(trainer.num_generations)]


class _RecordingSource:
    """The trainer's statistics source, recording the arguments and results of each call."""

    def __init__(self, source: Any, calls: list[dict[str, Any]]) -> None:
        self.source, self.calls = source, calls

    def __getattr__(self, name: str) -> Any:
        return getattr(self.source, name)

    def __call__(self, model: Any, input_ids: Any, attention_mask: Any, mask: Any, group_ids: Any = None) -> Any:
        stats, js = self.source(model, input_ids, attention_mask, mask, group_ids)
        self.calls.append({"inputs": (input_ids, attention_mask), "mask": mask, "js": js})
        return stats, js


def _capture_stats(trainer: Any) -> list[dict[str, Any]]:
    """Record the arguments and results of each statistics pass."""
    calls: list[dict[str, Any]] = []
    trainer.stats_source = _RecordingSource(trainer.stats_source, calls)
    return calls


def _full_logits(trainer: Any, inputs: tuple[torch.Tensor, torch.Tensor], T: int) -> torch.Tensor:
    ids, attention = inputs
    P = ids.size(1) - T
    with torch.no_grad():
        return trainer.model(input_ids=ids, attention_mask=attention).logits[:, P - 1:P + T - 1].double()


def _vllm_trainer(monkeypatch: pytest.MonkeyPatch, model_dir: Path, tmp_path: Path, shift: float = 0.0,
                  jitter: float = 0.0, **overrides: Any) -> ICTGRPOTrainer:
    """A trainer with ``use_vllm=True`` (colocate): TRL builds its own ``VLLMGeneration``, over the fake vLLM 0.31
    engine of tests/fixtures/fake_vllm.py (its own copy of the checkpoint, TRL's weight sync, ``RequestOutput``s
    read by TRL's ``extract_logprobs``). ``shift``/``jitter``: the engine's reported log-prob error."""
    fake_vllm.install(monkeypatch)
    trainer = _trainer(model_dir, tmp_path, use_vllm=True, vllm_mode="colocate", **overrides)
    trainer.vllm_generation.llm.shift, trainer.vllm_generation.llm.jitter = shift, jitter
    return trainer
