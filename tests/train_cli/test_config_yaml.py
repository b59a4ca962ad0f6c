"""A run config file's values: each checked once against its field's type (``ictrl.validation.file_value``, pydantic
over the type as TRL's parser reads it), the same value as the same text written as a flag, one line when not."""

from __future__ import annotations

import argparse
import re
from typing import Any

import pytest
import yaml

from ictrl.errors import ConfigError
from ictrl.validation import file_value, reading
from ictrl.train_cli.run_config import config_from_dict

MINIMAL = {"model_name_or_path": "m", "output_dir": "o"}


def _value(key: str, value: Any) -> Any:
    cfg = config_from_dict({**MINIMAL, key: value}, "run.yaml")
    for part in (cfg.trainer, vars(cfg.script), vars(cfg.model)):
        if key in part:
            return part[key]
    raise AssertionError(key)


@pytest.mark.parametrize(("key", "value", "read"), [
    ("learning_rate", "1e-6", 1e-6),  # YAML 1.1 reads 1e-6 as text
    ("max_steps", "3", 3),
    ("eval_ks", 4, [4]),  # a single value is a list of one, as after a flag
    ("eval_ks", [1, "4"], [1, 4]),
    ("scale_rewards", False, False),  # a bool stays as written where the field takes text (TRL's habit)
    ("save_strategy", False, False),  # `save_strategy: no`, which YAML reads as false
    ("save_strategy", "steps", "steps"),
    ("lr_scheduler_type", "cosine", "cosine"),  # an enum's value, as text
    ("max_prompt_length", "none", None),  # X | None takes none / null as text, as TRL's parser
    ("run_name", 5, "5"),  # a number where the field is text
    ("report_to", ["tensorboard"], ["tensorboard"]),
    ("report_to", "none", "none"),  # text where the field is text: never None
    ("lr_scheduler_kwargs", {"min_lr": 0.1}, {"min_lr": 0.1}),
    ("dataset_name", {"gsm8k_train": 1, "math_train": 2}, {"gsm8k_train": 1, "math_train": 2}),
])
def test_a_file_value_is_read_as_its_field_takes_it(key: str, value: Any, read: Any) -> None:
    got = _value(key, value)
    assert got == read and type(got) is type(read), (got, read)


@pytest.mark.parametrize(("key", "value", "said"), [
    ("num_iterations", "two", "num_iterations: invalid int value: 'two'"),
    ("max_steps", 3.0, "max_steps: invalid int value: '3.0'"),
    ("max_steps", True, "max_steps: expected int, got true"),
    ("learning_rate", None, "learning_rate: expected float, got null"),
    ("reward_weights", [1, "a"], "reward_weights: invalid float value: 'a'"),
    ("dtype", "fp8", "dtype: invalid choice: 'fp8' (choose from 'auto', 'bfloat16', 'float16', 'float32')"),
    ("save_strategy", 1, "save_strategy: invalid choice: '1' (choose from 'no', 'steps', 'epoch', 'best')"),
    ("use_vllm", "maybe", "use_vllm: expected bool, got 'maybe'"),
    ("liger_kernel_config", {"rope": "maybe"}, "liger_kernel_config: expected dict[str, bool] | None, got "
                                               "{'rope': 'maybe'}"),
    ("parallelism_config", {"dp_shard_size": 2}, "parallelism_config: expected ParallelismConfig | None, got "
                                                 "{'dp_shard_size': 2}"),
])
def test_a_file_value_its_field_cannot_take_is_one_line_naming_file_and_key(key: str, value: Any,
                                                                             said: str) -> None:
    with pytest.raises(ConfigError) as raised:
        config_from_dict({**MINIMAL, key: value}, "run.yaml")
    assert str(raised.value) == f"run.yaml: {said}"


@pytest.mark.parametrize("text", ["--learning_rate=2e-6", "--max_steps=7", "--lr_scheduler_type=cosine",
                                  "--dtype=bfloat16", "--max_prompt_length=none", "--use_vllm=false",
                                  "--eval_ks=4", "--run_name=7", "--save_steps=0.5"])
def test_a_file_value_means_what_its_text_means_as_a_flag(text: str) -> None:
    key, raw = text[2:].split("=", 1)
    by_flag = config_from_dict(MINIMAL, "run.yaml", [text])
    by_file = config_from_dict({**MINIMAL, key: yaml.safe_load(raw)}, "run.yaml")
    assert by_file == by_flag


def test_file_values_are_checked_without_argparse(monkeypatch: pytest.MonkeyPatch) -> None:
    """The file's values go through their types, not through argparse's private conversion of their text."""

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("argparse converted a file value")

    monkeypatch.setattr(argparse.ArgumentParser, "_get_values", refuse)
    cfg = config_from_dict({**MINIMAL, "learning_rate": "1e-6", "max_steps": 3, "use_vllm": False, "eval_ks": [1, 4],
                            "lr_scheduler_type": "cosine", "reward_funcs": ["math"], "dtype": "float32"}, "run.yaml")
    assert cfg.trainer["learning_rate"] == 1e-6 and cfg.trainer["eval_ks"] == [1, 4]


def test_reading_follows_trls_parser() -> None:
    """A union of text and one other type is that type; X | None takes none as text unless X is text; choices
    bound a text field; a class a file cannot hold takes nothing but null."""
    from transformers.trainer_utils import SchedulerType

    def check(hint: Any, value: Any, **kwargs: Any) -> Any:
        return file_value("k", value, hint, **kwargs)

    assert check(SchedulerType | str, "cosine") == "cosine"
    with pytest.raises(ValueError, match="^k: invalid choice: 'x' "):
        check(SchedulerType | str, "x")
    assert check(int | None, "NULL") is None and check(str | None, "none") == "none"
    assert check(str, "auto", choices=("auto", "fp4")) == "auto"
    with pytest.raises(ValueError, match=r"^k: invalid choice: 'fp8' \(choose from 'auto', 'fp4'\)$"):
        check(str, "fp8", choices=("auto", "fp4"))
    assert check(list[str] | None, [["nested"]]) == [["nested"]]  # a nested item is the dataclass's to name
    with pytest.raises(ValueError, match=r"^k: expected int, got \[1\]$"):
        check(int, [1])
    assert check(str | bool, "yes") is True  # TRL's parser narrows text-or-bool to bool
    with pytest.raises(ValueError, match=re.escape("k: expected str | bool, got 'x'")):
        check(str | bool, "x")
    with pytest.raises(ValueError, match=re.escape("k: expected int | None, got true")):
        check(int | None, True)  # a bool is no number, though Python's int and pydantic's lax mode take it
    assert reading(int | None) != int | None
