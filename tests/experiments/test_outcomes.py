"""Outcome labels on synthetic curves: one test per label, borderlines, windows, and the stable-range search."""

from __future__ import annotations

import math

import numpy as np
import pytest

from ictrl.experiments.outcomes import (
    OutcomeThresholds,
    label_run,
    stable_fraction,
    summarize_run,
    widest_stable_range,
)


def curve(h: list[float], r: list[float], start: int = 0) -> list[dict]:
    return [{"step": start + i, "ictrl/h1/all": hv, "reward": rv} for i, (hv, rv) in enumerate(zip(h, r))]


def ramp(a: float, b: float, n: int = 40) -> list[float]:
    return list(np.linspace(a, b, n))


def test_collapsed_entropy_to_zero_without_reward_gain() -> None:
    recs = curve(ramp(0.30, 0.01), ramp(0.15, 0.14))
    s = summarize_run(recs, base_reward=0.15)
    assert s.label == "collapsed"
    assert s.entropy_last < OutcomeThresholds().entropy_floor


def test_exploded_entropy_rises_and_reward_falls() -> None:
    # The environment.md failure: lr 5e-4 -> near-zero reward with rising entropy.
    recs = curve(ramp(0.30, 1.5), ramp(0.15, 0.01))
    assert label_run(recs, base_reward=0.15) == "exploded"


def test_stable_healthy_sharpening_with_reward_gain() -> None:
    # The run that learned: entropy 0.30 -> 0.08, sampled pass@1 0.15 -> 0.29.
    recs = curve(ramp(0.30, 0.08), ramp(0.15, 0.29))
    assert label_run(recs, base_reward=0.15) == "stable"


def test_low_entropy_with_reward_gain_is_not_collapsed() -> None:
    recs = curve(ramp(0.30, 0.01), ramp(0.15, 0.40))
    assert label_run(recs, base_reward=0.15) == "stable"


def test_entropy_rise_without_reward_drop_is_not_exploded() -> None:
    recs = curve(ramp(0.30, 1.5), ramp(0.15, 0.16))
    assert label_run(recs, base_reward=0.15) == "stable"


# Borderlines: binary-exact numbers so that window means equal the thresholds exactly.
EXACT = OutcomeThresholds(window=4, entropy_floor=0.0625, min_reward_gain=0.125, explode_ratio=2.0,
                          explode_min=0.5, reward_drop=0.125)


@pytest.mark.parametrize(("h_last", "expected"), [(0.0625, "stable"), (0.0625 - 2**-20, "collapsed")])
def test_entropy_floor_is_strict(h_last: float, expected: str) -> None:
    recs = curve([0.25] * 4 + [h_last] * 4, [0.25] * 8)
    assert label_run(recs, thresholds=EXACT) == expected


@pytest.mark.parametrize(("r_last", "expected"), [(0.375, "collapsed"), (0.375 + 2**-20, "stable")])
def test_reward_gain_of_exactly_delta_still_collapses(r_last: float, expected: str) -> None:
    recs = curve([0.25] * 4 + [0.03125] * 4, [0.25] * 4 + [r_last] * 4)
    assert label_run(recs, thresholds=EXACT) == expected


@pytest.mark.parametrize(("h_last", "expected"), [(1.0, "stable"), (1.0 + 2**-20, "exploded")])
def test_explosion_ceiling_is_strict(h_last: float, expected: str) -> None:
    # first-window H1 0.5 -> ceiling max(2 * 0.5, 0.5) = 1.0
    recs = curve([0.5] * 4 + [h_last] * 4, [0.5] * 4 + [0.0] * 4)
    assert label_run(recs, base_reward=0.5, thresholds=EXACT) == expected


@pytest.mark.parametrize(("r_last", "expected"), [(0.375, "stable"), (0.375 - 2**-20, "exploded")])
def test_reward_drop_is_strict(r_last: float, expected: str) -> None:
    recs = curve([0.5] * 4 + [2.0] * 4, [0.5] * 4 + [r_last] * 4)
    assert label_run(recs, base_reward=0.5, thresholds=EXACT) == expected


def test_explode_min_stops_tiny_entropies_from_exploding() -> None:
    # 0.01 -> 0.1 is 10x, but below the 0.5-nat minimum ceiling.
    recs = curve(ramp(0.01, 0.1), ramp(0.5, 0.0))
    s = summarize_run(recs, base_reward=0.5)
    assert s.entropy_ceiling == pytest.approx(0.5)
    assert s.label == "stable"


def test_window_smooths_a_single_spike() -> None:
    h = [0.3] * 39 + [2.0]
    r = [0.2] * 39 + [0.0]
    recs = curve(h, r)
    assert label_run(recs, base_reward=0.2) == "stable"  # window 10: mean H1 0.47 < 0.6
    assert label_run(recs, base_reward=0.2, thresholds=OutcomeThresholds(window=1)) == "exploded"


def test_window_means_match_float64_reference_and_base_defaults_to_first_window() -> None:
    rng = np.random.default_rng(0)
    h, r = rng.uniform(0.1, 1.0, 25).tolist(), rng.uniform(0, 1, 25).tolist()
    s = summarize_run(curve(h, r))
    assert s.window == 10 and s.num_points == 25
    assert s.entropy_first == pytest.approx(np.mean(np.array(h[:10], dtype=np.float64)), abs=1e-15)
    assert s.entropy_last == pytest.approx(np.mean(np.array(h[-10:], dtype=np.float64)), abs=1e-15)
    assert s.reward_last == pytest.approx(np.mean(np.array(r[-10:], dtype=np.float64)), abs=1e-15)
    assert s.base_reward == s.reward_first


def test_short_curve_shrinks_window_and_missing_keys_and_order_are_tolerated() -> None:
    recs = curve([0.3, 0.3, 0.01], [0.2, 0.2, 0.2])
    recs.insert(1, {"step": 5, "loss": 1.0})  # a record without the keys is skipped
    recs.reverse()  # order comes from "step"
    s = summarize_run(recs)
    assert s.window == 1 and s.num_points == 3
    assert s.entropy_last == 0.01 and s.label == "collapsed"


def test_bad_input_raises() -> None:
    with pytest.raises(ValueError, match="no record carries"):
        label_run([{"step": 0, "reward": 0.1}])
    with pytest.raises(ValueError, match="ictrl/h1/all"):
        label_run([{"step": 0, "reward": 0.1, "ictrl/h1/all": "high"}])
    with pytest.raises(ValueError, match="reward"):
        label_run([{"step": 0, "reward": math.nan, "ictrl/h1/all": 0.3}])
    with pytest.raises(ValueError, match="window"):
        OutcomeThresholds(window=0)
    with pytest.raises(ValueError, match="explode_ratio"):
        OutcomeThresholds(explode_ratio=1.0)
    with pytest.raises(ValueError, match="entropy_floor"):
        OutcomeThresholds(entropy_floor=-0.1)


def test_stable_fraction() -> None:
    assert stable_fraction(["stable", "collapsed", "stable", "exploded"]) == 0.5
    with pytest.raises(ValueError, match="unknown label"):
        stable_fraction(["stable", "fine"])
    with pytest.raises(ValueError, match="empty"):
        stable_fraction([])


def test_widest_stable_range() -> None:
    labels = {1e-4: "stable", 2e-4: "stable", 5e-4: "exploded", 1e-3: "stable"}
    assert widest_stable_range(labels) == (1e-4, 2e-4)
    # a wider ratio wins over more points: 1e-3..1e-2 (10x) beats 1e-5..3e-5..5e-5 (5x)
    labels = {1e-5: "stable", 3e-5: "stable", 5e-5: "stable", 1e-4: "collapsed", 1e-3: "stable", 1e-2: "stable"}
    assert widest_stable_range(labels) == (1e-3, 1e-2)
    # equal width: the lower range wins
    assert widest_stable_range({1.0: "stable", 2.0: "stable", 3.0: "exploded", 4.0: "stable", 8.0: "stable"}) == (1.0, 2.0)
    assert widest_stable_range({1e-3: "stable", 1e-2: "exploded"}) == (1e-3, 1e-3)
    assert widest_stable_range({1e-3: "collapsed", 1e-2: "exploded"}) is None


def test_widest_stable_range_with_seeds() -> None:
    labels = {1e-4: ["stable", "stable"], 2e-4: ["stable", "exploded"], 4e-4: ["stable", "stable"]}
    assert widest_stable_range(labels) == (1e-4, 1e-4)  # 2e-4 breaks the run: not every seed stable
    assert widest_stable_range(labels, min_stable_fraction=0.5) == (1e-4, 4e-4)
    with pytest.raises(ValueError, match="learning rate"):
        widest_stable_range({0.0: "stable"})
