"""Each ranged number of ICTGRPOConfig is checked in one place: every out-of-range value of a field (below, above,
NaN, ±inf) is refused, and all of them by the same check function (the innermost frame of the original error)."""

from __future__ import annotations

import math
import traceback
import typing
from typing import Any

import pytest

from annotated_types import Ge, Gt, Interval

from ictrl.core.loss import RANGED
from ictrl.engine.config import LOSS_FIELDS, ICTGRPOConfig
from ictrl.engine.config_fields import RANGES
from ictrl.validation import Bound, declared, ends

# The selector's registered options whose config fields carry them (their range lives in ictrl.core.selection).
OPTIONS = {"selection_ratio": Interval(gt=0, le=1), "selection_seed": Interval(ge=0, lt=1 << 63)}
# The loss spec's: >= 0, or > 0 (ictrl.core.loss.LossSpec).
POSITIVE_LOSS = {"delta", "sapo_temperature_pos", "sapo_temperature_neg", "vllm_importance_sampling_clip_max"}


def _ranged_fields() -> dict[str, Bound]:
    names = {f for f in ICTGRPOConfig.__dataclass_fields__}
    out = {name: bound for name, bound in RANGES.items() if name in names}
    out.update({name: bound for name, (_, bound) in declared(ICTGRPOConfig).items() if bound is not None})
    out.update(OPTIONS)
    for key in RANGED:
        name = LOSS_FIELDS[key]
        out[name] = Gt(0) if name in POSITIVE_LOSS else Ge(0)
    return out


def _bad_values(name: str, bound: Bound) -> list[Any]:
    """Out-of-range values: the bounds' neighbours and, for a float field, NaN and ±inf (an int field's type check
    refuses a float)."""
    values: list[Any] = [math.nan, math.inf, -math.inf] if float in _types(name) else []
    edges = ends(bound)
    if "gt" in edges or "ge" in edges:
        values.append(edges["gt"] if "gt" in edges else edges["ge"] - 1)
    if "lt" in edges or "le" in edges:
        values.append(edges["lt"] if "lt" in edges else edges["le"] + 1)
    return values


def _types(name: str) -> tuple[Any, ...]:
    hint = typing.get_type_hints(ICTGRPOConfig)[name]
    if typing.get_origin(hint) is typing.Annotated:
        hint = typing.get_args(hint)[0]
    return typing.get_args(hint) or (hint,)


def _raise_site(**overrides: Any) -> str | None:
    """file:function of the check that refused the config (the root of the error chain), or None."""
    try:
        ICTGRPOConfig(output_dir="unused", use_cpu=True, report_to="none", **overrides)
    except Exception as err:  # noqa: BLE001 - any refusal is one site
        while err.__context__ is not None or err.__cause__ is not None:
            err = err.__cause__ or err.__context__  # type: ignore[assignment]
        frame = traceback.extract_tb(err.__traceback__)[-1]
        return f"{frame.filename.rsplit('/src/', 1)[-1]}:{frame.name}"
    return None


RANGED_FIELDS = _ranged_fields()
# clip_min alone: with clip_max set, TRL's own check of the pair (min < max) comes first, a combination, not a range
CONTEXT = {"vllm_importance_sampling_clip_min": {"vllm_importance_sampling_clip_max": None},
           "selection_seed": {"token_selector": "random"}}  # the selector that reads it


def test_the_ranged_fields_are_many() -> None:
    assert {"selection_ratio", "top_entropy_quantile", "learning_rate", "epsilon", "stats_chunk_size"} <= set(
        RANGED_FIELDS)


@pytest.mark.parametrize("name", sorted(RANGED_FIELDS))
def test_one_place_raises_for_each_field(name: str) -> None:
    sites = {}
    for value in _bad_values(name, RANGED_FIELDS[name]):
        site = _raise_site(**{name: value, **CONTEXT.get(name, {})})
        assert site is not None, f"{name}={value!r} was accepted"
        sites[repr(value)] = site
    assert len(set(sites.values())) == 1, f"{name}: {len(set(sites.values()))} places raise: {sites}"
