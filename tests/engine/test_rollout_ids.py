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


def _trainer(model_dir: Path, tmp_path: Path, cls: type = ICTGRPOTrainer) -> Any:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    args = w.make_config(tmp_path, token_selector="ict", max_steps=1)
    return cls(model=model, reward_funcs=w.digit_reward, args=args, train_dataset=w.make_dataset(),
               processing_class=tokenizer)


def test_sizes_are_read_from_module_attributes(tiny_model_dir: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    assert model_rows(model) == model.get_input_embeddings().weight.shape[0] == model.config.vocab_size
    assert tokenizer_size(tokenizer) == len(tokenizer)
    model.resize_token_embeddings(len(tokenizer) - 3)
    assert model_rows(model) == len(tokenizer) - 3


@pytest.mark.parametrize("bad", [10**6, -1])
def test_a_completion_id_outside_the_model_is_one_line_before_any_forward(tiny_model_dir: Path, tmp_path: Path,
                                                                          bad: int) -> None:
    trainer = _trainer(tiny_model_dir, tmp_path)
    rows, size = model_rows(trainer.model), len(trainer.processing_class)
    calls = []
    trainer.model.register_forward_pre_hook(lambda *a: calls.append(1))

    class Bad(type(trainer)):  # the rollout returns one bad id at (row 1, column 2)
        pass

    def generate(self: Any, prompt_ids: list[list[int]], *args: Any, **kwargs: Any) -> Any:
        out = [[5, 6, 7, 8] for _ in prompt_ids]
        out[1][2] = bad
        return out, None

    from ictrl.engine.rollout_ids import checked_rollout

    Bad._generate_single_turn = checked_rollout(generate)
    trainer.__class__ = Bad
    with pytest.raises(UserError) as err:
        trainer.train()
    message = str(err.value)
    assert "\n" not in message
    assert message == (f"completion token id {bad} at (row 1, column 2) is outside the model's vocabulary: "
                       f"model embedding rows {rows}, tokenizer vocabulary {size}")
    assert calls == []  # no forward ran: the check comes before the model sees the id


def test_a_tokenizer_larger_than_the_model_is_one_line_naming_the_first_id(tiny_model_dir: Path,
                                                                            tmp_path: Path) -> None:
    trainer = _trainer(tiny_model_dir, tmp_path)
    size = len(trainer.processing_class)
    trainer.model.resize_token_embeddings(size - 2)
    with pytest.raises(UserError, match=rf"^token id {size - 2} \(and up to {size - 1}\) of the tokenizer has no row "
                                        rf"in the model: tokenizer vocabulary {size}, model embedding rows {size - 2}"):
        trainer._generate_single_turn([[5, 6]], None, {}, 1)


def test_the_wrapped_rollout_keeps_trl_s_signature() -> None:
    import inspect

    from trl import GRPOTrainer

    ours = inspect.signature(ICTGRPOTrainer._generate_single_turn)
    assert list(ours.parameters)[:5] == list(inspect.signature(GRPOTrainer._generate_single_turn).parameters)[:5]
