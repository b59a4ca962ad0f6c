"""Each ICTGRPOConfig field is held to its own declaration: the type and range in its annotation, the choices in its
metadata; inherited fields to ``RANGES``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from annotated_types import Interval

from ictrl.engine.config import ICTGRPOConfig
from ictrl.engine.config_fields import RANGES
from ictrl.validation import Bound, bound_text, declared, ends, type_text

DECLARED = declared(ICTGRPOConfig)
BOUNDED = sorted(name for name, (_, bound) in DECLARED.items() if bound is not None)


def _config(tmp_path: Path, **values: Any) -> ICTGRPOConfig:
    return ICTGRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to="none", **values)


def _outside(bound: Bound) -> float:
    edges = ends(bound)
    if "gt" in edges or "ge" in edges:
        return edges["gt"] if "gt" in edges else edges["ge"] - 1
    return edges["lt"] if "lt" in edges else edges["le"] + 1


def _inside(bound: Bound) -> float:
    edges = ends(bound)
    if "gt" in edges or "ge" in edges:
        return edges["gt"] + 1 if "gt" in edges else edges["ge"]
    return edges.get("lt", edges.get("le")) - 1


def test_the_declared_ranges_are_read_from_the_annotations() -> None:
    assert DECLARED["cpu_threads"][1] == Interval(ge=1, le=4096)
    assert type_text(DECLARED["cpu_threads"][0]) == "int | None"
    assert DECLARED["token_selector"][1] is None  # checked by the selector registry, not by a range
    assert not set(BOUNDED) & set(RANGES)  # a field's range lives in one place
    assert len(BOUNDED) >= 10


@pytest.mark.parametrize("name", BOUNDED)
def test_each_declared_range_refuses_a_value_outside_it(tmp_path: Path, name: str) -> None:
    hint, bound = DECLARED[name]
    assert bound is not None
    number = int if "float" not in type_text(hint) else float
    with pytest.raises(ValueError, match=rf"^{name}: must be {bound_text(bound)}, got "):
        _config(tmp_path, **{name: number(_outside(bound))})
    config = _config(tmp_path, **{name: number(_inside(bound))})
    assert getattr(config, name) == number(_inside(bound))


@pytest.mark.parametrize(("values", "message"), [
    ({"cpu_threads": True}, "cpu_threads: expected int | None, got True"),  # a bool is no number
    ({"stats_chunk_size": 2.5}, "stats_chunk_size: expected int | None, got 2.5"),
    ({"eval_ks": [1, "4"]}, "eval_ks: expected list[int], got [1, '4']"),
    ({"sparse_backward": 1}, "sparse_backward: expected bool, got 1"),
    ({"selection_options": [1]}, "selection_options: expected dict | str | None, got [1]"),
    ({"train_sampling_strategy": "vllm"}, "train_sampling_strategy: must be one of 'random', 'sequential', "
                                          "'group_by_length', 'batch_rebalance', got 'vllm'"),
    ({"temperature": 0.0}, "temperature: must be > 0, got 0.0"),  # an inherited field: RANGES
    ({"num_generations": True}, "num_generations: expected a number >= 2, got true"),
])
def test_types_choices_and_inherited_ranges(tmp_path: Path, values: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError) as err:
        _config(tmp_path, **values)
    assert str(err.value) == message


def test_a_float_field_takes_an_int_and_none_stays_the_default(tmp_path: Path) -> None:
    config = _config(tmp_path, reward_timeout=5, selection_temperature=None, temperature=0.7)
    assert config.reward_timeout == 5
    assert config.selection_temperature == 0.7  # None resolves to the sampling temperature after the checks


def test_a_list_type_without_its_item_type_still_needs_a_list() -> None:
    import typing

    from ictrl.validation import field_error

    def _has_type(hint: object, value: object) -> bool:
        return field_error("x", value, hint, None) is None

    assert not _has_type(typing.List, 3) and _has_type(typing.List, [1, "a"])
    assert not _has_type(list[int], [1, "a"]) and _has_type(list[int] | None, None)
