"""ictrl compare --horizon: the collapse / explosion / stop rules on synthetic logs, the tuned settings table,
and the protocol end to end with resume (--quick)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from ictrl.experiments.grid import horizon as hz


def log(h1: list[float], reward: list[float] | None = None) -> list[dict[str, float]]:
    reward = reward if reward is not None else [0.5] * len(h1)
    return [{"step": i + 1, hz.H1_KEY: h, "reward": r, "loss": 0.0} for i, (h, r) in enumerate(zip(h1, reward))]


def test_start_is_the_mean_of_the_first_steps_and_rolling_the_trailing_window() -> None:
    records = log([1.0, 2.0, 3.0, 4.0, 5.0] + [0.0] * 10)
    assert hz.start_value(records) == pytest.approx(3.0)
    assert math.isnan(hz.start_value(records[:4]))  # too few steps: no start
    roll = dict(hz.rolling(records, hz.H1_KEY))
    assert min(roll) == hz.WINDOW  # defined from the WINDOW-th step
    assert roll[10] == pytest.approx(15.0 / 10) and roll[15] == 0.0


def test_collapse_is_the_first_step_the_rolling_h1_reaches_the_fraction() -> None:
    h1 = [1.0] * 20 + [0.1] * 30  # rolling mean <= 0.2 once 9 of the 10 are 0.1: 0.1*9 + 1.0 = 1.9/10 = 0.19
    assert hz.collapse_step(log(h1)) == 29
    assert hz.collapse_step(log([1.0] * 50)) is None
    # a record without the key (an eval-only row) is skipped, not read as 0
    records = log(h1)
    records.insert(3, {"step": 4, "eval/avg/pass@1": 0.3})
    assert hz.collapse_step(records) == 29


def test_explosion_needs_high_entropy_and_falling_reward() -> None:
    h1 = [1.0] * 10 + [3.0] * 40
    assert hz.explosion_step(log(h1)) is None  # reward flat: not an explosion
    reward = [0.5] * 10 + [0.1] * 40
    assert hz.explosion_step(log(h1, reward)) == 15  # rolling H1 (5x1 + 5x3)/10 = 2.0 >= 2 x 1.0 at step 15
    assert hz.explosion_step(log([1.0] * 12), diverged=True) == 12  # non-finite weights: at its last step


def test_stop_rule_waits_for_min_steps_and_the_fall() -> None:
    h1 = [1.0] * 10 + [0.1] * 90
    assert hz.stop_step(log(h1), min_steps=50) == 50  # fell long before: stops at the minimum
    assert hz.stop_step(log(h1), min_steps=5) == 19  # rolling (1 + 9 x 0.1) / 10 = 0.19 <= 0.2
    assert hz.stop_step(log([1.0] * 100), min_steps=50) is None
    assert hz.horizon([400, 420, 400]) == 420
    with pytest.raises(ValueError):
        hz.horizon([])


def test_tuned_settings_cover_every_method_and_setting() -> None:
    for setting in hz.SETTINGS.values():
        assert set(hz.TUNED[setting.tuned]) == set(hz.METHODS)
    assert hz.TUNED["tinyarith"]["ict"] == (1e-4, "per_response_all")  # docs/results/tune-tinyarith-2026-11-23.md
    assert hz.TUNED["countdown"]["random10"] == (1e-4, "per_response_all")  # tune-countdown-2026-11-23.md
    assert str(hz.COLLAPSE_FRACTION) in hz.DEFINITIONS and str(hz.MIN_STEPS) in hz.DEFINITIONS
