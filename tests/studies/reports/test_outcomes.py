"""Outcome labels on synthetic curves: one test per label under each rule set (v1, v2), borderlines, windows, and
the stable-range search."""

from __future__ import annotations

import math

import numpy as np
import pytest

from studies.reports.outcomes import (
    LABELS,
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


V1 = OutcomeThresholds.v1()
V2 = OutcomeThresholds.v2()

# ---------------------------------------------------------------------------------------------- v1 (pre-sweep-1)


def test_collapsed_entropy_to_zero_without_reward_gain() -> None:
    recs = curve(ramp(0.30, 0.01), ramp(0.15, 0.14))
    s = summarize_run(recs, base_reward=0.15, thresholds=V1)
    assert s.label == "collapsed"
    assert s.entropy_last < V1.entropy_floor == s.entropy_floor


def test_exploded_entropy_rises_and_reward_falls() -> None:
    # The failure seen on the embedded task: lr 5e-4 -> near-zero reward with rising entropy.
    recs = curve(ramp(0.30, 1.5), ramp(0.15, 0.01))
    assert label_run(recs, base_reward=0.15, thresholds=V1) == "exploded"


def test_stable_healthy_sharpening_with_reward_gain() -> None:
    # The run that learned: entropy 0.30 -> 0.08, sampled pass@1 0.15 -> 0.29.
    recs = curve(ramp(0.30, 0.08), ramp(0.15, 0.29))
    assert label_run(recs, base_reward=0.15, thresholds=V1) == "stable"


def test_low_entropy_with_reward_gain_is_not_collapsed() -> None:
    recs = curve(ramp(0.30, 0.01), ramp(0.15, 0.40))
    assert label_run(recs, base_reward=0.15, thresholds=V1) == "stable"


def test_entropy_rise_without_reward_drop_is_not_exploded() -> None:
    recs = curve(ramp(0.30, 1.5), ramp(0.15, 0.16))
    assert label_run(recs, base_reward=0.15, thresholds=V1) == "stable"


# Borderlines: binary-exact numbers so that window means equal the thresholds exactly.
EXACT = OutcomeThresholds(version="v1-exact", window=4, entropy_floor=0.0625, collapse_ratio=0.0,
                          min_reward_gain=0.125, explode_ratio=2.0, explode_min=0.5, reward_drop=0.125, degraded=False)


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
    s = summarize_run(recs, base_reward=0.5, thresholds=V1)
    assert s.entropy_ceiling == pytest.approx(0.5)
    assert s.label == "stable"


def test_window_smooths_a_single_spike() -> None:
    h = [0.3] * 39 + [2.0]
    r = [0.2] * 39 + [0.0]
    recs = curve(h, r)
    assert label_run(recs, base_reward=0.2, thresholds=V1) == "stable"  # window 10: mean H1 0.47 < 0.6
    one = OutcomeThresholds(version="v1-w1", window=1, entropy_floor=0.05, collapse_ratio=0.0, explode_ratio=2.0,
                            explode_min=0.5, degraded=False)
    assert label_run(recs, base_reward=0.2, thresholds=one) == "exploded"


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
    s = summarize_run(recs, thresholds=V1)
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
    with pytest.raises(ValueError, match="collapse_ratio"):
        OutcomeThresholds(collapse_ratio=1.0)
    with pytest.raises(ValueError, match="nothing could ever be collapsed"):
        OutcomeThresholds(collapse_ratio=0.0)
    with pytest.raises(ValueError, match="version"):
        OutcomeThresholds(version="")
    with pytest.raises(ValueError, match="unknown preset 'v3'"):
        OutcomeThresholds.preset("v3")


def test_stable_fraction() -> None:
    assert stable_fraction(["stable", "collapsed", "stable", "exploded"]) == 0.5
    assert stable_fraction(["stable", "degraded", "degraded"]) == pytest.approx(1 / 3)  # degraded is not stable
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


# ------------------------------------------------------------------------------------------ v2 (after sweep 1)


def test_presets() -> None:
    assert OutcomeThresholds() == V2 == OutcomeThresholds.preset("v2") and V2.version == "v2"
    assert (V2.collapse_ratio, V2.explode_ratio, V2.explode_min, V2.entropy_floor) == (0.33, 1.25, 0.0, 0.0)
    assert (V2.window, V2.min_reward_gain, V2.reward_drop, V2.degraded) == (10, 0.02, 0.05, True)
    assert OutcomeThresholds.preset("v1") == V1 and V1.version == "v1"
    assert (V1.entropy_floor, V1.collapse_ratio, V1.explode_ratio, V1.explode_min) == (0.05, 0.0, 2.0, 0.5)
    assert V1.labels == ("collapsed", "exploded", "unrewarded", "stable") and V2.labels == LABELS


@pytest.mark.parametrize("thresholds", [V1, V2], ids=["v1", "v2"])
def test_a_run_that_never_earned_a_reward_is_unrewarded_not_stable(thresholds: OutcomeThresholds) -> None:
    # A --quick run of an untrained model: reward 0 at every step, entropy flat.
    flat = curve([5.5] * 10, [0.0] * 10)
    assert label_run(flat, base_reward=0.0, thresholds=thresholds) == "unrewarded"
    assert stable_fraction(["unrewarded", "stable"]) == 0.5
    one = curve([5.5] * 10, [0.0] * 9 + [0.0625])  # one step with a correct completion: judged as usual
    assert label_run(one, base_reward=0.0, thresholds=thresholds) == "stable"
    fell = curve([0.15] * 20, [0.20] * 10 + [0.0] * 10)  # had reward and lost it: degraded (v2), not unrewarded
    assert label_run(fell, base_reward=0.20, thresholds=V2) == "degraded"


# Sweep 1's regime: the base samples at ~0.15 nats/token, base reward 0.20.
def test_v2_collapsed_relative_to_the_start() -> None:
    recs = curve([0.20] * 20 + [0.06] * 20, [0.20] * 40)  # 0.06 < 0.33 x 0.20, but above v1's 0.05 floor
    s = summarize_run(recs, base_reward=0.20, thresholds=V2)
    assert s.label == "collapsed"
    assert s.entropy_floor == pytest.approx(0.33 * s.entropy_first) and s.entropy_last < s.entropy_floor
    assert label_run(recs, base_reward=0.20, thresholds=V1) == "stable"


def test_v2_exploded_without_the_absolute_half_nat() -> None:
    recs = curve(ramp(0.15, 0.40), ramp(0.20, 0.01))  # ends below v1's 0.5-nat minimum ceiling
    s = summarize_run(recs, base_reward=0.20, thresholds=V2)
    assert s.label == "exploded" and s.entropy_ceiling == pytest.approx(1.25 * s.entropy_first)
    assert label_run(recs, base_reward=0.20, thresholds=V1) == "stable"


def test_v2_degraded_reward_lost_without_entropy_excursion() -> None:
    recs = curve(ramp(0.15, 0.16), ramp(0.20, 0.01))
    assert label_run(recs, base_reward=0.20, thresholds=V2) == "degraded"
    assert label_run(recs, base_reward=0.20, thresholds=V1) == "stable"  # v1 has no such label


def test_v2_stable_sharpening_with_reward_gain() -> None:
    recs = curve(ramp(0.15, 0.04), ramp(0.20, 0.35))  # below 0.33x the start, but reward rose: not collapsed
    assert label_run(recs, base_reward=0.20, thresholds=V2) == "stable"
    recs = curve(ramp(0.15, 0.12), ramp(0.20, 0.17))  # lost 0.03 < reward_drop
    assert label_run(recs, base_reward=0.20, thresholds=V2) == "stable"


def test_v2_collapse_with_reward_loss_is_collapsed_not_degraded() -> None:
    recs = curve(ramp(0.15, 0.01), ramp(0.20, 0.0))
    assert label_run(recs, base_reward=0.20, thresholds=V2) == "collapsed"


# v2 borderlines, binary-exact: first-window H1 0.5, so floor 0.33 * 0.5 = 0.165 and ceiling 1.25 * 0.5 = 0.625.
EXACT2 = OutcomeThresholds(window=4, collapse_ratio=0.33, min_reward_gain=0.125, explode_ratio=1.25,
                           reward_drop=0.125)


@pytest.mark.parametrize(("h_last", "expected"), [(0.33 * 0.5, "stable"), (0.33 * 0.5 - 2**-20, "collapsed")])
def test_v2_relative_floor_is_strict(h_last: float, expected: str) -> None:
    recs = curve([0.5] * 4 + [h_last] * 4, [0.5] * 8)
    s = summarize_run(recs, base_reward=0.5, thresholds=EXACT2)
    assert s.entropy_floor == 0.33 * 0.5
    assert s.label == expected


@pytest.mark.parametrize(("h_last", "expected"), [(0.625, "degraded"), (0.625 + 2**-20, "exploded")])
def test_v2_relative_ceiling_is_strict(h_last: float, expected: str) -> None:
    # reward lost either way: at the ceiling it is a reward loss without an entropy excursion
    recs = curve([0.5] * 4 + [h_last] * 4, [0.5] * 4 + [0.0] * 4)
    assert label_run(recs, base_reward=0.5, thresholds=EXACT2) == expected


@pytest.mark.parametrize(("r_last", "expected"), [(0.375, "stable"), (0.375 - 2**-20, "degraded")])
def test_v2_degraded_reward_drop_is_strict(r_last: float, expected: str) -> None:
    recs = curve([0.5] * 8, [0.5] * 4 + [r_last] * 4)
    assert label_run(recs, base_reward=0.5, thresholds=EXACT2) == expected


def test_v2_degraded_is_measured_from_the_base_not_the_first_window() -> None:
    # the run starts below the base (first window 0.25) and stays there: no loss during the run, but below base
    recs = curve([0.5] * 8, [0.25] * 8)
    assert label_run(recs, base_reward=0.5, thresholds=EXACT2) == "degraded"
    assert label_run(recs, thresholds=EXACT2) == "stable"  # base defaults to the first window


def test_v2_labels_match_a_float64_reference_on_random_curves() -> None:
    rng = np.random.default_rng(1)
    for _ in range(200):
        n = int(rng.integers(1, 40))
        h, r = rng.uniform(0.01, 0.5, n).tolist(), rng.uniform(0, 0.5, n).tolist()
        base = float(rng.uniform(0, 0.5))
        k = max(1, min(10, n // 2))
        h0, h1 = np.mean(np.array(h[:k], np.float64)), np.mean(np.array(h[-k:], np.float64))
        r0, r1 = np.mean(np.array(r[:k], np.float64)), np.mean(np.array(r[-k:], np.float64))
        if h1 < 0.33 * h0 and r1 - r0 <= 0.02:
            want = "collapsed"
        elif h1 > 1.25 * h0 and r1 < base - 0.05:
            want = "exploded"
        elif r1 < base - 0.05:
            want = "degraded"
        else:
            want = "stable"
        assert label_run(curve(h, r), base_reward=base, thresholds=V2) == want
