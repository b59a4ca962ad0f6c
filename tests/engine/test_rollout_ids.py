"""A bad token id is one line before the model sees it: the rollout's host lists and the vocabulary sizes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

import mp_worker as w
from ictrl.engine.rollout_ids import model_rows, tokenizer_size
from ictrl.engine.trainer import ICTGRPOTrainer
from ictrl.errors import UserError


def _trainer(model_dir: Path, tmp_path: Path, rollout_func: Any = None, resize: int = 0) -> Any:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    if resize:
        model.resize_token_embeddings(resize)
    args = w.make_config(tmp_path, token_selector="ict", max_steps=1)
    return ICTGRPOTrainer(model=model, reward_funcs=w.digit_reward, args=args, train_dataset=w.make_dataset(),
                          processing_class=tokenizer, rollout_func=rollout_func)


def test_sizes_are_read_from_module_attributes(tiny_model_dir: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    assert model_rows(model) == model.get_input_embeddings().weight.shape[0] == model.config.vocab_size
    assert tokenizer_size(tokenizer) == len(tokenizer)
    model.resize_token_embeddings(len(tokenizer) - 3)
    assert model_rows(model) == len(tokenizer) - 3


@pytest.mark.parametrize("what", ["prompt", "completion"])
@pytest.mark.parametrize("bad", [10**6, -1])
def test_an_id_from_a_rollout_func_outside_the_model_is_one_line_before_any_forward(
        tiny_model_dir: Path, tmp_path: Path, bad: int, what: str) -> None:
    def rollout(prompts: list[Any], trainer: Any) -> dict[str, Any]:  # one bad id at (row 1, column 2)
        ids = {"prompt": [[5, 6, 7, 8] for _ in prompts], "completion": [[5, 6, 7, 8] for _ in prompts]}
        ids[what][1][2] = bad
        return {"prompt_ids": ids["prompt"], "completion_ids": ids["completion"],
                "logprobs": [[-1.0] * 4 for _ in prompts]}

    trainer = _trainer(tiny_model_dir, tmp_path, rollout_func=rollout)
    rows, size = model_rows(trainer.model), len(trainer.processing_class)
    calls = []
    trainer.model.register_forward_pre_hook(lambda *a: calls.append(1))
    with pytest.raises(UserError) as err:
        trainer.train()
    message = str(err.value)
    assert "\n" not in message
    assert message == (f"{what} token id {bad} at (row 1, column 2) is outside the model's vocabulary: "
                       f"model embedding rows {rows}, tokenizer vocabulary {size}")
    assert calls == []  # no forward ran: the check comes before the model sees the id


def test_a_tokenizer_larger_than_the_model_is_one_line_naming_the_first_id(tiny_model_dir: Path,
                                                                            tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    size = len(AutoTokenizer.from_pretrained(tiny_model_dir))
    with pytest.raises(UserError, match=rf"^token id {size - 2} \(and up to {size - 1}\) of the tokenizer has no row "
                                        rf"in the model: tokenizer vocabulary {size}, model embedding rows {size - 2}"):
        _trainer(tiny_model_dir, tmp_path, resize=size - 2)


def test_a_failed_device_check_of_an_earlier_step_is_one_line_at_the_next_generation(
        tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from ictrl.core import checks

    trainer = _trainer(tiny_model_dir, tmp_path)
    monkeypatch.setitem(checks._DEFERRED, "a deferred check", torch.tensor(False))
    with pytest.raises(UserError, match=r"^a deferred check \(a device-side check of an earlier training step\)$"):
        trainer.train()
    assert not checks._DEFERRED
