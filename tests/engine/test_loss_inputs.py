"""ictrl.engine.loss_inputs: a step's mask is decided by one function at one call site, once per generation batch,
at the first loss call of TRL's buffer, and it is the mask of the whole generation batch in generation order."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest
import torch

import mp_worker as w
from ictrl.engine import loss_inputs

SRC = Path(__file__).resolve().parents[2] / "src" / "ictrl"


def _calls(name: str) -> list[str]:
    """``file:line`` of every call of a function or method named ``name`` under src/ictrl."""
    found = []
    for path in sorted(SRC.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call):
                called = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
                if called == name:
                    found.append(f"{path.relative_to(SRC)}:{node.lineno}")
    return found


def test_the_mask_is_decided_by_one_function_at_one_call_site() -> None:
    """The selector is applied in one function (``select_tokens``), and the engine calls that function once."""
    assert _calls("select_tokens") == [f"engine/loss_inputs.py:{_line_of_call('select_tokens')}"]
    assert [c for c in _calls("choose") if c.startswith("engine/")] == [
        f"engine/loss_inputs.py:{_line_of_call('choose')}"]


def _line_of_call(name: str) -> int:
    (line,) = [int(c.split(":")[1]) for c in _calls(name) if c.startswith("engine/loss_inputs.py")]
    return line


def test_a_generation_batch_is_selected_once_at_its_first_loss_call(tiny_model_dir: Path, tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Two micro-batches per generation batch (TRL shuffles and splits it): neither holds a mask when TRL hands the
    first to the loss; that loss call selects the whole buffer once, in generation order, and the second loss call
    selects nothing more. The mask is the one of the generation batch selected alone."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    calls: list[int] = []
    real = loss_inputs.select_tokens

    def counting(*args: Any, **kwargs: Any) -> torch.Tensor:
        calls.append(args[6].size(0))  # the rows of the mask it selects
        return real(*args, **kwargs)

    monkeypatch.setattr(loss_inputs, "select_tokens", counting)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    trainer = w.stub_trainer_class()(
        model=model, reward_funcs=w.digit_reward, train_dataset=w.make_dataset(), processing_class=tokenizer,
        args=w.make_config(tmp_path, token_selector="ict", per_device_train_batch_size=4,
                           gradient_accumulation_steps=2, steps_per_generation=2))
    trainer.model.train()
    first = trainer._prepare_inputs([{"prompt": p} for p in w.PROMPTS[:2] for _ in range(trainer.num_generations)])
    buffer = trainer._buffered_inputs
    assert len(buffer) == 2 and first is buffer[0]
    assert not any("ictrl_selected" in b for b in buffer) and calls == []
    trainer._compute_loss(trainer.model, first)
    assert calls == [8]  # the whole generation batch, at the first loss call
    assert all("ictrl_selected" in b and "ictrl_num_tokens" in b for b in buffer)
    trainer._compute_loss(trainer.model, buffer[1])
    assert calls == [8]  # the second micro-batch was selected with the first
    # the micro-batches' masks, put back in generation order, are the generation batch's selected alone
    generation = trainer.recorded[-1]
    selected = torch.zeros_like(generation["completion_mask"], dtype=torch.bool)
    for b in buffer:
        selected[b["ictrl_row"]] = b["ictrl_selected"]
    alone = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in generation.items()
             if k != "ictrl_selected"}
    assert torch.equal(selected, w.select_now(trainer, alone))
    mask = generation["completion_mask"].bool()
    assert 0 < int((selected & mask).sum()) < int(mask.sum())
